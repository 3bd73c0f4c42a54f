// The command line a new user meets: `beluga --version`, `--help` / `-h` on every subcommand (usage
// on stdout, exit 0), unknown and malformed options failing before anything loads or listens, and the
// model directory as a positional argument (`beluga serve DIR`, as `vllm serve MODEL`).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "../common/command.h"
#include "cli_test_support.h"
#include "server/version.h"

extern char** environ;

namespace beluga {
namespace {

namespace fs = std::filesystem;

using testing::CmdResult;
using testing::run_beluga;

const std::string kDemo = std::string(BELUGA_SOURCE_DIR) + "/models/beluga-demo-coder-mtp";
using testing::kFixtures;

TEST(CliArgs, Version) {
  CmdResult r = run_beluga("--version", /*stdout_only=*/true);
  EXPECT_EQ(r.code, 0);
  EXPECT_EQ(r.out, std::string("beluga ") + kVersion + "\n");
  EXPECT_EQ(run_beluga("-V", true).out, r.out);
}

TEST(CliArgs, EverySubcommandAnswersHelp) {
  struct Case {
    std::string command, option;  // an option the usage must list
  } cases[] = {
      {"serve", "--no-access-log"},
      {"generate", "--prompt-ids"},
      {"logits", "--out"},
      {"inspect", "--load-format"},
      {"bench", "tokenizer"},
      {"bench model", "--gen-len"},
      {"bench tokenizer", "--no-hf"},
      {"bench serve", "--request-rate"},
      {"tokenize", "--allow-special"},
      {"detokenize", "--skip-special"},
      {"render", "--request"},
  };
  for (const auto& c : cases) {
    for (const char* flag : {"--help", "-h"}) {
      CmdResult r = run_beluga(c.command + " " + flag, /*stdout_only=*/true);
      EXPECT_EQ(r.code, 0) << c.command << " " << flag << ": " << r.out;
      EXPECT_EQ(r.out.rfind("usage: beluga " + c.command, 0), 0u)
          << c.command << " " << flag << ": " << r.out;
      EXPECT_NE(r.out.find(c.option), std::string::npos) << c.command << " " << flag << ": " << r.out;
    }
  }
  // Help wins over anything else on the line, even a model that does not exist.
  EXPECT_EQ(run_beluga("bench model --model /nonexistent --help").code, 0);
  CmdResult top = run_beluga("--help", true);
  EXPECT_EQ(top.code, 0);
  for (const char* c : {"serve", "generate", "bench", "render", "tokenize"})
    EXPECT_NE(top.out.find(c), std::string::npos) << c;
}

TEST(CliArgs, BadOptionsFailBeforeAnythingLoads) {
  // The model directory does not exist: reaching it would say "no config.json", so each of these
  // failing with its own message shows the command line was checked first.
  const std::string none = " /nonexistent-model-dir";
  struct Case {
    std::string args, needle;
  } cases[] = {
      {"serve" + none + " --bogus 1", "unknown option --bogus"},
      {"serve" + none + " --bogus", "unknown option --bogus"},
      {"serve" + none + " --port abc", "option --port expects an integer, got 'abc'"},
      {"serve" + none + " --port", "option --port needs a value"},
      {"serve" + none + " --api-key --port 1", "option --api-key needs a value"},
      {"serve" + none + " --max-num-seqs 0", "--max-num-seqs and --max-num-batched-tokens must be positive"},
      {"serve" + none + " -p 8000", "unknown option '-p'"},
      {"serve" + none + " --chat-format nope", "unknown --chat-format 'nope'"},
      {"serve" + none + " --dtype fp7", "--dtype must be float32 or bfloat16"},
      {"generate" + none + " --prompt-ids 1 --bogus 3", "unknown option --bogus"},
      {"generate" + none + " --prompt-ids 1 --max-tokens x", "option --max-tokens expects an integer"},
      {"generate" + none + " --prompt-ids 1 --format yaml", "--format must be json or text"},
      {"logits" + none + " --prompt-ids 1", "missing required option --out"},
      {"inspect" + none + " --bogus", "unknown option --bogus"},
      {"bench model" + none + " --batch x", "option --batch expects an integer"},
      {"bench model" + none + " --bogus 1", "unknown option --bogus"},
      {"tokenize --tokenizer /nonexistent.json --bogus", "unknown option --bogus"},
      {"tokenize --tokenizer /nonexistent.json stray", "unexpected argument 'stray'"},
      {"detokenize --tokenizer /nonexistent.json --bogus", "unknown option --bogus"},
      {"render --model /nonexistent --request /nonexistent --bogus 1", "unknown option --bogus"},
  };
  for (const auto& c : cases) {
    CmdResult r = run_beluga(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << c.args << " -> " << r.out;
    EXPECT_EQ(r.out.find("no config.json"), std::string::npos) << c.args << " -> " << r.out;
    EXPECT_EQ(r.out.find("listening"), std::string::npos) << c.args << " -> " << r.out;
  }
  // The control: with a good command line the same directory is reached (and reported).
  CmdResult reached = run_beluga("serve" + none + " --port 0 --no-access-log");
  EXPECT_NE(reached.code, 0);
  EXPECT_NE(reached.out.find("no config.json at /nonexistent-model-dir/config.json"), std::string::npos)
      << reached.out;
}

TEST(CliArgs, PositionalModelDirectory) {
  const std::string q = kFixtures + "qwen3-tiny";
  CmdResult pos = run_beluga("generate " + q + " --prompt-ids 1,2,3 --max-tokens 4", true);
  CmdResult flag = run_beluga("generate --model " + q + " --prompt-ids 1,2,3 --max-tokens 4", true);
  ASSERT_EQ(pos.code, 0) << pos.out;
  EXPECT_EQ(pos.out, flag.out);
  // The same directory both ways is fine; two different ones are an error, as are two positionals.
  EXPECT_EQ(run_beluga("inspect " + q + " --model " + q).code, 0);
  CmdResult both = run_beluga("inspect " + q + " --model " + kFixtures + "dsv3-tiny");
  EXPECT_NE(both.code, 0);
  EXPECT_NE(both.out.find("given twice and differently"), std::string::npos) << both.out;
  CmdResult two = run_beluga("inspect " + q + " " + kFixtures + "dsv3-tiny");
  EXPECT_NE(two.code, 0);
  EXPECT_NE(two.out.find("one model directory expected"), std::string::npos) << two.out;
  CmdResult inspected = run_beluga("inspect " + kFixtures + "dsv3-tiny", true);
  ASSERT_EQ(inspected.code, 0);
  EXPECT_NE(inspected.out.find("\"architecture\": \"deepseek_v3\""), std::string::npos) << inspected.out;
}

// `beluga serve DIR` serves DIR (before, a positional was ignored and the demo model served):
// a copy of the demo model under another name is served under that name.
TEST(CliArgs, ServePositionalModelIsServed) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("my-model-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(kDemo)) fs::create_symlink(e.path(), dir / e.path().filename());

  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 2);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  const std::string bin = BELUGA_BINARY, d = dir.string();
  std::vector<std::string> args{bin, "serve", d, "--port", "0"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, bin.c_str(), &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]);
  std::string log;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  char buf[4096];
  while (log.find("serving") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    ssize_t n = ::read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    log.append(buf, size_t(n));
  }
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(out[0]);
  fs::remove_all(dir);
  const std::string name = dir.filename().string();
  EXPECT_NE(log.find("serving " + name + " on cpu (" + d + ","), std::string::npos) << log;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
}

}  // namespace
}  // namespace beluga
