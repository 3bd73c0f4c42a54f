// `beluga router` on the command line: --help lists its options, `beluga --help` lists the command,
// and a bad command line fails with its own message before anything is read or bound.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace {

struct CmdResult {
  int code = -1;
  std::string out;
};

CmdResult run(const std::string& args) {
  const std::string cmd = std::string(BELUGA_BINARY) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  CmdResult r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(RouterCli, HelpListsTheOptions) {
  for (const char* flag : {"--help", "-h"}) {
    const CmdResult r = run(std::string("router ") + flag);
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(r.out.rfind("usage: beluga router", 0), 0u) << r.out;
    for (const char* opt : {"--replica", "--policy", "--balance-window", "--load-cost-tokens",
                            "--eject-after", "--health-interval-ms", "--max-retries", "--config"})
      EXPECT_NE(r.out.find(opt), std::string::npos) << opt;
  }
  const CmdResult b = run("bench router --help");
  EXPECT_EQ(b.code, 0);
  EXPECT_EQ(b.out.rfind("usage: beluga bench router", 0), 0u) << b.out;
  const CmdResult f = run("bench fleet --help");
  EXPECT_EQ(f.code, 0);
  EXPECT_EQ(f.out.rfind("usage: beluga bench fleet", 0), 0u) << f.out;
  for (const char* opt : {"--replicas", "--policies", "--tenants", "--slo"})
    EXPECT_NE(f.out.find(opt), std::string::npos) << opt;
  EXPECT_NE(run("--help").out.find("router"), std::string::npos);
}

TEST(RouterCli, BadCommandLinesFailFirst) {
  // The model directory does not exist: reaching it would fail differently.
  const std::string none = " --model /nonexistent-model-dir";
  struct Case {
    std::string args, needle;
  } cases[] = {
      {"router" + none, "at least one --replica URL is needed"},
      {"router" + none + " --replica http://127.0.0.1:1 --policy random", "unknown --policy 'random'"},
      {"router" + none + " --replica http://127.0.0.1:1 --bogus 1", "unknown option --bogus"},
      {"router" + none + " --replica", "option --replica needs a value"},
      {"router" + none + " --replica http://127.0.0.1:1 --port x", "option --port expects an integer"},
      {"router" + none + " --replica http://127.0.0.1:1 --eject-after 0", "must be positive"},
      {"router --replica https://127.0.0.1:1", "https is not supported"},
      {"router --replica http://127.0.0.1", "expected http://HOST:PORT"},
      {"router --replica http://127.0.0.1:5 --replica 127.0.0.1:5", "is given twice"},
      {"bench router --bogus 1", "unknown option --bogus"},
  };
  for (const auto& c : cases) {
    const CmdResult r = run(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << c.args << " -> " << r.out;
  }
}

}  // namespace
