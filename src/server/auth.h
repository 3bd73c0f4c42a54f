// API key checking. The comparison takes time that depends only on the configured key's length,
// never on how many leading bytes of the presented key match, so a client cannot find the key
// byte by byte by timing 401s.
#pragma once

#include <string_view>

namespace beluga::server {

// True when `presented` equals `expected`.
bool api_key_matches(std::string_view presented, std::string_view expected);

}  // namespace beluga::server
