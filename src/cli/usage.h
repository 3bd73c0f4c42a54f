// The usage text `beluga <command> --help` prints (options and what they do), per command:
// "generate", "bench", "bench model", ..., rendered from the command's option table (flag_table.h,
// the tables are in usage.cc).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace beluga::cli {

// Nothing when `command` has no usage here.
std::optional<std::string> command_usage(std::string_view command);

}  // namespace beluga::cli
