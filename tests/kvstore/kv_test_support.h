// Helpers the kvstore tests share (one copy instead of one per test file, which also lets the test
// dir build as one unity TU): the injected clock's epoch, fresh scratch directories, block contents
// and block keys.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "engine/block_manager.h"

namespace beluga::kv::testing {

constexpr int64_t kDay = 86400, kT0 = 1'800'000'000;

// An empty directory $TMP/beluga_<family>_<what>_<pid>, removed first if a previous run left it.
inline std::string temp_dir(const std::string& family, const std::string& what) {
  const std::string d = std::filesystem::temp_directory_path().string() + "/beluga_" + family + "_" + what +
                        "_" + std::to_string(::getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// `n` pseudo-random bytes, the same for the same seed.
inline std::vector<std::byte> pattern(int seed, size_t n) {
  std::vector<std::byte> v(n);
  std::mt19937 g{uint32_t(seed)};
  for (auto& b : v) b = std::byte(g());
  return v;
}

// Block i's key (both halves depend on i).
inline BlockHash key(uint64_t i) {
  return {i * 1000003 + 5, ~i};
}

// Another family of keys, for the host pool and transfer tests.
inline BlockHash xor_key(uint64_t i) {
  return {i * 7 + 1, i ^ 0xabcdefull};
}

}  // namespace beluga::kv::testing
