#include "cli/flag_table.h"

#include <algorithm>

#include "util/error.h"

namespace beluga::cli {

namespace {

std::string left_column(const Flag& f) {
  std::string s = f.positional ? "MODEL_DIR | --" : "--";
  s += f.name;
  if (!f.value.empty()) {
    s += ' ';
    s += f.value;
  }
  return s;
}

// Optimal string alignment distance: edits of one letter, and swaps of two neighbours ("prot").
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

}  // namespace

std::string nearest_option(const std::set<std::string>& options, std::string_view name) {
  const size_t limit = std::min<size_t>(3, std::max<size_t>(1, name.size() / 3));
  std::string best;
  size_t best_d = limit + 1;
  for (const auto& o : options) {  // in order: the first of equally near ones wins
    const size_t d = edit_distance(name, o);
    if (d < best_d) {
      best_d = d;
      best = o;
    }
  }
  return best;
}

std::set<std::string> CommandUsage::switches() const {
  std::set<std::string> out;
  for (const auto& g : groups)
    for (const auto& f : g.flags)
      if (f.value.empty()) out.emplace(f.name);
  return out;
}

std::set<std::string> CommandUsage::options() const {
  std::set<std::string> out;
  for (const auto& g : groups)
    for (const auto& f : g.flags) out.emplace(f.name);
  return out;
}

const CommandUsage* find_usage(std::string_view command) {
  for (const auto& u : command_usages())
    if (u.command == command) return &u;
  return nullptr;
}

const CommandUsage& usage_of(std::string_view command) {
  const CommandUsage* u = find_usage(command);
  BELUGA_CHECK(u, "internal error: no usage for `beluga ", command, "`");
  return *u;
}

std::string usage_text(const CommandUsage& u) {
  if (!u.has_table()) return u.text;
  std::string out = "usage: beluga " + std::string(u.command) + " " + std::string(u.synopsis) + "\n";
  if (!u.summary.empty()) out += std::string(u.summary) + "\n\n";
  for (size_t i = 0; i < u.groups.size(); ++i) {
    const FlagGroup& g = u.groups[i];
    if (i > 0) out += "\n";
    if (!g.title.empty()) out += std::string(g.title) + ":\n";
    for (const Flag& f : g.flags) {
      std::string line = "  " + left_column(f);
      if (!f.help.empty()) {
        // Help in one column (28) when the option fits before it, else three spaces after it.
        line += line.size() < 28 ? std::string(28 - line.size(), ' ') : std::string(3, ' ');
        line += f.help;
      }
      out += line + "\n";
    }
  }
  return out;
}

std::string configuration_markdown() {
  std::string out =
      "# Configuration\n\n"
      "Every option of every `beluga` command. Generated from the option tables in `src/cli/usage.cc`\n"
      "(the same tables `beluga COMMAND --help` prints and the argument parser accepts): do not edit by\n"
      "hand; regenerate with `build/beluga help --markdown > docs/configuration.md` (a test fails when\n"
      "this file is out of date). Options are spelled `--name value` or `--name=value`; an unknown one\n"
      "is refused before anything loads, naming the nearest option.\n";
  for (const auto& u : command_usages()) {
    out += "\n## beluga " + std::string(u.command) + "\n\n";
    if (!u.has_table()) {
      out += "```\n" + std::string(u.text) + "```\n";
      continue;
    }
    out += "`beluga " + std::string(u.command) + " " + std::string(u.synopsis) + "`\n\n";
    if (!u.summary.empty()) out += std::string(u.summary) + "\n\n";
    for (size_t i = 0; i < u.groups.size(); ++i) {
      const FlagGroup& g = u.groups[i];
      if (i > 0) out += "\n";
      if (!g.title.empty()) out += std::string(g.title) + ":\n\n";
      out += "| option | value | what it does |\n|---|---|---|\n";
      for (const Flag& f : g.flags) {
        std::string help(f.help);
        for (size_t p = 0; (p = help.find('|', p)) != std::string::npos; p += 2) help.replace(p, 1, "\\|");
        std::string value(f.value);
        for (size_t p = 0; (p = value.find('|', p)) != std::string::npos; p += 2) value.replace(p, 1, "\\|");
        out += "| `--" + std::string(f.name) + "`" +
               (f.positional ? " (or the first positional argument)" : "") + " | " +
               (value.empty() ? "(switch)" : "`" + value + "`") + " | " + help + " |\n";
      }
    }
  }
  return out;
}

}  // namespace beluga::cli
