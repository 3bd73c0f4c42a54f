// BlockIo: the file tier's I/O, off the caller's thread. Whole block files are read and verified
// (block_file.h's checks) or written (temporary name, synced as asked, renamed), and blocking jobs
// (unlink, utimes, mkdir, a class rewrite) run on worker threads. Two paths with the same results:
//   io_uring (uring_block_io.h): one thread keeps up to queue_depth files in flight, each as a chain of
//     openat / readv|writev / fsync / close / renameat on the ring; jobs on two worker threads;
//   threads: a pool of `threads` threads making the blocking system calls.
// IoMode::kAuto takes io_uring when this build has liburing and the kernel lets this process use it
// (io_uring_setup is refused by seccomp in many containers, by kernel.io_uring_disabled, or is
// missing on old kernels), else the threads; description() says which path and why.
// Completion callbacks run on an I/O thread; drain() waits for everything submitted so far, including
// what callbacks and jobs submit while it waits.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "kvstore/block_file.h"
#include "kvstore/io_pool.h"

namespace beluga::kv {

enum class IoMode { kAuto, kUring, kThreads };
const char* io_mode_name(IoMode m);  // "auto", "io_uring", "threads"
// "auto", "io_uring" (or "uring"), "threads"; false for anything else.
bool parse_io_mode(const std::string& s, IoMode* out);

struct DiskIoOptions {
  IoMode mode = IoMode::kAuto;
  BlockSync sync = BlockSync::kNone;
  int queue_depth = 32;  // io_uring: block files in flight at once
};

class BlockIo {
 public:
  using ReadDone = std::function<void(BlockFileStatus, const BlockFileHeader&)>;
  using WriteDone = std::function<void(BlockFileStatus)>;
  virtual ~BlockIo() = default;

  // Reads `path` as block `key` of `fingerprint` (payload_bytes) into `dst`, then done(status, header).
  virtual void read(std::string path, const BlockHash& fingerprint, const BlockHash& key,
                    size_t payload_bytes, void* dst, ReadDone done) = 0;
  // Writes block file `path` (`h`, `payload` of h.payload_bytes, alive until done), then done(status).
  virtual void write(std::string path, const BlockFileHeader& h, const void* payload, WriteDone done) = 0;
  // Runs `fn` on a worker thread, where it may block.
  virtual void job(std::function<void()> fn) = 0;
  void drain();

  bool uring() const { return uring_; }
  BlockSync sync() const { return sync_; }
  const std::string& description() const { return description_; }

 protected:
  BlockIo(bool uring, BlockSync sync) : uring_(uring), sync_(sync) {}
  void begin();  // one more operation in flight (before it is queued)
  void end();    // one fewer (after its callback returned)
  std::string description_;

 private:
  const bool uring_;
  const BlockSync sync_;
  std::mutex mu_;
  std::condition_variable idle_;
  int64_t pending_ = 0;
};

// Whether io_uring can be used by this process (built with liburing, the ring sets up, the kernel has
// the operations the tier needs); when not, `why` says what refused it.
bool uring_available(std::string* why);
// The I/O path `o.mode` asks for, with `threads` worker threads for the thread path. kUring when
// io_uring is unavailable is an error (BELUGA_CHECK); kAuto falls back to the threads.
std::unique_ptr<BlockIo> open_block_io(const DiskIoOptions& o, int threads);

}  // namespace beluga::kv
