// Command-line arguments of one subcommand: `--key value`, `--key=value` and bare `--flag`.
// Unknown or unused flags are an error, so a typo never silently changes behaviour.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace beluga::cli {

class Args {
 public:
  // `flags` names the options that take no value (`--jsonl`); every other `--x` takes one.
  Args(int argc, char** argv, const std::set<std::string>& flags = {});

  std::optional<std::string> get(const std::string& key) const;
  std::string get_or(const std::string& key, const std::string& def) const;
  std::string require(const std::string& key) const;
  long get_int(const std::string& key, long def) const;
  double get_double(const std::string& key, double def) const;
  bool has(const std::string& key) const;
  const std::vector<std::string>& positional() const { return positional_; }

  // Throws if an option was given that the command never asked about.
  void check_all_used() const;

 private:
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
  mutable std::set<std::string> used_;
};

std::vector<int> parse_int_list(const std::string& s);

}  // namespace beluga::cli
