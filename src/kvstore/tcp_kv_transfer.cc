#include "kvstore/tcp_kv_transfer.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "kvstore/block_file.h"
#include "kvstore/transfer_wire.h"

namespace beluga::kv {

namespace {

constexpr size_t kMaxIov = 128;                // below IOV_MAX (1024); two per block
constexpr size_t kRunBytes = size_t(1) << 20;  // payload bytes per sendmsg

std::string errno_text(int e) {
  return std::strerror(e);
}

// Waits until `fd` is ready for `events` or `ms` passes; false on timeout (errno ETIMEDOUT).
bool wait_fd(int fd, short events, int ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int r = ::poll(&p, 1, ms);
    if (r > 0) return true;
    if (r == 0) {
      errno = ETIMEDOUT;
      return false;
    }
    if (errno != EINTR) return false;
  }
}

int connect_to(const std::string& host, const std::string& port, int timeout_ms, std::string* err) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    *err = "resolving " + host + ": " + ::gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = res; a; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      if (wait_fd(fd, POLLOUT, timeout_ms)) {
        int so = 0;
        socklen_t len = sizeof(so);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &len);
        rc = so == 0 ? 0 : -1;
        errno = so;
      }
    }
    if (rc == 0) break;
    *err = "connecting to " + host + ":" + port + ": " + errno_text(errno);
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  if (fd >= 0) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

// Writes all of `iov[0..n)` (the vector is consumed), waiting at most `ms` for each bit of progress.
bool write_all(int fd, iovec* iov, int n, int ms, std::string* err) {
  while (n > 0) {
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = size_t(n);
    const ssize_t w = ::sendmsg(fd, &m, MSG_NOSIGNAL);  // a closed peer is an error, not SIGPIPE
    if (w < 0) {
      if (errno == EINTR) continue;
      if ((errno == EAGAIN || errno == EWOULDBLOCK) && wait_fd(fd, POLLOUT, ms)) continue;
      *err = "sending: " + errno_text(errno);
      return false;
    }
    size_t left = size_t(w);
    while (n > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --n;
    }
    if (n > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return true;
}

// Reads exactly `n` bytes; `eof` says whether the stream ended before the first of them.
bool read_all(int fd, unsigned char* p, size_t n, int ms, std::string* err, bool* eof) {
  size_t got = 0;
  *eof = false;
  while (got < n) {
    const ssize_t r = ::recv(fd, p + got, n - got, 0);
    if (r > 0) {
      got += size_t(r);
      continue;
    }
    if (r == 0) {
      *eof = got == 0;
      *err = "the receiver closed the connection";
      return false;
    }
    if (errno == EINTR) continue;
    if ((errno == EAGAIN || errno == EWOULDBLOCK) && wait_fd(fd, POLLIN, ms)) continue;
    *err = "reading the answer: " + errno_text(errno);
    return false;
  }
  return true;
}

}  // namespace

bool split_host_port(const std::string& s, std::string* host, std::string* port) {
  const size_t c = s.rfind(':');
  if (c == std::string::npos || c == 0 || c + 1 == s.size()) return false;
  *host = s.substr(0, c);
  *port = s.substr(c + 1);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']')
    *host = host->substr(1, host->size() - 2);
  for (char ch : *port)
    if (ch < '0' || ch > '9') return false;
  return port->size() <= 5 && std::stoi(*port) > 0 && std::stoi(*port) < 65536;
}

TcpKvTransfer::TcpKvTransfer(TcpTransferConfig cfg) : cfg_(std::move(cfg)) {}

TcpKvTransfer::~TcpKvTransfer() {
  for (auto& [dest, fd] : idle_) ::close(fd);
}

int TcpKvTransfer::take(const std::string& dest) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = idle_.find(dest);
  if (it == idle_.end()) return -1;
  const int fd = it->second;
  idle_.erase(it);
  return fd;
}

void TcpKvTransfer::keep(const std::string& dest, int fd) {
  std::lock_guard<std::mutex> lk(mu_);
  if (idle_.count(dest) >= size_t(std::max(4, 2 * cfg_.connections))) {
    ::close(fd);
    return;
  }
  idle_.emplace(dest, fd);
}

TransferResult TcpKvTransfer::send(const std::string& dest, const std::string& cls,
                                   std::span<const OutgoingBlock> blocks) {
  const auto t0 = std::chrono::steady_clock::now();
  TransferResult r;
  std::string host, port;
  if (!split_host_port(dest, &host, &port)) {
    r.error = "'" + dest + "' is not a host:port address";
  } else if (blocks.size() > kMaxBatchBlocks) {
    r.error = "too many blocks in one transfer";
  } else {
    const size_t total = blocks.size() * cfg_.block_bytes;
    const size_t stripes = std::clamp<size_t>(
        total / std::max<size_t>(cfg_.stripe_min_bytes, 1), 1,
        std::min<size_t>(size_t(std::max(cfg_.connections, 1)), std::max<size_t>(blocks.size(), 1)));
    if (stripes == 1) {
      r = send_stripe(dest, host, port, cls, blocks, take(dest));
    } else {
      // Each stripe's connection is taken before any starts: one stripe's, kept when it is done, is
      // not another's of the same transfer (the stripes run at once, not one after the other).
      std::vector<int> fds(stripes);
      for (int& fd : fds) fd = take(dest);
      std::vector<TransferResult> parts(stripes);
      const auto part = [&](size_t i) {
        const size_t b = i * blocks.size() / stripes, e = (i + 1) * blocks.size() / stripes;
        parts[i] = send_stripe(dest, host, port, cls, blocks.subspan(b, e - b), fds[i]);
      };
      std::vector<std::thread> threads;
      for (size_t i = 1; i < stripes; ++i) threads.emplace_back(part, i);
      part(0);
      for (auto& t : threads) t.join();
      r.ok = true;
      for (const TransferResult& p : parts) {
        r.accepted += p.accepted;
        r.bytes += p.bytes;
        if (!p.ok && r.ok) {
          r.ok = false;
          r.error = p.error;
        }
      }
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  counters_.transfers.fetch_add(1, std::memory_order_relaxed);
  if (!r.ok) counters_.failures.fetch_add(1, std::memory_order_relaxed);
  counters_.blocks.fetch_add(r.accepted, std::memory_order_relaxed);
  counters_.bytes.fetch_add(r.bytes, std::memory_order_relaxed);
  counters_.micros.fetch_add(int64_t(r.seconds * 1e6), std::memory_order_relaxed);
  return r;
}

TransferResult TcpKvTransfer::send_stripe(const std::string& dest, const std::string& host,
                                          const std::string& port, const std::string& cls,
                                          std::span<const OutgoingBlock> blocks, int fd) {
  TransferResult r;
  for (int tries = 0; tries < 2; ++tries, fd = -1) {
    const bool kept = fd >= 0;
    if (fd < 0) {
      fd = connect_to(host, port, cfg_.connect_timeout_ms, &r.error);
      if (fd < 0) break;
    }
    bool stale = false;
    r = send_on(fd, cls, blocks, &stale);
    if (r.ok) {
      keep(dest, fd);
      break;
    }
    ::close(fd);
    if (!(kept && stale)) break;  // a kept connection closed by the receiver meanwhile: once more, fresh
  }
  return r;
}

TransferResult TcpKvTransfer::send_on(int fd, const std::string& cls, std::span<const OutgoingBlock> blocks,
                                      bool* stale) {
  TransferResult r;
  const size_t n = blocks.size();
  std::vector<unsigned char> heads(kBatchHeaderBytes + n * kBlockFileHeaderBytes);
  encode_batch_header({uint32_t(n), cfg_.block_bytes}, heads.data());
  const int64_t now = int64_t(::time(nullptr));
  BlockFileHeader h;
  h.fingerprint = cfg_.fingerprint;
  h.cls = cls.substr(0, kBlockClassMax - 1);
  h.created = h.last_used = now;
  h.payload_bytes = cfg_.block_bytes;
  // The batch header goes with the first block, the rest in runs of about kRunBytes: each run's
  // checksums are computed just before it is sent, so the receiver reads (and verifies) one run while
  // the next is hashed, instead of waiting for the whole batch to be hashed first.
  iovec iov[kMaxIov + 1];
  int k = 0;
  iov[k++] = {heads.data(), kBatchHeaderBytes};
  const auto dead = [] { return errno == EPIPE || errno == ECONNRESET; };
  const size_t run =
      std::clamp<size_t>(kRunBytes / std::max<size_t>(cfg_.block_bytes, 1), 1, kMaxIov / 2 - 1);
  for (size_t i = 0; i < n; ++i) {
    unsigned char* head = heads.data() + kBatchHeaderBytes + i * kBlockFileHeaderBytes;
    h.key = blocks[i].key;
    encode_block_header(h, blocks[i].data, head);
    iov[k++] = {head, kBlockFileHeaderBytes};
    iov[k++] = {const_cast<std::byte*>(blocks[i].data), cfg_.block_bytes};
    if (size_t(k) / 2 >= run || i + 1 == n) {
      if (!write_all(fd, iov, k, cfg_.io_timeout_ms, &r.error)) {
        *stale = dead();
        return r;
      }
      k = 0;
    }
  }
  if (k > 0 && !write_all(fd, iov, k, cfg_.io_timeout_ms, &r.error)) {  // an empty batch: the header alone
    *stale = dead();
    return r;
  }
  unsigned char ans[kAnswerBytes];
  bool eof = false;
  if (!read_all(fd, ans, kAnswerBytes, cfg_.io_timeout_ms, &r.error, &eof)) {
    *stale = eof || dead();
    return r;
  }
  Answer a;
  if (!decode_answer(ans, &a)) {
    r.error = "the receiver's answer is malformed";
    return r;
  }
  r.accepted = int(a.accepted);
  r.bytes = int64_t(n * cfg_.block_bytes);
  if (a.status != TransferStatus::kOk) {
    r.error = std::string("the receiver refused the blocks: ") + transfer_status_name(a.status);
    return r;
  }
  r.ok = true;
  return r;
}

}  // namespace beluga::kv
