// KvReceiver: the decode engine's end of TCP KV transfers (tcp_kv_transfer.h sends). Listens on
// host:port (port 0: a free one) with its own I/O threads (connections are served at once, each
// on one thread at a time: a sender striping a transfer over several connections uses several cores
// here, one per connection, for the copy out of the socket and the checksum); each connection's batches are
// verified block by block (model fingerprint, block size, both checksums) and read straight into host slots
// of the store (TieredStore::begin_import), where the decode engine's scheduler finds them as a cached
// prefix. A malformed, foreign or corrupt stream is answered with its status and closed; the blocks before it
// stay (each one verified). At most max_connections at once (more are closed at accept); a connection silent
// for io_timeout_ms mid-batch is dropped.
//
// Trust: any peer that can connect can store blocks under any key. Listen on loopback (the default)
// or a network only the engines share, as with vLLM's and Mooncake's KV transfer ports.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "kvstore/tiered_store.h"

namespace beluga::kv {

struct ReceiverConfig {
  std::string host = "127.0.0.1";
  int port = 0;
  BlockHash fingerprint;  // of the store's model
  size_t block_bytes = 0;
  int max_connections = 64;
  int io_timeout_ms = 30000;
  int threads = 4;  // I/O threads (at most the machine's cores)
};

struct ReceiverCounters {
  std::atomic<int64_t> batches{0};      // answered ok
  std::atomic<int64_t> blocks{0};       // stored (or held already)
  std::atomic<int64_t> bytes{0};        // payload bytes received
  std::atomic<int64_t> refused{0};      // batches refused (malformed, foreign, corrupt, cut short)
  std::atomic<int64_t> no_room{0};      // blocks dropped: every host slot was pinned
  std::atomic<int64_t> connections{0};  // open now
};

class KvReceiver {
 public:
  // Binds and starts listening (throws beluga::Error when the address is taken).
  KvReceiver(ReceiverConfig cfg, TieredStore& store);
  ~KvReceiver();  // stops: closes every connection and joins the I/O threads
  KvReceiver(const KvReceiver&) = delete;
  KvReceiver& operator=(const KvReceiver&) = delete;

  int port() const;
  // "host:port" as peers reach it (a wildcard host is reported as given).
  std::string address() const;
  const ReceiverCounters& counters() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace beluga::kv
