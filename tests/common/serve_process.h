// Child processes for tests: `beluga serve` (or `beluga router`, or any binary) started with its
// stdout and stderr in a log file the test can read, on the address and port it prints on its ready
// line ("... http://HOST:PORT", so `--port 0` works), and killed (SIGKILL) when the object goes away
// unless the test ended it. free_port() is for a process that must be told its port in advance.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace beluga::testing {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t);

// A loopback port that was free a moment ago (for a process started later on it).
int free_port();

// The built-in demo model's directory (models/beluga-demo-coder-mtp).
std::string demo_model();

// The serve flags most tests start from: `--model MODEL`, `--port PORT` (0: any free one), one CPU
// thread, a KV cache of `kv_cache_mb`; then `extra`.
std::vector<std::string> serve_flags(const std::string& model, int kv_cache_mb,
                                     const std::vector<std::string>& extra = {}, int port = 0);

// {BELUGA_BINARY, subcommand, flags...}: the argv of a `beluga` run.
std::vector<std::string> beluga_args(const std::string& subcommand, const std::vector<std::string>& flags);

struct ChildOptions {
  std::string ready_marker = "beluga serve: serving ";  // the log line that carries the port
  std::chrono::seconds ready_timeout{60};
  std::vector<std::string> env;  // "NAME=VALUE": set (or replaced) in the child's environment
  rlim_t fsize_limit = 0;        // > 0: the child's RLIMIT_FSIZE; a write past it fails with EFBIG
};

class ChildProcess {
 public:
  // Runs `args` (args[0]: the binary's path) and waits until its log shows `ready_marker` followed
  // by "http://HOST:PORT", until it exits, or for `ready_timeout`; port() is 0 unless it got ready.
  explicit ChildProcess(std::vector<std::string> args, ChildOptions options = {});
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  int port() const { return port_; }
  const std::string& host() const { return host_; }  // as its ready line says (--host; 127.0.0.1)
  std::string url() const { return "http://" + host_ + ":" + std::to_string(port_); }
  pid_t pid() const { return pid_; }
  std::string log() const;  // all it printed so far
  bool alive();             // false once it has exited (it is reaped then)
  void kill_now();          // SIGKILL, reaped (a zombie would still look alive to kill(pid, 0))
  // Its exit code once it ended within `limit`; -1 if it did not, or died of a signal.
  int wait_exit(std::chrono::seconds limit);
  // SIGTERM, then wait_exit(limit); -1 too when it had already ended.
  int terminate(std::chrono::seconds limit = std::chrono::seconds(20));

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string host_ = "127.0.0.1";
  bool exited_ = false;
  int status_ = 0;
  std::string log_;
};

// `beluga serve FLAGS` as a child process.
ChildProcess beluga_serve(const std::vector<std::string>& flags, ChildOptions options = {});

}  // namespace beluga::testing
