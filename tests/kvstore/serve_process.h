// A `beluga serve` child process for the KV tier tests (demo model, CPU, one thread, a free port),
// killed with SIGKILL when the test has not ended it; and the few HTTP calls those tests make.
#pragma once

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../server/http_client.h"

namespace beluga::kv::testing {

inline std::string demo_model() {
  return std::string(BELUGA_SOURCE_DIR) + "/models/beluga-demo-coder-mtp";
}

class ServeProcess {
 public:
  // `fsize_limit` > 0: the child's RLIMIT_FSIZE (a file system that refuses large files).
  explicit ServeProcess(const std::vector<std::string>& extra, rlim_t fsize_limit = 0) {
    char tmpl[] = "/tmp/beluga_kvserve_XXXXXX";
    const int fd = ::mkstemp(tmpl);
    log_ = tmpl;
    std::vector<std::string> args = {BELUGA_BINARY, "serve",     "--model", demo_model(),    "--port",
                                     "0",           "--threads", "1",       "--kv-cache-mb", "16"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      if (fsize_limit > 0) {
        ::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead
        struct rlimit lim = {fsize_limit, fsize_limit};
        ::setrlimit(RLIMIT_FSIZE, &lim);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(fd);
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60) && port_ == 0 && alive()) {
      const std::string l = log();
      const size_t at = l.find("beluga serve: serving ");
      if (at != std::string::npos) {
        const size_t p = l.find("http://127.0.0.1:", at);
        if (p != std::string::npos) port_ = std::atoi(l.c_str() + p + 17);
      }
      if (port_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~ServeProcess() {
    kill9();
    ::unlink(log_.c_str());
  }
  ServeProcess(const ServeProcess&) = delete;
  ServeProcess& operator=(const ServeProcess&) = delete;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  // SIGKILL and reap (a zombie would still look alive to kill(pid, 0)).
  void kill9() {
    if (pid_ > 0 && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      exited_ = true;
    }
  }
  std::string log() const {
    std::ifstream f(log_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  bool alive() {
    if (exited_) return false;
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) == pid_) exited_ = true;
    return !exited_;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  bool exited_ = false;
  std::string log_;
};

// A greedy legacy completion of token ids; the reply's JSON (null on a transport failure).
inline nlohmann::json complete(int port, const std::vector<int>& prompt, int max_tokens,
                               const std::string& traffic_class = "") {
  nlohmann::json body = {{"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
  if (!traffic_class.empty()) body["traffic_class"] = traffic_class;
  const auto r = server::testing::http_post(port, "/v1/completions", body);
  if (r.status != 200) return nlohmann::json(nullptr);
  return r.json();
}

// The value of the sample of `name` whose labels contain every one of `labels` (e.g.
// "tier=\"disk\""), or -1 when there is none.
inline double sample(const std::string& page, const std::string& name,
                     const std::vector<std::string>& labels) {
  std::istringstream in(page);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0 ||
        (line.size() > name.size() && line[name.size()] != '{' && line[name.size()] != ' '))
      continue;
    bool all = true;
    for (const auto& l : labels) all = all && line.find(l) != std::string::npos;
    if (all) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

}  // namespace beluga::kv::testing
