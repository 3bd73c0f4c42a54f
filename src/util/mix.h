// splitmix64's finalizer: a counter-based generator, so a random value is a pure function of its
// inputs (seed, index) and results never depend on the order in which they are drawn.
#pragma once

#include <cstdint>

namespace beluga {

constexpr uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A uniform double in [0, 1) from 53 bits of mix64(x).
constexpr double unit_double(uint64_t x) {
  return double(mix64(x) >> 11) * 0x1p-53;
}

}  // namespace beluga
