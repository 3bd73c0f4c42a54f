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
  for (const char* c :
       {"serve",           "router",        "generate",      "logits",       "inspect",       "bench model",
        "bench tokenizer", "bench serve",   "bench sampler", "bench router", "bench fleet",   "bench pd",
        "bench kv",        "bench grammar", "bench ep",      "bench eplb",   "grammar check", "kv stats",
        "kv gc",           "tokenize",      "detokenize",    "render",       "help"})
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

// Every command line path reaches check_all_used, which fails with an internal error when the
// command never asked about an option its table lists: each path's minimal command line (its
// required options; a model directory that does not exist, since nothing may load first) plus an
// unknown option must fail with exactly that unknown option. So the table and what the command reads
// agree both ways. A new command gets its line here (the test fails until it has one).
TEST(ConfigurationDoc, EveryTableOptionIsReadOnEveryPath) {
  const std::string none = "/nonexistent-model-dir", file = "/nonexistent-file";
  const std::multimap<std::string, std::string> paths = {
      {"serve", none},
      {"router", "--replica http://127.0.0.1:1 --model " + none},
      {"generate", none + " --prompt-ids 1"},
      {"logits", none + " --prompt-ids 1 --out " + file},
      {"inspect", none},
      {"bench model", none},
      {"bench model", none + " --device cuda"},
      {"bench tokenizer", "--tokenizer " + file + " --input " + file},
      {"bench serve", ""},
      {"bench sampler", ""},
      {"bench ep", ""},
      {"bench router", ""},
      {"bench fleet", ""},
      {"bench pd", ""},
      {"bench eplb", ""},
      {"bench kv", none},
      {"bench kv", none + " --agent-trace"},
      {"bench grammar", "--tokenizer " + file + " --schemas " + file},
      {"grammar check", "--tokenizer " + file + " --schema " + file + " --instances " + file},
      {"kv stats", "--kv-disk-dir " + file},
      {"kv gc", "--kv-disk-dir " + file},
      {"tokenize", "--tokenizer " + file},
      {"detokenize", "--tokenizer " + file},
      {"render", "--model " + none + " --request " + file},
      {"help", ""},
  };
  const auto r = run_beluga("help --markdown", /*stdout_only=*/true);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const auto& [command, options] : options_by_command(r.out)) {
    EXPECT_TRUE(paths.count(command)) << "`beluga " << command << "` has no minimal command line here";
    (void)options;
  }
  for (const auto& [command, line] : paths) {
    const std::string args = command + " " + line + " --not-an-option 1";
    const auto bad = run_beluga(args);
    EXPECT_EQ(bad.code, 1) << args << ": " << bad.out;
    // A CPU-only build refuses --device cuda while reading the model options, before the rest.
    const bool cuda_refused =
        line.find("--device cuda") != std::string::npos &&
        bad.out.find("--device cuda is not available in this build") != std::string::npos;
    EXPECT_TRUE(cuda_refused || bad.out.find("error: unknown option --not-an-option; `beluga " + command +
                                             " --help` lists") != std::string::npos)
        << args << ": " << bad.out;
  }
  // And a typo is answered with the option meant.
  const auto typo = run_beluga("serve " + none + " --max-num-seq 4");
  EXPECT_NE(typo.out.find("unknown option --max-num-seq (did you mean --max-num-seqs?)"), std::string::npos)
      << typo.out;
  const auto router_typo = run_beluga("router --replica http://127.0.0.1:1 --polciy round-robin");
  EXPECT_NE(router_typo.out.find("unknown option --polciy (did you mean --policy?)"), std::string::npos)
      << router_typo.out;
}

}  // namespace
}  // namespace beluga
