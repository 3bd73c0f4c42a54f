#include "tensor/tensor.h"

#include "util/error.h"

namespace beluga {

Tensor Tensor::make(void* data, DType dtype, const int64_t* shape, int ndim, Device dev) {
  BELUGA_ASSERT(ndim >= 0 && ndim <= kMaxDims);
  Tensor t;
  t.dtype = dtype;
  t.ndim = ndim;
  t.data = data;
  t.device = dev;
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    t.shape[d] = shape[d];
    t.stride[d] = s;
    s *= shape[d];
  }
  return t;
}

Tensor Tensor::make(void* data, DType dtype, std::initializer_list<int64_t> shape, Device dev) {
  return make(data, dtype, shape.begin(), int(shape.size()), dev);
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool Tensor::is_contiguous() const {
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && stride[d] != s) return false;
    s *= shape[d];
  }
  return true;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  BELUGA_ASSERT(ndim >= 1 && begin >= 0 && begin <= end && end <= shape[0]);
  Tensor t = *this;
  t.shape[0] = end - begin;
  t.data = static_cast<char*>(data) + begin * stride[0] * int64_t(dtype_size(dtype));
  return t;
}

Tensor Tensor::cols(int64_t begin, int64_t end) const {
  int d = ndim - 1;
  BELUGA_ASSERT(ndim >= 1 && begin >= 0 && begin <= end && end <= shape[d]);
  Tensor t = *this;
  t.shape[d] = end - begin;
  t.data = static_cast<char*>(data) + begin * stride[d] * int64_t(dtype_size(dtype));
  return t;
}

Tensor Tensor::reshape(std::initializer_list<int64_t> new_shape) const {
  BELUGA_ASSERT(is_contiguous());
  Tensor t = make(data, dtype, new_shape.begin(), int(new_shape.size()), device);
  BELUGA_ASSERT(t.numel() == numel());
  return t;
}

void* Tensor::at(int64_t i0, int64_t i1, int64_t i2) const {
  int64_t off = i0 * stride[0];
  if (ndim > 1) off += i1 * stride[1];
  if (ndim > 2) off += i2 * stride[2];
  return static_cast<char*>(data) + off * int64_t(dtype_size(dtype));
}

std::string Tensor::describe() const {
  std::string s(dtype_name(dtype));
  s += "[";
  for (int d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

}  // namespace beluga
