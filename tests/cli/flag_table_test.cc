// The option tables themselves (src/cli/usage.cc) and Args' checks against them, in-process: names
// are unique within a command, the nearest-option suggestion, and the two directions of agreement
// (reading an option outside the table is an internal error; so is a table option the command never
// asks about by check_all_used).
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/flag_table.h"
#include "util/error.h"

namespace beluga::cli {
namespace {

// argv from words (Args keeps copies of what it reads).
struct Argv {
  explicit Argv(std::vector<std::string> w) : words(std::move(w)) {
    for (auto& s : words) ptrs.push_back(s.data());
  }
  int argc() const { return int(ptrs.size()); }
  char** argv() { return ptrs.data(); }
  std::vector<std::string> words;
  std::vector<char*> ptrs;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(FlagTable, NamesAreUniqueAndSpelledAsOptions) {
  std::set<std::string> commands;
  for (const auto& u : command_usages()) {
    EXPECT_TRUE(commands.insert(std::string(u.command)).second) << "two entries for " << u.command;
    if (!u.has_table()) continue;
    std::set<std::string> seen;
    for (const auto& g : u.groups) {
      EXPECT_FALSE(g.flags.empty()) << u.command << ": empty group " << g.title;
      for (const auto& f : g.flags) {
        EXPECT_TRUE(seen.insert(std::string(f.name)).second)
            << u.command << " lists --" << f.name << " twice";
        EXPECT_FALSE(f.name.empty());
        EXPECT_NE(f.name.front(), '-') << u.command << ": --" << f.name;
        for (char c : f.name)
          EXPECT_TRUE((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')
              << u.command << ": " << f.name;
      }
    }
    EXPECT_EQ(seen, u.options()) << u.command;
  }
}

TEST(FlagTable, OnlyDispatchersAreHandWritten) {
  // A command with options has a table; hand-written text is left for the lists of subcommands.
  std::set<std::string> text;
  for (const auto& u : command_usages())
    if (!u.has_table()) text.insert(std::string(u.command));
  EXPECT_EQ(text, (std::set<std::string>{"bench", "grammar", "kv"}));
  for (const auto& name : text)
    for (const auto& u : command_usages()) {
      if (u.command.rfind(name + " ", 0) != 0) continue;
      EXPECT_NE(usage_text(usage_of(name)).find(std::string(u.command.substr(name.size() + 1))),
                std::string::npos)
          << "`beluga " << name << " --help` omits " << u.command;
    }
}

TEST(FlagTable, ServeAndRouterTakeTheLogLevel) {
  for (const char* c : {"serve", "router"}) EXPECT_TRUE(usage_of(c).options().count("log-level")) << c;
}

TEST(FlagTable, NearestOptionIsATyposWorth) {
  const auto serve = usage_of("serve").options();
  EXPECT_EQ(nearest_option(serve, "prot"), "port");                 // swapped neighbours
  EXPECT_EQ(nearest_option(serve, "max-num-seq"), "max-num-seqs");  // a letter left out
  EXPECT_EQ(nearest_option(serve, "kv-retenion"), "kv-retention");  // a letter left out
  EXPECT_EQ(nearest_option(serve, "api_key"), "api-key");           // a letter changed
  EXPECT_EQ(nearest_option(serve, "log-levels"), "log-level");      // one too many
  EXPECT_EQ(nearest_option(serve, "bogus"), "");                    // nothing that near
  EXPECT_EQ(nearest_option(serve, "not-an-option"), "");
  EXPECT_EQ(nearest_option(serve, "x"), "");
  EXPECT_EQ(nearest_option({}, "port"), "");
}

TEST(FlagTable, UnknownOptionNamesTheNearestAndTheHelp) {
  Argv a({"--kv-disk-dri", "/tmp/x"});
  const Args args = Args::for_command(a.argc(), a.argv(), "kv stats");
  args.get("kv-disk-dir");
  args.has("json");
  EXPECT_EQ(error_of([&] { args.check_all_used(); }),
            "unknown option --kv-disk-dri (did you mean --kv-disk-dir?); `beluga kv stats --help` lists the "
            "options");
}

TEST(FlagTable, ReadingAnOptionOutsideTheTableIsABug) {
  Argv a({"--kv-disk-dir", "/tmp/x"});
  const Args args = Args::for_command(a.argc(), a.argv(), "kv stats");
  EXPECT_NE(error_of([&] { args.get("now"); }).find("internal error: the command reads --now"),
            std::string::npos);
}

TEST(FlagTable, ATableOptionTheCommandNeverReadsIsABug) {
  Argv a({"--kv-disk-dir", "/tmp/x"});
  const Args args = Args::for_command(a.argc(), a.argv(), "kv stats");
  args.get("kv-disk-dir");  // --json never asked about
  EXPECT_EQ(error_of([&] { args.check_all_used(); }),
            "internal error: `beluga kv stats` never reads --json, which its option table (src/cli/usage.cc) "
            "lists");
  args.has("json");
  EXPECT_EQ(error_of([&] { args.check_all_used(); }), "");
}

TEST(FlagTable, TakenAndNotWithCountAsAsked) {
  Argv ok({"--kv-disk-dir", "/tmp/x"});
  const Args a = Args::for_command(ok.argc(), ok.argv(), "kv gc");
  a.get("kv-disk-dir");
  a.taken("kv-retention");
  a.not_with({"now", "json"}, "in this test");
  EXPECT_EQ(error_of([&] { a.check_all_used(); }), "");

  Argv given({"--kv-disk-dir", "/tmp/x", "--now", "5"});
  const Args b = Args::for_command(given.argc(), given.argv(), "kv gc");
  EXPECT_EQ(error_of([&] {
              b.not_with({"json", "now"}, "in this test");
            }),
            "--now does not apply in this test");
}

TEST(FlagTable, SwitchesTakeNoValue) {
  Argv a({"--json", "/tmp/stray"});
  const Args args = Args::for_command(a.argc(), a.argv(), "kv stats");
  EXPECT_TRUE(args.has("json"));
  EXPECT_EQ(args.positional(), std::vector<std::string>{"/tmp/stray"});
}

}  // namespace
}  // namespace beluga::cli
