// One table of options per command, the single source of three things: the usage `beluga CMD --help`
// prints (usage_text), the options Args accepts for that command (an option outside its table is an
// error, so the help cannot omit one the parser takes), and docs/configuration.md
// (configuration_markdown; `beluga help --markdown` prints it, tests/cli checks the file is current).
// A command whose usage is hand-written text (only dispatchers: `bench`, `kv`, `grammar`, which list
// their subcommands) has no table: Args then accepts what it reads.
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace beluga::cli {

struct Flag {
  std::string_view name;   // without the leading "--"
  std::string_view value;  // what it takes ("N", "FILE", "a|b"); empty: a switch, no value
  std::string_view help;
  bool positional = false;  // the value may also come as the first positional argument (MODEL_DIR)
};

struct FlagGroup {
  std::string_view title;  // empty: the command's own options
  std::vector<Flag> flags;
};

struct CommandUsage {
  std::string_view command;        // "generate", "bench model", ...
  const char* text = nullptr;      // hand-written usage (no table); null when the table below is it
  std::string_view synopsis = {};  // after "usage: beluga COMMAND "
  std::string_view summary = {};
  std::vector<FlagGroup> groups = {};

  bool has_table() const { return text == nullptr; }
  // The names of the switches (options without a value) and of every option in the table.
  std::set<std::string> switches() const;
  std::set<std::string> options() const;
};

// Every command's usage (usage.cc), in the order `beluga --help` and the docs list them.
const std::vector<CommandUsage>& command_usages();
// Null when `command` has none.
const CommandUsage* find_usage(std::string_view command);
// `command`'s usage, which must exist (for the command's own Args).
const CommandUsage& usage_of(std::string_view command);

// The option of `options` nearest to `name` (a typo of it: at most a third of its letters, and at
// most 3, inserted, deleted, changed or swapped with a neighbour), or "" when none is that near.
std::string nearest_option(const std::set<std::string>& options, std::string_view name);

// What `--help` prints: the hand-written text, or the table rendered.
std::string usage_text(const CommandUsage& u);
// docs/configuration.md: every command's options.
std::string configuration_markdown();

}  // namespace beluga::cli
