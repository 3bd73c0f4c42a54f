#include "server/auth.h"

#include <cstddef>

namespace beluga::server {

bool api_key_matches(std::string_view presented, std::string_view expected) {
  // Every byte of `expected` is visited whatever `presented` holds; differences are OR-ed together
  // rather than tested, so there is no early exit. A length mismatch is folded in the same way.
  // The volatile accumulator keeps the compiler from turning the loop back into a memcmp.
  volatile unsigned char diff = presented.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const unsigned char p = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff = static_cast<unsigned char>(diff | (p ^ static_cast<unsigned char>(expected[i])));
  }
  return diff == 0;
}

}  // namespace beluga::server
