// TcpKvTransfer: KvTransfer over TCP (Asio), in transfer_wire.h's format. One connection per
// destination is kept open between transfers (a transfer takes it, so concurrent transfers to one
// destination each use their own); a kept connection the receiver has closed meanwhile is replaced
// once. The payload goes to the socket straight from the caller's memory (gathered writes, no copy);
// every block carries its checksums. Thread-safe.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "kvstore/kv_transfer.h"

namespace beluga::kv {

struct TcpTransferConfig {
  BlockHash fingerprint;  // the model's (fingerprint.h): the receiver refuses another model's blocks
  size_t block_bytes = 0;
  int connect_timeout_ms = 2000;
  int io_timeout_ms = 30000;  // a send or the answer stalling this long fails the transfer
};

struct TransferCounters {
  std::atomic<int64_t> transfers{0}, failures{0}, blocks{0}, bytes{0};
  std::atomic<int64_t> micros{0};  // total time of the transfers
};

class TcpKvTransfer final : public KvTransfer {
 public:
  explicit TcpKvTransfer(TcpTransferConfig cfg);
  ~TcpKvTransfer() override;

  TransferResult send(const std::string& dest, const std::string& cls,
                      std::span<const OutgoingBlock> blocks) override;
  const TransferCounters& counters() const { return counters_; }

 private:
  int take(const std::string& dest);  // a kept connection's descriptor, or -1
  void keep(const std::string& dest, int fd);
  TransferResult send_on(int fd, const std::string& cls, std::span<const OutgoingBlock> blocks, bool* stale);

  const TcpTransferConfig cfg_;
  std::mutex mu_;
  std::multimap<std::string, int> idle_;
  TransferCounters counters_;
};

// "host:port" split at its last ':' (a bracketed IPv6 host loses its brackets); false when malformed.
bool split_host_port(const std::string& s, std::string* host, std::string* port);

}  // namespace beluga::kv
