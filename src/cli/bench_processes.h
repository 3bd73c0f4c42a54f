// Child processes for the fleet benchmark: this binary (`beluga serve`, `beluga router`) run with
// its output to a log file, ready once the log shows its "… http://HOST:PORT" line (the port it
// bound, so port 0 works). A process is killed (SIGKILL) when its object goes away.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace beluga::cli {

class BenchProcess {
 public:
  // Runs this executable with `args` (its subcommand first); waits up to `timeout_s` for a log line
  // holding `ready_marker` and then "http://127.0.0.1:PORT". Throws, with the log's tail, if the
  // process exits or the time runs out first.
  // `cpus`: the cores it may run on (sched_setaffinity, as `taskset`); empty: any.
  BenchProcess(const std::vector<std::string>& args, const std::string& ready_marker, double timeout_s = 120,
               const std::vector<int>& cpus = {});
  ~BenchProcess();
  BenchProcess(const BenchProcess&) = delete;
  BenchProcess& operator=(const BenchProcess&) = delete;

  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string log() const;
  // SIGTERM, and up to `limit_s` for it to exit (then SIGKILL).
  void stop(double limit_s = 20);

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string log_path_;
};

}  // namespace beluga::cli
