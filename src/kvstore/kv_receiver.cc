#include "kvstore/kv_receiver.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <optional>
#include <vector>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange

#include <xxhash.h>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>

#include "kvstore/block_file.h"
#include "kvstore/transfer_wire.h"
#include "util/error.h"

namespace beluga::kv {

namespace net = boost::asio;
namespace beast = boost::beast;
using tcp = net::ip::tcp;

struct KvReceiver::Impl {
  Impl(ReceiverConfig c, TieredStore& s) : cfg(std::move(c)), store(s) {}

  const ReceiverConfig cfg;
  TieredStore& store;
  ReceiverCounters counters;
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;
  int port = 0;

  void accept();
};

namespace {

constexpr size_t kPieceBytes = size_t(1) << 20;  // hashed while still in the cache (a core's L2)

// One sender's connection: batch header, then per block its header and payload, then the answer.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket&& s, KvReceiver::Impl& r) : r_(r), stream_(std::move(s)) {
    r_.counters.connections.fetch_add(1, std::memory_order_relaxed);
  }
  ~Connection() {
    end_slot(false);
    r_.counters.connections.fetch_sub(1, std::memory_order_relaxed);
  }

  void start() { read_batch(); }

 private:
  void read_batch() {
    stream_.expires_never();  // between batches a kept connection may sit idle
    net::async_read(stream_, net::buffer(head_.data(), kBatchHeaderBytes),
                    [self = shared_from_this()](beast::error_code ec, size_t) {
                      if (ec) return;  // the sender is done (or gone) between batches
                      self->on_batch();
                    });
  }

  void on_batch() {
    BatchHeader h;
    if (!decode_batch_header(head_.data(), &h) || h.blocks > kMaxBatchBlocks)
      return refuse(TransferStatus::kBadBatch);
    if (h.block_bytes != r_.cfg.block_bytes) return refuse(TransferStatus::kBlockSize);
    left_ = h.blocks;
    accepted_ = 0;
    next_block();
  }

  void next_block() {
    if (left_ == 0) return answer(TransferStatus::kOk, true);
    stream_.expires_after(std::chrono::milliseconds(r_.cfg.io_timeout_ms));
    net::async_read(stream_, net::buffer(head_.data(), kBlockFileHeaderBytes),
                    [self = shared_from_this()](beast::error_code ec, size_t) {
                      if (ec) return self->cut_short();
                      self->on_block_header();
                    });
  }

  void on_block_header() {
    bool foreign = false;
    if (!decode_block_header(head_.data(), &block_, &sum_, &foreign))
      return refuse(foreign ? TransferStatus::kForeign : TransferStatus::kCorrupt);
    if (block_.fingerprint != r_.cfg.fingerprint) return refuse(TransferStatus::kForeign);
    if (block_.payload_bytes != r_.cfg.block_bytes) return refuse(TransferStatus::kBlockSize);
    slot_ = r_.store.begin_import(block_.key, block_.cls);
    std::byte* dst = slot_.dst;
    if (!dst) {  // held already, or no room: the bytes are read and dropped
      if (scratch_.empty()) scratch_.resize(r_.cfg.block_bytes);
      dst = scratch_.data();
    }
    dst_ = dst;
    got_ = 0;
    XXH3_64bits_reset(sum_state_.get());
    read_payload();
  }

  // The payload in pieces, each hashed as soon as it is read (while it is still in this core's cache)
  // instead of in a second pass over the whole block from memory.
  void read_payload() {
    const size_t piece = std::min(kPieceBytes, r_.cfg.block_bytes - got_);
    stream_.async_read_some(net::buffer(dst_ + got_, piece),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              if (ec) return self->cut_short();
                              XXH3_64bits_update(self->sum_state_.get(), self->dst_ + self->got_, n);
                              self->got_ += n;
                              if (self->got_ < self->r_.cfg.block_bytes) return self->read_payload();
                              self->on_payload();
                            });
  }

  void on_payload() {
    r_.counters.bytes.fetch_add(int64_t(r_.cfg.block_bytes), std::memory_order_relaxed);
    if (XXH3_64bits_digest(sum_state_.get()) != sum_) return refuse(TransferStatus::kCorrupt);
    if (slot_.dst || slot_.held) {
      ++accepted_;
      r_.counters.blocks.fetch_add(1, std::memory_order_relaxed);
    } else {
      r_.counters.no_room.fetch_add(1, std::memory_order_relaxed);
    }
    end_slot(true);
    --left_;
    next_block();
  }

  void end_slot(bool ok) {
    if (slot_.dst) r_.store.end_import(slot_.slot, ok);
    slot_ = {};
  }

  // The stream broke off inside a batch: nothing to answer.
  void cut_short() {
    end_slot(false);
    r_.counters.refused.fetch_add(1, std::memory_order_relaxed);
  }

  void refuse(TransferStatus why) {
    end_slot(false);
    r_.counters.refused.fetch_add(1, std::memory_order_relaxed);
    answer(why, false);
  }

  void answer(TransferStatus st, bool go_on) {
    if (go_on) r_.counters.batches.fetch_add(1, std::memory_order_relaxed);
    encode_answer({accepted_, st}, answer_.data());
    stream_.expires_after(std::chrono::milliseconds(r_.cfg.io_timeout_ms));
    net::async_write(stream_, net::buffer(answer_.data(), kAnswerBytes),
                     [self = shared_from_this(), go_on](beast::error_code ec, size_t) {
                       if (ec || !go_on) {
                         beast::error_code ignored;
                         self->stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
                         return;
                       }
                       self->read_batch();
                     });
  }

  KvReceiver::Impl& r_;
  beast::tcp_stream stream_;
  std::array<unsigned char, kBlockFileHeaderBytes> head_{};
  std::array<unsigned char, kAnswerBytes> answer_{};
  BlockFileHeader block_;
  uint64_t sum_ = 0;
  uint32_t left_ = 0, accepted_ = 0;
  TieredStore::ImportSlot slot_;
  std::byte* dst_ = nullptr;
  size_t got_ = 0;  // of the payload
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> sum_state_{XXH3_createState(), &XXH3_freeState};
  std::vector<std::byte> scratch_;
};

static_assert(kBlockFileHeaderBytes >= kBatchHeaderBytes);

}  // namespace

void KvReceiver::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket s) {
    if (ec == net::error::operation_aborted) return;
    if (!ec) {
      if (counters.connections.load(std::memory_order_relaxed) >= cfg.max_connections) {
        beast::error_code ignored;
        s.close(ignored);
      } else {
        beast::error_code ignored;
        s.set_option(tcp::no_delay(true), ignored);
        std::make_shared<Connection>(std::move(s), *this)->start();
      }
    }
    accept();
  });
}

KvReceiver::KvReceiver(ReceiverConfig cfg, TieredStore& store)
    : impl_(std::make_shared<Impl>(std::move(cfg), store)) {
  BELUGA_CHECK(impl_->cfg.block_bytes == store.block_bytes(), "the receiver's block size is not the store's");
  Impl& m = *impl_;
  beast::error_code ec;
  const auto addr = net::ip::make_address(m.cfg.host, ec);
  BELUGA_CHECK(!ec, "--kv-listen: '" + m.cfg.host + "' is not an IP address");
  const tcp::endpoint ep(addr, uint16_t(m.cfg.port));
  m.acceptor.open(ep.protocol(), ec);
  if (!ec) m.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) m.acceptor.bind(ep, ec);
  if (!ec) m.acceptor.listen(net::socket_base::max_listen_connections, ec);
  BELUGA_CHECK(!ec, "cannot listen for KV transfers on " + m.cfg.host + ":" + std::to_string(m.cfg.port) +
                        ": " + ec.message());
  m.port = m.acceptor.local_endpoint().port();
  m.accept();
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 0; i < std::clamp(m.cfg.threads, 1, hw); ++i) m.threads.emplace_back([&m] { m.ioc.run(); });
}

KvReceiver::~KvReceiver() {
  impl_->ioc.stop();  // the connections' handlers are destroyed with the io_context (after the joins)
  for (auto& t : impl_->threads) t.join();
}

int KvReceiver::port() const {
  return impl_->port;
}

std::string KvReceiver::address() const {
  const std::string& h = impl_->cfg.host;
  return (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" + std::to_string(impl_->port);
}

const ReceiverCounters& KvReceiver::counters() const {
  return impl_->counters;
}

}  // namespace beluga::kv
