// What the golden tests (model outputs against stored references) share: reading a reference
// tensor of int64 and the relative L2 error bound they compare float rows with.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "loader/safetensors.h"

namespace beluga::testing {

// The int64 tensor `name` of `f`, copied.
inline std::vector<int64_t> ints(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo& t = f.get(name);
  const int64_t* p = static_cast<const int64_t*>(t.data);
  return std::vector<int64_t>(p, p + t.nbytes / 8);
}

// ||a - ref|| / ||ref|| over n floats (the denominator floored, for an all-zero reference).
inline double rel_l2(const float* a, const float* ref, int n) {
  double num = 0, den = 0;
  for (int i = 0; i < n; ++i) {
    num += double(a[i] - ref[i]) * (a[i] - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace beluga::testing
