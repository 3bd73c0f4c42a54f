// Command-line arguments of one subcommand: `--key value`, `--key=value`, bare `--flag`, positionals.
// `--help` and `-h` are always flags (has("help")). Unknown or unused options and unexpected
// positionals are an error (check_all_used; with an option table, naming the nearest option), so a
// typo never silently changes behaviour; a command reads every option and calls check_all_used
// before it loads anything, so a bad command line fails at once. With a table, check_all_used also
// checks the command asked about every option the table lists (an internal error otherwise), so the
// table and the parser agree both ways on every path that reaches it.
#pragma once

#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cli/flag_table.h"

namespace beluga::cli {

class Args {
 public:
  // `flags` names the options that take no value (`--jsonl`); every other `--x` takes one (the next
  // argument, which must not itself be an option).
  Args(int argc, char** argv, const std::set<std::string>& flags = {});
  // The arguments of `command`, parsed by its option table (flag_table.h): the table's switches take
  // no value, and reading an option outside the table is a bug (it throws), so the command accepts
  // exactly what its --help lists.
  static Args for_command(int argc, char** argv, std::string_view command);

  std::optional<std::string> get(const std::string& key) const;
  std::string get_or(const std::string& key, const std::string& def) const;
  std::string require(const std::string& key) const;
  long get_int(const std::string& key, long def) const;
  double get_double(const std::string& key, double def) const;
  bool has(const std::string& key) const;
  // The arguments that are no option; reading them marks them used.
  const std::vector<std::string>& positional() const;
  // `key` was read by the command from argv itself (a repeated option such as the router's
  // --replica): counts as asked about.
  void taken(const std::string& key) const;
  // Options that do not apply on this path (`--batch` with `--device cuda`): an error when given,
  // `why` ending "--batch does not apply WHY"; asked about otherwise.
  void not_with(std::initializer_list<const char*> keys, std::string_view why) const;

  // Throws if an option was given that the command never asked about, or positionals it never read.
  void check_all_used() const;

 private:
  void check_declared(const std::string& key) const;
  std::string unknown(const std::string& key) const;  // the message, with the nearest option

  std::optional<std::set<std::string>> table_;  // the options the command declares, when it has a table
  std::string command_;                         // its name, for the table's messages
  std::map<std::string, std::string> values_;
  std::set<std::string> missing_value_;  // `--x` last or before another option, not a flag
  std::vector<std::string> positional_;
  mutable std::set<std::string> used_;
  mutable bool positional_used_ = false;
};

// True when argv (a subcommand's arguments) asks for help: `--help` or `-h`.
bool wants_help(int argc, char** argv);

std::vector<int> parse_int_list(const std::string& s);

}  // namespace beluga::cli
