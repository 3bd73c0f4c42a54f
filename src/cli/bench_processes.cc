#include "cli/bench_processes.h"

#include <sched.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "util/error.h"

namespace beluga::cli {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

BenchProcess::BenchProcess(const std::vector<std::string>& args, const std::string& ready_marker,
                           double timeout_s, const std::vector<int>& cpus) {
  char tmpl[] = "/tmp/beluga_bench_fleet_XXXXXX";
  const int fd = mkstemp(tmpl);
  BELUGA_CHECK(fd >= 0, "cannot create a log file in /tmp");
  log_path_ = tmpl;
  // The argv strings are built before fork: the child only calls async-signal-safe functions.
  std::vector<std::string> full = {"/proc/self/exe"};
  full.insert(full.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : full) argv.push_back(a.data());
  argv.push_back(nullptr);
  cpu_set_t mask;
  CPU_ZERO(&mask);
  for (int c : cpus) CPU_SET(c, &mask);
  pid_ = fork();
  BELUGA_CHECK(pid_ >= 0, "fork failed");
  if (pid_ == 0) {
    if (!cpus.empty() && sched_setaffinity(0, sizeof(mask), &mask) != 0) _exit(126);
    dup2(fd, 1);
    dup2(fd, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fd);
  const auto t0 = Clock::now();
  while (port_ == 0) {
    const std::string l = log();
    const size_t at = l.find(ready_marker);
    if (at != std::string::npos) {
      const size_t p = l.find("http://127.0.0.1:", at);
      if (p != std::string::npos) port_ = std::atoi(l.c_str() + p + 17);
    }
    if (port_ != 0) break;
    int st = 0;
    const bool exited = waitpid(pid_, &st, WNOHANG) == pid_;
    if (exited || since(t0) > timeout_s) {
      if (!exited) {
        kill(pid_, SIGKILL);  // the destructor does not run for a constructor that throws
        waitpid(pid_, nullptr, 0);
      }
      pid_ = -1;
      unlink(log_path_.c_str());
      const std::string tail = l.size() > 600 ? l.substr(l.size() - 600) : l;
      fail("`beluga ", args.empty() ? "" : args[0], "` ", exited ? "exited" : "did not get ready",
           " before it was ready; its log:\n", tail);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

BenchProcess::~BenchProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  unlink(log_path_.c_str());
}

std::string BenchProcess::log() const {
  std::ifstream f(log_path_);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void BenchProcess::stop(double limit_s) {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  const auto t0 = Clock::now();
  while (since(t0) < limit_s) {
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
      pid_ = -1;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

}  // namespace beluga::cli
