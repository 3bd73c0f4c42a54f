#include "kvstore/uring_block_io.h"

#if BELUGA_HAVE_LIBURING

#include <fcntl.h>
#include <liburing.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>
#include <vector>

namespace beluga::kv {

namespace {

// The operations the chains above use (all in Linux 5.11 and later).
constexpr std::pair<int, const char*> kNeeded[] = {
    {IORING_OP_OPENAT, "openat"},     {IORING_OP_READV, "readv"}, {IORING_OP_WRITEV, "writev"},
    {IORING_OP_FSYNC, "fsync"},       {IORING_OP_CLOSE, "close"}, {IORING_OP_RENAMEAT, "renameat"},
    {IORING_OP_UNLINKAT, "unlinkat"}, {IORING_OP_READ, "read"}};

// Sets `ring` up with `entries`; "" when it is ready, else why not (and no ring is left).
std::string setup_ring(io_uring* ring, unsigned entries) {
  const int e = io_uring_queue_init(entries, ring, 0);
  if (e < 0) return std::string("io_uring_setup: ") + std::strerror(-e);
  io_uring_probe* p = io_uring_get_probe_ring(ring);
  if (!p) {
    io_uring_queue_exit(ring);
    return "io_uring: the kernel cannot list its operations (Linux older than 5.6)";
  }
  std::string missing;
  for (const auto& [op, name] : kNeeded)
    if (!io_uring_opcode_supported(p, op)) missing += std::string(" ") + name;
  io_uring_free_probe(p);
  if (!missing.empty()) {
    io_uring_queue_exit(ring);
    return "io_uring: the kernel lacks" + missing + " (Linux 5.11 or later has them)";
  }
  return "";
}

struct Op {
  enum class Kind { kRead, kWrite };
  enum class Step { kOpen, kTransfer, kSync, kClose, kRename, kDirOpen, kDirSync, kDirClose, kUnlink };
  Kind kind = Kind::kRead;
  Step step = Step::kOpen;
  std::string path, tmp;  // tmp: a write's temporary name
  BlockHash fingerprint, key;
  size_t payload_bytes = 0;
  std::byte* payload = nullptr;  // a read's destination or a write's source
  BlockFileHeader h;
  unsigned char head[kBlockFileHeaderBytes];
  iovec iov[2];
  size_t done = 0;  // bytes transferred from the file's start
  int fd = -1;
  int err = 0;               // a write's first failure (errno)
  bool dir_failed = false;   // kFull: the directory sync failed
  bool read_failed = false;  // a read's i/o error
  BlockIo::ReadDone read_done;
  BlockIo::WriteDone write_done;

  size_t total() const { return kBlockFileHeaderBytes + payload_bytes; }
};

class UringBlockIo final : public BlockIo {
 public:
  UringBlockIo(const io_uring& ring, int efd, int depth, BlockSync sync)
      : BlockIo(true, sync), ring_(ring), efd_(efd), depth_(depth), jobs_(2) {
    description_ = "io_uring (queue depth " + std::to_string(depth) + ")";
    thread_ = std::thread([this] { loop(); });
  }
  ~UringBlockIo() override {
    drain();
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    wake();
    thread_.join();
    io_uring_queue_exit(&ring_);
    ::close(efd_);
  }

  void read(std::string path, const BlockHash& fingerprint, const BlockHash& key, size_t payload_bytes,
            void* dst, ReadDone done) override {
    auto op = std::make_unique<Op>();
    op->kind = Op::Kind::kRead;
    op->path = std::move(path);
    op->fingerprint = fingerprint;
    op->key = key;
    op->payload_bytes = payload_bytes;
    op->payload = static_cast<std::byte*>(dst);
    op->read_done = std::move(done);
    enqueue(std::move(op));
  }

  void write(std::string path, const BlockFileHeader& h, const void* payload, WriteDone done) override {
    auto op = std::make_unique<Op>();
    op->kind = Op::Kind::kWrite;
    op->tmp = block_temp_path(path);
    op->path = std::move(path);
    op->h = h;
    op->payload_bytes = h.payload_bytes;
    op->payload = static_cast<std::byte*>(const_cast<void*>(payload));  // writev takes iovec, never writes
    encode_block_header(h, payload, op->head);  // the checksum on the caller's thread, not the ring's
    op->write_done = std::move(done);
    enqueue(std::move(op));
  }

  void job(std::function<void()> fn) override {
    begin();
    jobs_.submit([this, fn = std::move(fn)] {
      fn();
      end();
    });
  }

 private:
  void enqueue(std::unique_ptr<Op> op) {
    begin();
    {
      std::lock_guard<std::mutex> lk(mu_);
      queue_.push_back(std::move(op));
    }
    wake();
  }

  void wake() {
    const uint64_t one = 1;
    while (::write(efd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
  }

  io_uring_sqe* sqe() {
    // Never null: at most depth_ files and the eventfd read are in flight, each with one entry,
    // and the ring has at least depth_ + 1.
    io_uring_sqe* s = io_uring_get_sqe(&ring_);
    if (!s) {
      io_uring_submit(&ring_);
      s = io_uring_get_sqe(&ring_);
    }
    return s;
  }

  void arm_eventfd() {
    io_uring_sqe* s = sqe();
    io_uring_prep_read(s, efd_, &efd_value_, sizeof(efd_value_), 0);
    io_uring_sqe_set_data(s, nullptr);
  }

  // Prepares the entry of `op`'s current step.
  void issue(Op* op) {
    io_uring_sqe* s = sqe();
    const bool rd = op->kind == Op::Kind::kRead;
    switch (op->step) {
      case Op::Step::kOpen:
        if (rd)
          io_uring_prep_openat(s, AT_FDCWD, op->path.c_str(), O_RDONLY | O_CLOEXEC, 0);
        else
          io_uring_prep_openat(s, AT_FDCWD, op->tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        break;
      case Op::Step::kTransfer: {
        unsigned n = 0;
        if (op->done < kBlockFileHeaderBytes)
          op->iov[n++] = {op->head + op->done, kBlockFileHeaderBytes - op->done};
        const size_t in_payload = op->done > kBlockFileHeaderBytes ? op->done - kBlockFileHeaderBytes : 0;
        op->iov[n++] = {op->payload + in_payload, op->payload_bytes - in_payload};
        if (rd)
          io_uring_prep_readv(s, op->fd, op->iov, n, op->done);
        else
          io_uring_prep_writev(s, op->fd, op->iov, n, op->done);
        break;
      }
      case Op::Step::kSync:
        io_uring_prep_fsync(s, op->fd, sync() == BlockSync::kData ? IORING_FSYNC_DATASYNC : 0);
        break;
      case Op::Step::kClose:
      case Op::Step::kDirClose:
        io_uring_prep_close(s, op->fd);
        break;
      case Op::Step::kRename:
        io_uring_prep_renameat(s, AT_FDCWD, op->tmp.c_str(), AT_FDCWD, op->path.c_str(), 0);
        break;
      case Op::Step::kDirOpen:
        op->tmp = op->path.substr(0, op->path.rfind('/'));  // the temporary name is gone by now
        io_uring_prep_openat(s, AT_FDCWD, op->tmp.empty() ? "/" : op->tmp.c_str(),
                             O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
        break;
      case Op::Step::kDirSync:
        io_uring_prep_fsync(s, op->fd, 0);
        break;
      case Op::Step::kUnlink:
        io_uring_prep_unlinkat(s, AT_FDCWD, op->tmp.c_str(), 0);
        break;
    }
    io_uring_sqe_set_data(s, op);
  }

  void go(Op* op, Op::Step next) {
    op->step = next;
    issue(op);
  }

  // A completion of `op`'s current step with result `res`: issues the next step or finishes.
  void advance(Op* op, int res) {
    if ((res == -EINTR || res == -EAGAIN) && op->step != Op::Step::kClose && op->step != Op::Step::kDirClose)
      return issue(op);  // interrupted: the same step again
    if (op->kind == Op::Kind::kRead) return advance_read(op, res);
    advance_write(op, res);
  }

  void advance_read(Op* op, int res) {
    switch (op->step) {
      case Op::Step::kOpen:
        if (res < 0)
          return finish_read(op, res == -ENOENT ? BlockFileStatus::kMissing : BlockFileStatus::kIoError);
        op->fd = res;
        return go(op, Op::Step::kTransfer);
      case Op::Step::kTransfer:
        if (res < 0) op->read_failed = true;
        if (res > 0) op->done += size_t(res);
        if (res > 0 && op->done < op->total()) return issue(op);  // a short read: the rest
        return go(op, Op::Step::kClose);                          // whole, at its end, or failed
      default: {  // kClose: the checks and the callback on a worker, so the ring's thread goes on issuing
        op->fd = -1;
        --active_;
        jobs_.submit([this, op] {
          const BlockFileStatus s = op->read_failed
                                        ? BlockFileStatus::kIoError
                                        : check_block_image(op->head, op->done, op->fingerprint, op->key,
                                                            op->payload_bytes, op->payload, &op->h);
          op->read_done(s, op->h);
          delete op;
          end();
        });
        return;
      }
    }
  }

  void advance_write(Op* op, int res) {
    switch (op->step) {
      case Op::Step::kOpen:
        if (res < 0) {
          op->err = -res;
          return finish_write(op);
        }
        op->fd = res;
        return go(op, Op::Step::kTransfer);
      case Op::Step::kTransfer:
        if (res <= 0) {
          op->err = res < 0 ? -res : EIO;
          return go(op, Op::Step::kClose);
        }
        op->done += size_t(res);
        if (op->done < op->total()) return issue(op);
        return go(op, sync() == BlockSync::kNone ? Op::Step::kClose : Op::Step::kSync);
      case Op::Step::kSync:
        if (res < 0) op->err = -res;
        return go(op, Op::Step::kClose);
      case Op::Step::kClose:
        op->fd = -1;
        if (res < 0 && op->err == 0) op->err = -res;
        return go(op, op->err ? Op::Step::kUnlink : Op::Step::kRename);
      case Op::Step::kRename:
        if (res < 0) {
          op->err = -res;
          return go(op, Op::Step::kUnlink);
        }
        if (sync() == BlockSync::kFull) return go(op, Op::Step::kDirOpen);
        return finish_write(op);
      case Op::Step::kDirOpen:
        if (res < 0) {
          op->dir_failed = true;
          return finish_write(op);
        }
        op->fd = res;
        return go(op, Op::Step::kDirSync);
      case Op::Step::kDirSync:
        if (res < 0) op->dir_failed = true;
        return go(op, Op::Step::kDirClose);
      case Op::Step::kDirClose:
        op->fd = -1;
        return finish_write(op);
      case Op::Step::kUnlink:
        return finish_write(op);
    }
  }

  void finish_read(Op* op, BlockFileStatus s) {
    op->read_done(s, op->h);
    retire(op);
  }

  void finish_write(Op* op) {
    op->write_done(op->err          ? write_error_status(op->err)
                   : op->dir_failed ? BlockFileStatus::kIoError
                                    : BlockFileStatus::kOk);
    retire(op);
  }

  void retire(Op* op) {
    delete op;
    --active_;
    end();
  }

  void loop() {
    arm_eventfd();
    std::vector<std::pair<Op*, int>> done;
    for (;;) {
      bool stopping = false;
      std::vector<Op*> start;
      {
        std::lock_guard<std::mutex> lk(mu_);
        while (active_ < depth_ && !queue_.empty()) {
          start.push_back(queue_.front().release());
          queue_.pop_front();
          ++active_;
        }
        stopping = stop_ && queue_.empty();
      }
      for (Op* op : start) issue(op);
      if (stopping && active_ == 0) break;
      const int r = io_uring_submit_and_wait(&ring_, 1);
      if (r < 0 && r != -EINTR && r != -EBUSY && r != -EAGAIN) {
        std::this_thread::yield();  // (not seen: the ring is sized for everything in flight)
        continue;
      }
      done.clear();
      unsigned head = 0, n = 0;
      io_uring_cqe* cqe = nullptr;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        done.push_back({static_cast<Op*>(io_uring_cqe_get_data(cqe)), cqe->res});
        ++n;
      }
      io_uring_cq_advance(&ring_, n);
      for (const auto& [op, res] : done) {
        if (op == nullptr)
          arm_eventfd();  // woken: new work or stop; read the eventfd again
        else
          advance(op, res);
      }
    }
  }

  io_uring ring_;
  const int efd_;
  const int depth_;
  uint64_t efd_value_ = 0;
  int active_ = 0;  // files in flight on the ring (its thread only)
  std::mutex mu_;
  std::deque<std::unique_ptr<Op>> queue_;
  bool stop_ = false;
  IoPool jobs_;
  std::thread thread_;
};

}  // namespace

bool uring_probe(std::string* why) {
  io_uring ring;
  const std::string e = setup_ring(&ring, 4);
  if (!e.empty()) {
    if (why) *why = e;
    return false;
  }
  io_uring_queue_exit(&ring);
  return true;
}

std::unique_ptr<BlockIo> open_uring_block_io(int queue_depth, BlockSync sync, std::string* why) {
  io_uring ring;
  const std::string e = setup_ring(&ring, unsigned(queue_depth) + 1);
  if (!e.empty()) {
    if (why) *why = e;
    return nullptr;
  }
  const int efd = ::eventfd(0, EFD_CLOEXEC);
  if (efd < 0) {
    io_uring_queue_exit(&ring);
    if (why) *why = std::string("eventfd: ") + std::strerror(errno);
    return nullptr;
  }
  return std::make_unique<UringBlockIo>(ring, efd, queue_depth, sync);
}

}  // namespace beluga::kv

#else  // built without liburing

namespace beluga::kv {

bool uring_probe(std::string* why) {
  if (why) *why = "built without liburing (install liburing-dev and configure again)";
  return false;
}

std::unique_ptr<BlockIo> open_uring_block_io(int, BlockSync, std::string* why) {
  uring_probe(why);
  return nullptr;
}

}  // namespace beluga::kv

#endif
