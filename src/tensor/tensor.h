// Tensor: a non-owning view {dtype, shape (<=4 dims), strides in elements, data, device}.
// Memory belongs to a backend allocation or to a mapped checkpoint; views never free anything.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "tensor/dtype.h"

namespace beluga {

enum class Device : uint8_t { kCpu, kCuda };

struct Tensor {
  static constexpr int kMaxDims = 4;

  DType dtype = DType::kF32;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> stride{};  // in elements
  void* data = nullptr;
  Device device = Device::kCpu;

  // A contiguous row-major view.
  static Tensor make(void* data, DType dtype, std::initializer_list<int64_t> shape,
                     Device dev = Device::kCpu);
  static Tensor make(void* data, DType dtype, const int64_t* shape, int ndim, Device dev = Device::kCpu);

  bool empty() const { return data == nullptr; }
  int64_t size(int d) const { return shape[d < 0 ? d + ndim : d]; }
  int64_t numel() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  bool is_contiguous() const;

  // Rows [begin, end) of dimension 0.
  Tensor rows(int64_t begin, int64_t end) const;
  // Elements [begin, end) of the last dimension (a strided view).
  Tensor cols(int64_t begin, int64_t end) const;
  // Reinterprets a contiguous tensor with a new shape of the same element count.
  Tensor reshape(std::initializer_list<int64_t> shape) const;

  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  // Address of element (i0, i1, ...) for the leading indices given.
  void* at(int64_t i0, int64_t i1 = 0, int64_t i2 = 0) const;

  std::string describe() const;  // "BF16[64, 128]"
};

}  // namespace beluga
