// Prefill -> decode KV transfer over loopback TCP: TcpKvTransfer sends a store's host blocks,
// KvReceiver verifies them and stores them in another store, bit-exact; foreign, corrupt, malformed
// and cut-short streams are refused without storing a bad block or leaking a host slot, and the
// receiver keeps serving.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "kv_test_support.h"
#include "kvstore/block_file.h"
#include "kvstore/kv_receiver.h"
#include "kvstore/tcp_kv_transfer.h"
#include "kvstore/tiered_store.h"
#include "kvstore/transfer_wire.h"

namespace beluga::kv {
namespace {

constexpr size_t kBlock = 4096 + 24;  // not a power of two: offsets are exercised
const BlockHash kModel{0x1234, 0x5678};

using testing::xor_key;

std::unique_ptr<TieredStore> make_store(int blocks) {
  StoreConfig c;
  c.block_bytes = kBlock;
  c.fingerprint = kModel;
  c.host_bytes = size_t(blocks) * kBlock;
  return std::make_unique<TieredStore>(std::move(c));
}

// Block i's bytes: a pattern of its own.
std::vector<std::byte> block_pattern(uint64_t i) {
  std::vector<std::byte> b(kBlock);
  for (size_t j = 0; j < kBlock; ++j) b[j] = std::byte((i * 131 + j * 7) & 0xff);
  return b;
}

void put(TieredStore& s, uint64_t i) {
  auto slot = s.begin_import(xor_key(i), "chat");
  ASSERT_NE(slot.dst, nullptr);
  const auto p = block_pattern(i);
  std::memcpy(slot.dst, p.data(), kBlock);
  s.end_import(slot.slot, true);
}

// How many leading blocks 0..n-1 `s` holds with exactly their pattern.
int held_exact(TieredStore& s, int n) {
  std::vector<BlockHash> keys;
  for (int i = 0; i < n; ++i) keys.push_back(xor_key(uint64_t(i)));
  auto pinned = s.pin_host_blocks(keys.data(), n);
  for (int i = 0; i < pinned.size(); ++i) {
    const auto p = block_pattern(uint64_t(i));
    if (std::memcmp(pinned.data(i), p.data(), kBlock) != 0) return -1;
  }
  return pinned.size();
}

struct Pair {
  std::unique_ptr<TieredStore> from = make_store(64), to = make_store(64);
  std::unique_ptr<KvReceiver> rx;
  std::unique_ptr<TcpKvTransfer> tx;
  Pair() {
    ReceiverConfig rc;
    rc.fingerprint = kModel;
    rc.block_bytes = kBlock;
    rc.io_timeout_ms = 2000;
    rc.max_connections = 4;
    rx = std::make_unique<KvReceiver>(rc, *to);
    TcpTransferConfig tc;
    tc.fingerprint = kModel;
    tc.block_bytes = kBlock;
    tc.io_timeout_ms = 5000;
    tx = std::make_unique<TcpKvTransfer>(tc);
  }
  TransferResult send_leading(int n) {
    std::vector<BlockHash> keys;
    for (int i = 0; i < n; ++i) keys.push_back(xor_key(uint64_t(i)));
    auto pinned = from->pin_host_blocks(keys.data(), n);
    std::vector<OutgoingBlock> out;
    for (int i = 0; i < pinned.size(); ++i) out.push_back({keys[size_t(i)], pinned.data(i)});
    return tx->send(rx->address(), "agent", out);
  }
};

// A raw client: connects to the receiver and writes what a test builds.
int raw_connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

void write_bytes(int fd, const void* p, size_t n) {
  ASSERT_EQ(::send(fd, p, n, MSG_NOSIGNAL), ssize_t(n));
}

// Reads the receiver's answer; false when the connection closed without one.
bool read_answer(int fd, Answer* a) {
  unsigned char buf[kAnswerBytes];
  size_t got = 0;
  while (got < kAnswerBytes) {
    const ssize_t r = ::recv(fd, buf + got, kAnswerBytes - got, 0);
    if (r <= 0) return false;
    got += size_t(r);
  }
  return decode_answer(buf, a);
}

std::vector<unsigned char> framed(uint64_t i, const BlockHash& model, bool corrupt_payload) {
  std::vector<unsigned char> f(kBlockFileHeaderBytes + kBlock);
  auto p = block_pattern(i);
  BlockFileHeader h;
  h.fingerprint = model;
  h.key = xor_key(i);
  h.cls = "chat";
  h.payload_bytes = kBlock;
  encode_block_header(h, p.data(), f.data());
  if (corrupt_payload) p[100] ^= std::byte(1);
  std::memcpy(f.data() + kBlockFileHeaderBytes, p.data(), kBlock);
  return f;
}

std::vector<unsigned char> batch_head(uint32_t blocks, uint64_t block_bytes) {
  std::vector<unsigned char> b(kBatchHeaderBytes);
  encode_batch_header({blocks, block_bytes}, b.data());
  return b;
}

// The receiver's store must end up with exactly `blocks` entries and no slot still pinned or
// reserved: every slot but those can take a new block.
void expect_no_leaked_slots(TieredStore& s, int capacity, int blocks) {
  EXPECT_EQ(s.stats().host.blocks, blocks);
  for (int i = 0; i < capacity; ++i) {
    auto slot = s.begin_import(xor_key(uint64_t(1000 + i)), "chat");
    ASSERT_NE(slot.dst, nullptr) << "slot " << i << " of " << capacity << " is still held";
    s.end_import(slot.slot, false);
  }
}

void wait_for(const std::function<bool()>& cond) {
  for (int i = 0; i < 2000 && !cond(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

TEST(KvTransfer, DeliversBlocksBitExactAndReusesItsConnection) {
  Pair p;
  for (uint64_t i = 0; i < 40; ++i) put(*p.from, i);
  TransferResult r = p.send_leading(40);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.accepted, 40);
  EXPECT_EQ(r.bytes, int64_t(40 * kBlock));
  EXPECT_EQ(held_exact(*p.to, 40), 40);
  EXPECT_EQ(p.rx->counters().blocks.load(), 40);
  // Again: the blocks are held already (accepted, not stored twice), over the kept connection.
  r = p.send_leading(40);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.accepted, 40);
  EXPECT_EQ(p.to->stats().host.blocks, 40);
  EXPECT_EQ(p.rx->counters().connections.load(), 1);
  EXPECT_EQ(p.rx->counters().batches.load(), 2);
  // An empty transfer is a valid batch.
  r = p.send_leading(0);
  EXPECT_TRUE(r.ok) << r.error;
}

// A transfer large enough for stripes goes over several connections at once, each its own batch;
// every block arrives exactly once, and the connections are kept for the next transfer.
TEST(KvTransfer, StripesGoOverSeveralConnectionsAndDeliverEveryBlock) {
  Pair p;
  TcpTransferConfig tc;
  tc.fingerprint = kModel;
  tc.block_bytes = kBlock;
  tc.connections = 4;
  tc.stripe_min_bytes = 1;  // every block would be worth a stripe: the connection count decides
  p.tx = std::make_unique<TcpKvTransfer>(tc);
  for (uint64_t i = 0; i < 41; ++i) put(*p.from, i);  // not a multiple of 4: uneven stripes
  TransferResult r = p.send_leading(41);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.accepted, 41);
  EXPECT_EQ(r.bytes, int64_t(41 * kBlock));
  EXPECT_EQ(held_exact(*p.to, 41), 41);
  EXPECT_EQ(p.rx->counters().batches.load(), 4);
  EXPECT_EQ(p.rx->counters().blocks.load(), 41);
  EXPECT_EQ(p.rx->counters().connections.load(), 4);
  // Again, over the kept connections; fewer blocks than connections: a stripe each, no empty one.
  r = p.send_leading(3);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.accepted, 3);
  EXPECT_EQ(p.rx->counters().batches.load(), 7);
  EXPECT_EQ(p.rx->counters().connections.load(), 4);
  EXPECT_EQ(p.tx->counters().transfers.load(), 2);
  expect_no_leaked_slots(*p.to, 64 - 41, 41);
}

// A stripe the receiver turns away (here: over its connection limit) fails the transfer; the
// blocks of the stripes that arrived are stored, counted in `accepted`, and nothing leaks.
TEST(KvTransfer, ARefusedStripeFailsTheTransferAndLeaksNothing) {
  Pair p;
  p.rx.reset();
  ReceiverConfig rc;
  rc.fingerprint = kModel;
  rc.block_bytes = kBlock;
  rc.max_connections = 2;  // and the sender keeps each connection open: two stripes of four get in
  p.rx = std::make_unique<KvReceiver>(rc, *p.to);
  TcpTransferConfig tc;
  tc.fingerprint = kModel;
  tc.block_bytes = kBlock;
  tc.connections = 4;
  tc.stripe_min_bytes = 1;
  tc.io_timeout_ms = 5000;
  p.tx = std::make_unique<TcpKvTransfer>(tc);
  for (uint64_t i = 0; i < 40; ++i) put(*p.from, i);
  const TransferResult r = p.send_leading(40);
  EXPECT_FALSE(r.ok);
  EXPECT_FALSE(r.error.empty());
  EXPECT_EQ(r.accepted, 20);  // two stripes of ten
  EXPECT_EQ(p.tx->counters().failures.load(), 1);
  wait_for([&] { return p.rx->counters().connections.load() == 2; });
  EXPECT_EQ(p.rx->counters().blocks.load(), 20);
  expect_no_leaked_slots(*p.to, 64 - 20, 20);
}

// The receiver hashes a payload piece by piece as it arrives: a block of several pieces is stored
// bit-exact, and one byte flipped in its last piece is still caught (the block before it stays).
TEST(KvTransfer, ABlockOfSeveralPiecesIsVerifiedAcrossThem) {
  constexpr size_t kBig = (size_t(5) << 19) + 24;  // 2.5 MiB and a bit: three pieces of 1 MiB
  StoreConfig c;
  c.block_bytes = kBig;
  c.fingerprint = kModel;
  c.host_bytes = 4 * kBig;
  TieredStore to(c);
  ReceiverConfig rc;
  rc.fingerprint = kModel;
  rc.block_bytes = kBig;
  rc.io_timeout_ms = 5000;
  KvReceiver rx(rc, to);
  std::vector<std::vector<unsigned char>> framed_blocks;
  for (uint64_t i = 0; i < 2; ++i) {
    std::vector<std::byte> payload(kBig);
    for (size_t j = 0; j < kBig; ++j) payload[j] = std::byte((i * 31 + j * 13 + (j >> 20)) & 0xff);
    std::vector<unsigned char> f(kBlockFileHeaderBytes + kBig);
    BlockFileHeader h;
    h.fingerprint = kModel;
    h.key = xor_key(i);
    h.cls = "chat";
    h.payload_bytes = kBig;
    encode_block_header(h, payload.data(), f.data());
    if (i == 1) payload[kBig - 1] ^= std::byte(0x40);  // in the last piece
    std::memcpy(f.data() + kBlockFileHeaderBytes, payload.data(), kBig);
    framed_blocks.push_back(std::move(f));
  }
  const int fd = raw_connect(rx.port());
  auto head = batch_head(3, kBig);
  write_bytes(fd, head.data(), head.size());
  std::thread writer([&] {  // larger than the socket buffers: written while the receiver reads
    for (const auto& f : framed_blocks)
      for (size_t off = 0; off < f.size();) {
        const ssize_t w = ::send(fd, f.data() + off, f.size() - off, MSG_NOSIGNAL);
        if (w <= 0) return;
        off += size_t(w);
      }
  });
  Answer a;
  const bool answered = read_answer(fd, &a);
  writer.join();
  ::close(fd);
  ASSERT_TRUE(answered);
  EXPECT_EQ(a.status, TransferStatus::kCorrupt);
  EXPECT_EQ(a.accepted, 1u);
  const BlockHash k0 = xor_key(0);
  auto pinned = to.pin_host_blocks(&k0, 1);
  ASSERT_EQ(pinned.size(), 1);
  EXPECT_EQ(std::memcmp(pinned.data(0), framed_blocks[0].data() + kBlockFileHeaderBytes, kBig), 0);
  wait_for([&] { return rx.counters().connections.load() == 0; });
  EXPECT_EQ(to.stats().host.blocks, 1);
}

TEST(KvTransfer, AnotherModelsBlocksAreRefused) {
  Pair p;
  for (uint64_t i = 0; i < 4; ++i) put(*p.from, i);
  TcpTransferConfig tc;
  tc.fingerprint = {0x9999, 0x1};
  tc.block_bytes = kBlock;
  TcpKvTransfer other(tc);
  std::vector<BlockHash> keys{xor_key(0), xor_key(1), xor_key(2), xor_key(3)};
  auto pinned = p.from->pin_host_blocks(keys.data(), 4);
  std::vector<OutgoingBlock> out;
  for (int i = 0; i < pinned.size(); ++i) out.push_back({keys[size_t(i)], pinned.data(i)});
  const TransferResult r = other.send(p.rx->address(), "chat", out);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("foreign"), std::string::npos) << r.error;
  EXPECT_EQ(r.accepted, 0);
  EXPECT_EQ(p.to->stats().host.blocks, 0);
  // Another block size.
  tc.fingerprint = kModel;
  tc.block_bytes = kBlock / 2;
  TcpKvTransfer half(tc);
  const TransferResult r2 = half.send(p.rx->address(), "chat", out);
  EXPECT_FALSE(r2.ok);
  EXPECT_NE(r2.error.find("block_size"), std::string::npos) << r2.error;
  // The receiver still serves a good sender.
  const TransferResult ok = p.send_leading(4);
  EXPECT_TRUE(ok.ok) << ok.error;
  EXPECT_EQ(held_exact(*p.to, 4), 4);
}

TEST(KvTransfer, ACorruptBlockEndsTheBatchAndTheBlocksBeforeItStay) {
  Pair p;
  const int fd = raw_connect(p.rx->port());
  auto head = batch_head(3, kBlock);
  write_bytes(fd, head.data(), head.size());
  auto b0 = framed(0, kModel, false), b1 = framed(1, kModel, true), b2 = framed(2, kModel, false);
  write_bytes(fd, b0.data(), b0.size());
  write_bytes(fd, b1.data(), b1.size());
  Answer a;
  ASSERT_TRUE(read_answer(fd, &a));
  EXPECT_EQ(a.status, TransferStatus::kCorrupt);
  EXPECT_EQ(a.accepted, 1u);
  ::close(fd);
  EXPECT_EQ(held_exact(*p.to, 3), 1);  // block 0 only, exact
  wait_for([&] { return p.rx->counters().refused.load() >= 1 && p.rx->counters().connections.load() == 0; });
  expect_no_leaked_slots(*p.to, 64 - 1, 1);
}

TEST(KvTransfer, GarbageAndCutShortStreamsLeakNothing) {
  Pair p;
  {  // not a batch header
    const int fd = raw_connect(p.rx->port());
    std::vector<unsigned char> junk(kBatchHeaderBytes, 'x');
    write_bytes(fd, junk.data(), junk.size());
    Answer a;
    ASSERT_TRUE(read_answer(fd, &a));
    EXPECT_EQ(a.status, TransferStatus::kBadBatch);
    ::close(fd);
  }
  {  // a batch too large to be real
    const int fd = raw_connect(p.rx->port());
    auto head = batch_head(kMaxBatchBlocks + 1, kBlock);
    write_bytes(fd, head.data(), head.size());
    Answer a;
    ASSERT_TRUE(read_answer(fd, &a));
    EXPECT_EQ(a.status, TransferStatus::kBadBatch);
    ::close(fd);
  }
  {  // the sender dies inside a payload: the reserved slot must be freed
    const int fd = raw_connect(p.rx->port());
    auto head = batch_head(2, kBlock);
    write_bytes(fd, head.data(), head.size());
    auto b0 = framed(0, kModel, false), b1 = framed(1, kModel, false);
    write_bytes(fd, b0.data(), b0.size());
    write_bytes(fd, b1.data(), kBlockFileHeaderBytes + 100);
    ::close(fd);
  }
  // All three were refused (the last when its stream broke off) and closed; not before.
  wait_for([&] { return p.rx->counters().refused.load() >= 3 && p.rx->counters().connections.load() == 0; });
  EXPECT_EQ(p.rx->counters().connections.load(), 0);
  EXPECT_EQ(held_exact(*p.to, 2), 1);
  expect_no_leaked_slots(*p.to, 64 - 1, 1);
  EXPECT_GE(p.rx->counters().refused.load(), 3);
  // And a real sender is served after all that.
  for (uint64_t i = 0; i < 8; ++i) put(*p.from, i);
  const TransferResult r = p.send_leading(8);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(held_exact(*p.to, 8), 8);
}

TEST(KvTransfer, ASilentSenderIsDroppedAfterTheTimeout) {
  Pair p;
  const int fd = raw_connect(p.rx->port());
  auto head = batch_head(1, kBlock);
  write_bytes(fd, head.data(), head.size());
  auto b0 = framed(0, kModel, false);
  write_bytes(fd, b0.data(), kBlockFileHeaderBytes + 10);  // then nothing (io_timeout_ms = 2000)
  wait_for([&] { return p.rx->counters().connections.load() == 1; });
  ASSERT_EQ(p.rx->counters().connections.load(), 1);
  wait_for([&] { return p.rx->counters().connections.load() == 0; });
  EXPECT_EQ(p.rx->counters().connections.load(), 0);
  EXPECT_EQ(p.rx->counters().refused.load(), 1);
  ::close(fd);
  expect_no_leaked_slots(*p.to, 64, 0);
}

TEST(KvTransfer, NoReceiverIsAnErrorNotAHang) {
  TcpTransferConfig tc;
  tc.fingerprint = kModel;
  tc.block_bytes = kBlock;
  tc.connect_timeout_ms = 1000;
  TcpKvTransfer tx(tc);
  int port = 0;
  {  // a port nobody listens on: bound, then closed
    auto store = make_store(1);
    ReceiverConfig rc;
    rc.fingerprint = kModel;
    rc.block_bytes = kBlock;
    KvReceiver rx(rc, *store);
    port = rx.port();
  }
  const TransferResult r = tx.send("127.0.0.1:" + std::to_string(port), "chat", {});
  EXPECT_FALSE(r.ok);
  EXPECT_FALSE(r.error.empty());
  EXPECT_FALSE(tx.send("not-an-address", "chat", {}).ok);
  EXPECT_EQ(tx.counters().failures.load(), 2);
}

TEST(KvTransfer, AFullHostTierDropsBlocksButAnswers) {
  Pair p;
  p.rx.reset();  // a receiver on a store of two blocks instead
  p.to = make_store(2);
  ReceiverConfig rc;
  rc.fingerprint = kModel;
  rc.block_bytes = kBlock;
  p.rx = std::make_unique<KvReceiver>(rc, *p.to);
  // Pin both slots of the small store: nothing can be stored.
  put(*p.to, 100);
  put(*p.to, 101);
  std::vector<BlockHash> mine{xor_key(100), xor_key(101)};
  auto held = p.to->pin_host_blocks(mine.data(), 2);
  ASSERT_EQ(held.size(), 2);
  for (uint64_t i = 0; i < 3; ++i) put(*p.from, i);
  const TransferResult r = p.send_leading(3);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_EQ(r.accepted, 0);
  EXPECT_EQ(p.rx->counters().no_room.load(), 3);
}

}  // namespace
}  // namespace beluga::kv
