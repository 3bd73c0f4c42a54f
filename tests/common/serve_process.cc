#include "serve_process.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace beluga::testing {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int free_port() {
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

std::string demo_model() {
  return std::string(BELUGA_SOURCE_DIR) + "/models/beluga-demo-coder-mtp";
}

std::vector<std::string> serve_flags(const std::string& model, int kv_cache_mb,
                                     const std::vector<std::string>& extra, int port) {
  std::vector<std::string> flags = {"--model",   model, "--port",        std::to_string(port),
                                    "--threads", "1",   "--kv-cache-mb", std::to_string(kv_cache_mb)};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return flags;
}

std::vector<std::string> beluga_args(const std::string& subcommand, const std::vector<std::string>& flags) {
  std::vector<std::string> args = {BELUGA_BINARY, subcommand};
  args.insert(args.end(), flags.begin(), flags.end());
  return args;
}

namespace {

// This process's environment with `overrides` ("NAME=VALUE") set or replacing what it had.
std::vector<std::string> child_environment(const std::vector<std::string>& overrides) {
  std::vector<std::string> env;
  auto overridden = [&](const std::string& kv) {
    for (const auto& o : overrides) {
      const size_t name_end = o.find('=') + 1;  // the name and its '='
      if (kv.compare(0, name_end, o, 0, name_end) == 0) return true;
    }
    return false;
  };
  for (char** e = environ; *e != nullptr; ++e)
    if (!overridden(*e)) env.emplace_back(*e);
  env.insert(env.end(), overrides.begin(), overrides.end());
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> p;
  for (auto& s : strings) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

}  // namespace

ChildProcess::ChildProcess(std::vector<std::string> args, ChildOptions options) {
  char tmpl[] = "/tmp/beluga_test_child_XXXXXX";
  const int fd = mkstemp(tmpl);
  log_ = tmpl;
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> env = child_environment(options.env);
  const std::vector<char*> argv = pointers(args), envp = pointers(env);
  const rlimit lim = {options.fsize_limit, options.fsize_limit};
  pid_ = fork();
  if (pid_ == 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    if (options.fsize_limit > 0) {
      signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead
      setrlimit(RLIMIT_FSIZE, &lim);
    }
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  close(fd);
  const auto t0 = Clock::now();
  while (seconds_since(t0) < double(options.ready_timeout.count()) && port_ == 0 && alive()) {
    const std::string l = log();
    const size_t at = l.find(options.ready_marker);
    if (at != std::string::npos) {
      // "http://HOST:PORT", read once the port's digits are followed by something (a whole line).
      const size_t h = l.find("http://", at);
      const size_t colon = h == std::string::npos ? h : l.find(':', h + 7);
      size_t end = colon == std::string::npos ? colon : colon + 1;
      while (end < l.size() && std::isdigit(static_cast<unsigned char>(l[end]))) ++end;
      if (end != std::string::npos && end < l.size() && end > colon + 1) {
        host_ = l.substr(h + 7, colon - h - 7);
        port_ = std::atoi(l.c_str() + colon + 1);
      }
    }
    if (port_ == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

ChildProcess::~ChildProcess() {
  kill_now();
  unlink(log_.c_str());
}

std::string ChildProcess::log() const {
  std::ifstream f(log_);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool ChildProcess::alive() {
  if (exited_ || pid_ <= 0) return false;
  if (waitpid(pid_, &status_, WNOHANG) == pid_) exited_ = true;
  return !exited_;
}

void ChildProcess::kill_now() {
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &status_, 0);
    exited_ = true;
  }
}

int ChildProcess::wait_exit(std::chrono::seconds limit) {
  const auto t0 = Clock::now();
  while (alive() && seconds_since(t0) < double(limit.count()))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  if (!exited_) return -1;
  return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1;
}

int ChildProcess::terminate(std::chrono::seconds limit) {
  if (exited_) return -1;
  kill(pid_, SIGTERM);
  return wait_exit(limit);
}

ChildProcess beluga_serve(const std::vector<std::string>& flags, ChildOptions options) {
  return ChildProcess(beluga_args("serve", flags), std::move(options));
}

}  // namespace beluga::testing
