// CudaDummyWeights (cuda_ops.h): DummyWeights' values generated in device memory.
#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cuda/cuda_ops.h"
#include "util/error.h"

namespace beluga {

namespace {
inline uint64_t host_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

Tensor CudaDummyWeights::find(const std::string& name, const std::vector<int64_t>& shape, DType hint) {
  if (ends_with(name, "weight_scale_inv") || ends_with(name, ".bias")) return {};
  return get(name, shape, hint);
}

Tensor CudaDummyWeights::get(const std::string& name, const std::vector<int64_t>& shape, DType hint) {
  // The same values as DummyWeights::get (loader/weight_source.cc), generated on the device.
  const DType dt = (hint == DType::kF32) ? DType::kF32 : DType::kBF16;
  uint64_t h = seed_;
  for (char c : name) h = host_mix(h ^ uint64_t(uint8_t(c)));
  float lo = 0, hi = 0;
  if (ends_with(name, "norm.weight")) {
    lo = hi = 1.0f;
  } else if (!ends_with(name, "e_score_correction_bias")) {
    const float fan_in = shape.size() >= 2 ? float(shape.back()) : 1.0f;
    const float a = std::sqrt(3.0f / fan_in);
    lo = -a;
    hi = a;
  }
  Tensor t;
  switch (shape.size()) {
    case 1:
      t = ops_.alloc_persistent(dt, {shape[0]});
      break;
    case 2:
      t = ops_.alloc_persistent(dt, {shape[0], shape[1]});
      break;
    case 3:
      t = ops_.alloc_persistent(dt, {shape[0], shape[1], shape[2]});
      break;
    default:
      fail("CudaDummyWeights: unsupported rank for ", name);
  }
  ops_.fill_uniform(t, h, lo, hi);
  bytes_ += t.nbytes();
  return t;
}

}  // namespace beluga
