// TcpKvTransfer: KvTransfer over TCP, in transfer_wire.h's format. A large transfer is split into
// contiguous stripes, each its own batch on its own connection, sent at once from their own threads:
// one connection is bound by one core on each end (the sender hashes, the receiver copies out of the
// socket and verifies), so stripes over several connections use several (the receiver serves its
// connections on several threads). Connections are kept open between transfers (a stripe takes one,
// so concurrent transfers each use their own); a kept connection the receiver has closed meanwhile is
// replaced once. The payload goes to the socket straight from the caller's memory (gathered writes,
// no copy); every block carries its checksums. A transfer is ok when every stripe is; the blocks of
// the stripes that did arrive stay (the decode side recomputes what did not). Thread-safe.
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
  int io_timeout_ms = 30000;                  // a send or the answer stalling this long fails the transfer
  int connections = 4;                        // stripes of one transfer, at most
  size_t stripe_min_bytes = size_t(8) << 20;  // below this a stripe is not worth a connection
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
  TransferResult send_stripe(const std::string& dest, const std::string& host, const std::string& port,
                             const std::string& cls, std::span<const OutgoingBlock> blocks,
                             int fd);  // a kept connection to use first, or -1
  int take(const std::string& dest);   // a kept connection's descriptor, or -1
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
