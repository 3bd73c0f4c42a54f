// Beluga's version, as `beluga --version` prints it and GET /version answers it.
#pragma once

namespace beluga {

inline constexpr const char* kVersion = "0.1.0";

}  // namespace beluga
