// What the CLI tests share: where the checked-in model fixtures live.
#pragma once

#include <string>

namespace beluga::testing {

// tests/fixtures/ of the source tree, with the trailing slash.
inline const std::string kFixtures = std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/";

}  // namespace beluga::testing
