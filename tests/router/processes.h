// Child processes for the router tests: `beluga serve` replicas on the built-in demo model (one CPU
// thread each) and `beluga router` in front of them, on free loopback ports. Each is killed
// (SIGKILL) when its object goes away, unless the test ended it.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace beluga::router::testing {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A loopback port that was free a moment ago (for a process started later on it).
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

class ChildProcess {
 public:
  // Runs `args` (args[0]: the binary) with stdout and stderr to a log file; waits until the log
  // shows `ready_marker` followed (on that line) by "http://127.0.0.1:PORT", up to 90 s.
  ChildProcess(std::vector<std::string> args, const std::string& ready_marker) {
    char tmpl[] = "/tmp/beluga_router_test_XXXXXX";
    const int fd = mkstemp(tmpl);
    log_ = tmpl;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      setenv("OMP_WAIT_POLICY", "PASSIVE", 1);  // a small shared machine: no spinning threads
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fd);
    const auto t0 = Clock::now();
    while (seconds_since(t0) < 90 && port_ == 0 && alive()) {
      const std::string l = log();
      const size_t at = l.find(ready_marker);
      if (at != std::string::npos) {
        const size_t p = l.find("http://127.0.0.1:", at);
        if (p != std::string::npos) port_ = std::atoi(l.c_str() + p + 17);
      }
      if (port_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~ChildProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    unlink(log_.c_str());
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string log() const {
    std::ifstream f(log_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  bool alive() {
    if (exited_) return false;
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      exited_ = true;
      return false;
    }
    return true;
  }
  void kill_now() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      exited_ = true;
    }
  }
  // SIGTERM, then the exit code (-1: still running after `limit`, or killed by a signal).
  int terminate(std::chrono::seconds limit = std::chrono::seconds(20)) {
    if (exited_) return -1;
    kill(pid_, SIGTERM);
    const auto t0 = Clock::now();
    int st = 0;
    while (seconds_since(t0) < double(limit.count())) {
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  bool exited_ = false;
  std::string log_;
};

inline std::string demo_model() {
  return std::string(BELUGA_SOURCE_DIR) + "/models/beluga-demo-coder-mtp";
}

// `beluga serve` on the demo model; `port` 0: any free one.
inline std::unique_ptr<ChildProcess> start_replica(int port = 0, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {BELUGA_BINARY,        "serve",     "--model", demo_model(),    "--port",
                                   std::to_string(port), "--threads", "1",       "--kv-cache-mb", "64",
                                   "--no-access-log"};
  args.insert(args.end(), extra.begin(), extra.end());
  return std::make_unique<ChildProcess>(args, "beluga serve: serving ");
}

inline std::unique_ptr<ChildProcess> start_router(const std::vector<std::string>& replica_urls,
                                                  std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {BELUGA_BINARY, "router", "--model", demo_model(), "--port", "0"};
  for (const auto& u : replica_urls) {
    args.push_back("--replica");
    args.push_back(u);
  }
  args.insert(args.end(), extra.begin(), extra.end());
  return std::make_unique<ChildProcess>(args, "beluga router: routing to ");
}

}  // namespace beluga::router::testing
