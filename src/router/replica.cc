#include "router/replica.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "util/error.h"

namespace beluga::router {

namespace {
constexpr size_t kMaxIdle = 256;
}

ReplicaAddress parse_replica_url(std::string_view url) {
  std::string_view u = url;
  BELUGA_CHECK(!u.starts_with("https://"), "--replica ", url, ": https is not supported (plain http only)");
  if (u.starts_with("http://")) u.remove_prefix(7);
  if (size_t slash = u.find('/'); slash != std::string_view::npos) u = u.substr(0, slash);
  const size_t colon = u.rfind(':');
  BELUGA_CHECK(colon != std::string_view::npos && colon > 0 && colon + 1 < u.size(), "--replica ", url,
               ": expected http://HOST:PORT");
  ReplicaAddress a;
  a.host = std::string(u.substr(0, colon));
  a.port = std::string(u.substr(colon + 1));
  char* end = nullptr;
  const long port = std::strtol(a.port.c_str(), &end, 10);
  BELUGA_CHECK(*end == '\0' && port > 0 && port < 65536, "--replica ", url, ": bad port '", a.port, "'");
  a.url = "http://" + a.host + ":" + a.port;
  return a;
}

Replica::Replica(int id, ReplicaAddress address, int eject_after, ReplicaRole role)
    : id_(id), address_(std::move(address)), role_(role), breaker_(eject_after) {}

std::string Replica::kv_address() const {
  std::lock_guard lock(kv_mu_);
  return kv_address_;
}

void Replica::set_kv_address(std::string a) {
  std::lock_guard lock(kv_mu_);
  kv_address_ = std::move(a);
}

Replica::~Replica() {
  drop_idle();
}

int Replica::take_idle() {
  for (;;) {
    int fd = -1;
    {
      std::lock_guard lock(mu_);
      if (idle_.empty()) return -1;
      fd = idle_.back();
      idle_.pop_back();
    }
    // A connection the replica closed meanwhile reads as EOF (or an error) without blocking.
    char c;
    const ssize_t n = ::recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return fd;
    ::close(fd);
  }
}

void Replica::put_idle(int fd) {
  {
    std::lock_guard lock(mu_);
    if (idle_.size() < kMaxIdle) {
      idle_.push_back(fd);
      return;
    }
  }
  ::close(fd);
}

void Replica::drop_idle() {
  std::vector<int> fds;
  {
    std::lock_guard lock(mu_);
    fds.swap(idle_);
  }
  for (int fd : fds) ::close(fd);
}

}  // namespace beluga::router
