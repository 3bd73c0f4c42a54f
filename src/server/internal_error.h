// Internal failures (a bug, a failed allocation: anything that is not the client's fault) as the
// client and the operator see them: one id, logged on stderr with the cause and returned in the
// 500's message, so a user's report can be matched with the log line.
#pragma once

#include <string>
#include <string_view>

namespace beluga::server {

// Logs "beluga serve: internal error <id> in <where>: <what>" on stderr; returns the message for
// the client ("internal error <id>; ..."), which names the id but not the cause.
std::string report_internal_error(std::string_view where, std::string_view what);

}  // namespace beluga::server
