// The usage text `beluga <command> --help` prints (options and what they do), per command:
// "generate", "bench", "bench model", ... `beluga serve --help` prints cmd_serve.cc's own text.
// Written by hand until the options of every command come from one table (then --help, argument
// checking and docs/configuration.md are generated from it).
#pragma once

#include <string_view>

namespace beluga::cli {

// Null when `command` has no usage text here.
const char* command_usage(std::string_view command);

}  // namespace beluga::cli
