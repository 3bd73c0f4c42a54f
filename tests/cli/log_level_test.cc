// `--log-level` and BELUGA_LOG_LEVEL on a real `beluga serve`: debug shows a client error's line,
// the flag wins over the environment, and a quieter level drops the startup lines (errors from the
// command line still reach the user).
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <string>
#include <vector>

#include "../common/command.h"

extern char** environ;

namespace beluga {
namespace {

using testing::run_beluga;
using testing::run_command;

// GET `path` from 127.0.0.1:port; the status line's code, or 0.
int http_get_status(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return 0;
  }
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  if (::write(fd, req.data(), req.size()) != ssize_t(req.size())) {
    ::close(fd);
    return 0;
  }
  std::string resp;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) resp.append(buf, size_t(n));
  ::close(fd);
  return resp.rfind("HTTP/1.1 ", 0) == 0 ? std::stoi(resp.substr(9, 3)) : 0;
}

TEST(LogLevel, DebugShowsClientErrorsAndTheFlagWinsOverTheEnvironment) {
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 2);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  const std::string bin = BELUGA_BINARY;
  std::vector<std::string> args{bin,         "serve", "--port",      "0",    "--no-access-log",
                                "--threads", "1",     "--log-level", "debug"};
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e)
    if (std::string(*e).rfind("BELUGA_LOG_LEVEL=", 0) != 0) env_s.emplace_back(*e);
  env_s.emplace_back("BELUGA_LOG_LEVEL=error");  // overridden by the flag
  std::vector<char*> envp;
  for (auto& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, bin.c_str(), &fa, nullptr, argv.data(), envp.data()), 0);
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]);

  std::string log;
  char buf[4096];
  const auto read_until = [&](const std::string& needle) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (log.find(needle) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      const ssize_t n = ::read(out[0], buf, sizeof buf);
      if (n <= 0) return;
      log.append(buf, size_t(n));
    }
  };
  read_until("beluga serve: serving ");
  std::smatch m;
  const std::regex port_re("serving .* on http://127\\.0\\.0\\.1:([0-9]+)");
  const bool found = std::regex_search(log, m, port_re);
  if (found) {
    EXPECT_EQ(http_get_status(std::stoi(m[1]), "/no-such-route"), 404);
    read_until("debug: GET /no-such-route: 404");
  }
  ::kill(pid, SIGTERM);
  read_until("shutting down");
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(out[0]);
  ASSERT_TRUE(found) << log;
  EXPECT_NE(log.find("beluga serve: listening on http://"), std::string::npos) << log;
  EXPECT_NE(log.find("beluga serve: debug: GET /no-such-route: 404 no route for /no-such-route"),
            std::string::npos)
      << log;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
}

TEST(LogLevel, AQuieterLevelDropsInfoLinesButNotErrors) {
  // The model directory does not exist: serve listens (an info line), then fails to load it.
  const std::string cmd = " serve /nonexistent-model-dir --port 0 --no-access-log";
  const auto quiet = run_command("BELUGA_LOG_LEVEL=warn " + std::string(BELUGA_BINARY) + cmd + " 2>&1");
  EXPECT_EQ(quiet.code, 1);
  EXPECT_EQ(quiet.out.find("listening"), std::string::npos) << quiet.out;
  EXPECT_NE(quiet.out.find("beluga serve: error: no config.json"), std::string::npos) << quiet.out;
  const auto loud =
      run_command("BELUGA_LOG_LEVEL=warn " + std::string(BELUGA_BINARY) + cmd + " --log-level info 2>&1");
  EXPECT_NE(loud.out.find("beluga serve: listening on http://"), std::string::npos) << loud.out;
  const auto bad = run_beluga(cmd.substr(1) + " --log-level verbose");
  EXPECT_NE(bad.out.find("--log-level must be error, warn, info or debug (got 'verbose')"), std::string::npos)
      << bad.out;
  EXPECT_EQ(bad.out.find("listening"), std::string::npos) << bad.out;
  const auto router = run_beluga("router --replica http://127.0.0.1:1 --log-level loud");
  EXPECT_NE(router.out.find("--log-level must be error, warn, info or debug (got 'loud')"), std::string::npos)
      << router.out;
}

}  // namespace
}  // namespace beluga
