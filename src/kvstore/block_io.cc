#include "kvstore/block_io.h"

#include "kvstore/uring_block_io.h"
#include "util/error.h"

namespace beluga::kv {

namespace {

// The thread path: each read or write is one job of the pool, the blocking calls of block_file.h.
class ThreadBlockIo final : public BlockIo {
 public:
  ThreadBlockIo(int threads, BlockSync sync, const std::string& why_not_uring)
      : BlockIo(false, sync), pool_(threads) {
    description_ = "threads (" + std::to_string(std::max(1, threads)) + ")";
    if (!why_not_uring.empty()) description_ += "; io_uring not used: " + why_not_uring;
  }
  ~ThreadBlockIo() override { drain(); }

  void read(std::string path, const BlockHash& fingerprint, const BlockHash& key, size_t payload_bytes,
            void* dst, ReadDone done) override {
    job([path = std::move(path), fingerprint, key, payload_bytes, dst, done = std::move(done)] {
      BlockFileHeader h;
      const BlockFileStatus s = read_block_file(path, fingerprint, key, payload_bytes, dst, &h);
      done(s, h);
    });
  }
  void write(std::string path, const BlockFileHeader& h, const void* payload, WriteDone done) override {
    job([this, path = std::move(path), h, payload, done = std::move(done)] {
      done(write_block_file(path, h, payload, sync()));
    });
  }
  void job(std::function<void()> fn) override {
    begin();
    pool_.submit([this, fn = std::move(fn)] {
      fn();
      end();
    });
  }

 private:
  IoPool pool_;
};

}  // namespace

const char* io_mode_name(IoMode m) {
  switch (m) {
    case IoMode::kAuto:
      return "auto";
    case IoMode::kUring:
      return "io_uring";
    case IoMode::kThreads:
      return "threads";
  }
  return "?";
}

bool parse_io_mode(const std::string& s, IoMode* out) {
  if (s == "uring") {
    *out = IoMode::kUring;
    return true;
  }
  for (IoMode m : {IoMode::kAuto, IoMode::kUring, IoMode::kThreads})
    if (s == io_mode_name(m)) {
      *out = m;
      return true;
    }
  return false;
}

void BlockIo::begin() {
  std::lock_guard<std::mutex> lk(mu_);
  ++pending_;
}

void BlockIo::end() {
  std::lock_guard<std::mutex> lk(mu_);
  if (--pending_ == 0) idle_.notify_all();
}

void BlockIo::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  idle_.wait(lk, [&] { return pending_ == 0; });
}

bool uring_available(std::string* why) {
  return uring_probe(why);
}

std::unique_ptr<BlockIo> open_block_io(const DiskIoOptions& o, int threads) {
  std::string why;
  if (o.mode != IoMode::kThreads) {
    std::unique_ptr<BlockIo> ring = open_uring_block_io(std::max(1, o.queue_depth), o.sync, &why);
    if (ring) return ring;
    BELUGA_CHECK(o.mode != IoMode::kUring, "the KV file tier cannot use io_uring: ", why);
  }
  return std::make_unique<ThreadBlockIo>(threads, o.sync, why);
}

}  // namespace beluga::kv
