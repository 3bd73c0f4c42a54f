// The option tables (src/cli/usage.cc) as the single source: docs/configuration.md is exactly what
// `beluga help --markdown` generates from them; every option the docs list for a command is in that
// command's --help; and a command refuses an option outside its table (as an unknown option, never
// as the internal error that a command reading an undeclared option would raise).
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <string>

#include "../common/command.h"

namespace beluga {
namespace {

using testing::run_beluga;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Command -> the options its section of the generated Markdown lists.
std::map<std::string, std::set<std::string>> options_by_command(const std::string& md) {
  std::map<std::string, std::set<std::string>> out;
  const std::regex heading("^## beluga (.+)$"), row("^\\| `--([a-z0-9-]+)`");
  std::string current;
  size_t pos = 0;
  while (pos < md.size()) {
    size_t end = md.find('\n', pos);
    if (end == std::string::npos) end = md.size();
    const std::string line = md.substr(pos, end - pos);
    pos = end + 1;
    std::smatch m;
    if (std::regex_search(line, m, heading))
      current = m[1];
    else if (std::regex_search(line, m, row) && !current.empty())
      out[current].insert(m[1]);
  }
  return out;
}

TEST(ConfigurationDoc, IsWhatTheOptionTablesGenerate) {
  const auto r = run_beluga("help --markdown", /*stdout_only=*/true);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string doc = read_text(std::string(BELUGA_SOURCE_DIR) + "/docs/configuration.md");
  EXPECT_EQ(doc, r.out) << "docs/configuration.md is out of date: build/beluga help --markdown > "
                           "docs/configuration.md";
}

TEST(ConfigurationDoc, EveryListedOptionIsInTheCommandsHelpAndNothingElseIsAccepted) {
  const auto r = run_beluga("help --markdown", /*stdout_only=*/true);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto commands = options_by_command(r.out);
  for (const char* c : {"serve", "generate", "logits", "inspect", "bench model", "bench tokenizer",
                        "bench serve", "tokenize", "detokenize", "render", "help"})
    EXPECT_TRUE(commands.count(c)) << c << " has no option table";
  for (const auto& [command, options] : commands) {
    const auto help = run_beluga(command + " --help", /*stdout_only=*/true);
    ASSERT_EQ(help.code, 0) << command;
    EXPECT_EQ(help.out, run_beluga("help " + command, true).out) << command;
    for (const auto& o : options)
      EXPECT_NE(help.out.find("--" + o), std::string::npos) << command << " --help omits --" << o;
    // An option outside the table: refused before anything loads (or a required option is named
    // first); a command that read an option its table lacks would fail with an internal error.
    const auto bad = run_beluga(command + " --not-an-option 1");
    EXPECT_EQ(bad.code, 1) << command << ": " << bad.out;
    EXPECT_EQ(bad.out.find("internal error"), std::string::npos) << command << ": " << bad.out;
    EXPECT_TRUE(bad.out.find("unknown option --not-an-option") != std::string::npos ||
                bad.out.find("missing required option") != std::string::npos)
        << command << ": " << bad.out;
  }
}

}  // namespace
}  // namespace beluga
