// The file tier's two I/O paths (kvstore/block_io.h): io_uring gives the same results as the thread
// path — byte-identical files for every sync mode, the same status for every missing, truncated,
// corrupt or foreign file, bit-exact loads with more files in flight than the ring's depth, ENOSPC on a
// small tmpfs reported as kNoSpace with no temporary file left (and counted by the tier, which lowers
// its capacity and goes on by eviction) — and a process whose io_uring_setup is refused (a seccomp
// filter, as in many containers) runs on the threads with the reason in the description.
// Where io_uring itself is unavailable, the io_uring cases check that asking for it is an error.
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>

#include "kv_test_support.h"
#include "kvstore/block_file.h"
#include "kvstore/block_io.h"
#include "kvstore/disk_tier.h"
#include "util/error.h"

namespace beluga::kv {
namespace {

namespace fs = std::filesystem;

constexpr size_t kBytes = 3000;
const BlockHash kFp{11, 22};

using testing::key;
using testing::pattern;

BlockFileHeader header(uint64_t i, size_t n = kBytes) {
  BlockFileHeader h;
  h.fingerprint = kFp;
  h.key = key(i);
  h.tokens = 64;
  h.cls = i % 2 ? "agent" : "chat";
  h.created = h.last_used = 1700000000 + int64_t(i);
  h.payload_bytes = n;
  return h;
}

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// Waits for the callbacks of one batch of BlockIo calls.
struct Latch {
  std::mutex mu;
  std::condition_variable cv;
  int left;
  explicit Latch(int n) : left(n) {}
  void count() {
    std::lock_guard<std::mutex> lk(mu);
    if (--left == 0) cv.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return left == 0; });
  }
};

BlockFileStatus write_one(BlockIo& io, const std::string& path, const BlockFileHeader& h,
                          const void* payload) {
  BlockFileStatus got = BlockFileStatus::kIoError;
  Latch l(1);
  io.write(path, h, payload, [&](BlockFileStatus s) {
    got = s;
    l.count();
  });
  l.wait();
  return got;
}

BlockFileStatus read_one(BlockIo& io, const std::string& path, const BlockHash& k, void* dst,
                         BlockFileHeader* h = nullptr) {
  BlockFileStatus got = BlockFileStatus::kIoError;
  Latch l(1);
  io.read(path, kFp, k, kBytes, dst, [&](BlockFileStatus s, const BlockFileHeader& hh) {
    got = s;
    if (h) *h = hh;
    l.count();
  });
  l.wait();
  return got;
}

class BlockIoPath : public ::testing::TestWithParam<IoMode> {
 protected:
  // The path under test, or nullptr where io_uring is unavailable (asking for it must then fail).
  std::unique_ptr<BlockIo> open(BlockSync sync = BlockSync::kNone) {
    DiskIoOptions o;
    o.mode = GetParam();
    o.sync = sync;
    o.queue_depth = 8;
    std::string why;
    if (GetParam() == IoMode::kUring && !uring_available(&why)) {
      std::printf("io_uring unavailable here (%s): checking that asking for it fails\n", why.c_str());
      EXPECT_THROW(open_block_io(o, 2), Error);
      return nullptr;
    }
    auto io = open_block_io(o, 2);
    EXPECT_EQ(io->uring(), GetParam() == IoMode::kUring) << io->description();
    return io;
  }
};

TEST_P(BlockIoPath, WritesTheSameFilesAsTheThreadPathForEverySyncMode) {
  const std::string dir = testing::temp_dir("kvio", "same");
  for (BlockSync sync : {BlockSync::kNone, BlockSync::kData, BlockSync::kFull}) {
    auto io = open(sync);
    if (!io) break;
    EXPECT_EQ(io->sync(), sync);
    for (uint64_t i = 0; i < 6; ++i) {
      const auto data = pattern(int(i), kBytes);
      const std::string a = dir + "/" + block_sync_name(sync) + "_path_" + std::to_string(i) + ".kvb";
      const std::string b = dir + "/" + block_sync_name(sync) + "_ref_" + std::to_string(i) + ".kvb";
      ASSERT_EQ(write_one(*io, a, header(i), data.data()), BlockFileStatus::kOk);
      ASSERT_EQ(write_block_file(b, header(i), data.data(), sync), BlockFileStatus::kOk);
      EXPECT_EQ(file_bytes(a), file_bytes(b)) << a;
      std::vector<std::byte> got(kBytes);
      BlockFileHeader h;
      ASSERT_EQ(read_one(*io, b, key(i), got.data(), &h), BlockFileStatus::kOk);
      EXPECT_EQ(got, data);
      EXPECT_EQ(h.cls, header(i).cls);
      EXPECT_EQ(h.created, header(i).created);
    }
  }
  for (auto& e : fs::directory_iterator(dir))
    EXPECT_FALSE(is_block_temp_name(e.path().filename().string())) << e.path();
  fs::remove_all(dir);
}

TEST_P(BlockIoPath, JudgesBadFilesAsTheThreadPathDoes) {
  auto io = open();
  if (!io) return;
  const std::string dir = testing::temp_dir("kvio", "bad");
  const auto data = pattern(3, kBytes);
  auto make = [&](const std::string& name, const BlockFileHeader& h) {
    const std::string p = dir + "/" + name;
    EXPECT_EQ(write_block_file(p, h, data.data()), BlockFileStatus::kOk);
    return p;
  };
  struct Case {
    std::string path;
    BlockHash key;
    BlockFileStatus want;
  };
  std::vector<Case> cases;
  cases.push_back({dir + "/missing.kvb", key(3), BlockFileStatus::kMissing});
  cases.push_back({make("good.kvb", header(3)), key(3), BlockFileStatus::kOk});
  cases.push_back({make("other_key.kvb", header(3)), key(4), BlockFileStatus::kCorrupt});
  BlockFileHeader foreign = header(3);
  foreign.fingerprint = {99, 99};
  cases.push_back({make("foreign.kvb", foreign), key(3), BlockFileStatus::kForeign});
  BlockFileHeader bigger = header(3, kBytes - 8);  // another model's block size
  cases.push_back({make("size.kvb", bigger), key(3), BlockFileStatus::kForeign});
  const std::string trunc_payload = make("trunc_payload.kvb", header(3));
  fs::resize_file(trunc_payload, kBlockFileHeaderBytes + kBytes - 1);
  cases.push_back({trunc_payload, key(3), BlockFileStatus::kShort});
  const std::string trunc_head = make("trunc_head.kvb", header(3));
  fs::resize_file(trunc_head, 10);
  cases.push_back({trunc_head, key(3), BlockFileStatus::kShort});
  const std::string empty = make("empty.kvb", header(3));
  fs::resize_file(empty, 0);
  cases.push_back({empty, key(3), BlockFileStatus::kShort});
  for (const auto& [name, offset] :
       {std::pair<std::string, size_t>{"flip_payload.kvb", kBlockFileHeaderBytes + 100},
        {"flip_header.kvb", 40}}) {
    const std::string p = make(name, header(3));
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(std::streamoff(offset));
    const char c = char(f.get());
    f.seekp(std::streamoff(offset));
    f.put(char(~c));
    cases.push_back({p, key(3), BlockFileStatus::kCorrupt});
  }
  for (const Case& c : cases) {
    std::vector<std::byte> got(kBytes), ref(kBytes);
    BlockFileHeader h;
    const BlockFileStatus s = read_one(*io, c.path, c.key, got.data());
    EXPECT_EQ(s, read_block_file(c.path, kFp, c.key, kBytes, ref.data(), &h)) << c.path;
    EXPECT_EQ(s, c.want) << c.path << ": " << block_file_status_name(s);
    if (s == BlockFileStatus::kOk) {
      EXPECT_EQ(got, data);
    }
  }
  fs::remove_all(dir);
}

TEST_P(BlockIoPath, ManyFilesInFlightRoundTripBitExact) {
  auto io = open();
  if (!io) return;
  const std::string dir = testing::temp_dir("kvio", "many");
  constexpr int kN = 200;                           // far more than the queue depth of 8
  constexpr size_t kBig = (size_t(1) << 20) + 123;  // every tenth file: a large, odd-sized transfer
  std::vector<std::vector<std::byte>> data, got(kN, std::vector<std::byte>(kBig));
  for (int i = 0; i < kN; ++i) data.push_back(pattern(1000 + i, i % 10 == 0 ? kBig : kBytes));
  std::vector<BlockFileStatus> ws(kN, BlockFileStatus::kIoError), rs(kN, BlockFileStatus::kIoError);
  auto path = [&](int i) { return dir + "/" + std::to_string(i) + ".kvb"; };
  {
    Latch l(kN);
    for (int i = 0; i < kN; ++i)
      io->write(path(i), header(uint64_t(i), data[size_t(i)].size()), data[size_t(i)].data(),
                [&, i](BlockFileStatus s) {
                  ws[size_t(i)] = s;
                  l.count();
                });
    io->drain();  // drain alone waits for every callback
    EXPECT_EQ(l.left, 0);
  }
  {
    Latch l(kN);
    for (int i = 0; i < kN; ++i)
      io->read(path(i), kFp, key(uint64_t(i)), data[size_t(i)].size(), got[size_t(i)].data(),
               [&, i](BlockFileStatus s, const BlockFileHeader&) {
                 rs[size_t(i)] = s;
                 l.count();
               });
    l.wait();
  }
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(ws[size_t(i)], BlockFileStatus::kOk) << i;
    EXPECT_EQ(rs[size_t(i)], BlockFileStatus::kOk) << i;
    got[size_t(i)].resize(data[size_t(i)].size());
    EXPECT_TRUE(got[size_t(i)] == data[size_t(i)]) << i;
  }
  // Jobs run too, and drain waits for the work they submit.
  int from_jobs = 0;
  for (int i = 0; i < 4; ++i)
    io->job([&, i] {
      io->write(path(1000 + i), header(uint64_t(i)), data[1].data(), [&](BlockFileStatus s) {
        if (s == BlockFileStatus::kOk) __atomic_add_fetch(&from_jobs, 1, __ATOMIC_SEQ_CST);
      });
    });
  io->drain();
  EXPECT_EQ(__atomic_load_n(&from_jobs, __ATOMIC_SEQ_CST), 4);
  fs::remove_all(dir);
}

// A 64 KiB tmpfs (root may mount one), else a file size limit (RLIMIT_FSIZE, SIGXFSZ ignored) that each
// block file passes: kNoSpace (ENOSPC) resp. kIoError (EFBIG), never a temporary file left behind.
TEST_P(BlockIoPath, FullDiskIsReportedAsTheThreadPathReportsIt) {
  auto io = open();
  if (!io) return;
  const std::string dir = testing::temp_dir("kvio", "full");
  const bool mounted = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=64k") == 0;
  struct rlimit old {};
  ::getrlimit(RLIMIT_FSIZE, &old);
  if (!mounted) {
    std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = old;
    lim.rlim_cur = kBytes;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  }
  std::printf("full disk: %s\n", mounted ? "64 KiB tmpfs" : "RLIMIT_FSIZE");
  const BlockFileStatus want = mounted ? BlockFileStatus::kNoSpace : BlockFileStatus::kIoError;
  int ok = 0, full = 0, other = 0;
  std::vector<std::vector<std::byte>> data;
  for (int i = 0; i < 40; ++i) data.push_back(pattern(i, kBytes));
  for (int i = 0; i < 40; ++i) {  // one at a time: the same sequence of space as the thread path's
    const BlockFileStatus s =
        write_one(*io, dir + "/" + std::to_string(i) + ".kvb", header(uint64_t(i)), data[size_t(i)].data());
    (s == BlockFileStatus::kOk ? ok : s == want ? full : other)++;
  }
  // The thread path's own writes on the same (full) file system fail the same way.
  const BlockFileStatus ref = write_block_file(dir + "/ref.kvb", header(99), data[0].data());
  if (mounted)
    ::umount(dir.c_str());
  else
    ::setrlimit(RLIMIT_FSIZE, &old);
  EXPECT_EQ(ref, want);
  EXPECT_GT(full, 0);
  EXPECT_EQ(other, 0);
  if (mounted) {
    EXPECT_GT(ok, 0) << "the first blocks fit";
  }
  fs::remove_all(dir);
}

TEST_P(BlockIoPath, DiskTierCountsNoSpaceAndGoesOnByEviction) {
  if (!open()) return;
  const std::string dir = testing::temp_dir("kvio", "tierfull");
  const bool mounted = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=64k") == 0;
  struct rlimit old {};
  ::getrlimit(RLIMIT_FSIZE, &old);
  if (!mounted) {  // each block file fails with EFBIG: write errors, but no shortage of space
    std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = old;
    lim.rlim_cur = kBytes;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  }
  {
    DiskConfig dc;
    dc.dir = dir;
    dc.fingerprint = kFp;
    dc.block_bytes = kBytes;
    dc.capacity_bytes = size_t(1) << 30;  // the tier believes it has room: the file system says no
    dc.threads = 2;
    dc.io.mode = GetParam();
    DiskTier disk(dc);
    EXPECT_EQ(disk.io_uring(), GetParam() == IoMode::kUring) << disk.io_description();
    std::vector<std::vector<std::byte>> data;
    for (int i = 0; i < 60; ++i) data.push_back(pattern(i, kBytes));
    for (int round = 0; round < 3; ++round) {  // after the first failures, the lowered capacity evicts
      for (int i = round * 20; i < round * 20 + 20; ++i)
        disk.write(key(uint64_t(i)), data[size_t(i)].data(), "chat", [] {});
      disk.drain();
    }
    const TierStats s = disk.stats();
    EXPECT_GT(s.write_errors, 0);
    EXPECT_EQ(s.errors, s.write_errors) << "no read failed";
    for (auto& e : fs::recursive_directory_iterator(dir))
      EXPECT_FALSE(is_block_temp_name(e.path().filename().string())) << "left behind: " << e.path();
    if (mounted) {
      EXPECT_EQ(s.no_space, s.write_errors);
      EXPECT_GT(s.bytes_written, 0) << "the first blocks fit";
      EXPECT_LT(s.capacity_bytes, int64_t(64) << 10) << "the capacity follows what the file system holds";
      EXPECT_GT(s.evictions, 0) << "later writes made room";
      // The last block stored loads bit-exact.
      int last = -1;
      for (int i = 59; i >= 0 && last < 0; --i)
        if (disk.contains(key(uint64_t(i)))) last = i;
      ASSERT_GE(last, 40) << "the last round stored blocks";
      std::vector<std::byte> got(kBytes);
      Latch l(1);
      bool ok = false;
      disk.read(key(uint64_t(last)), got.data(), "chat", [&](bool good) {
        ok = good;
        l.count();
      });
      l.wait();
      EXPECT_TRUE(ok);
      EXPECT_EQ(got, data[size_t(last)]);
    }
  }
  if (mounted)
    ::umount(dir.c_str());
  else
    ::setrlimit(RLIMIT_FSIZE, &old);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Paths, BlockIoPath, ::testing::Values(IoMode::kThreads, IoMode::kUring),
                         [](const auto& info) {
                           return std::string(info.param == IoMode::kUring ? "uring" : "threads");
                         });

TEST(BlockIo, ParsesModesAndSyncs) {
  IoMode m = IoMode::kAuto;
  EXPECT_TRUE(parse_io_mode("threads", &m));
  EXPECT_EQ(m, IoMode::kThreads);
  EXPECT_TRUE(parse_io_mode("uring", &m));
  EXPECT_EQ(m, IoMode::kUring);
  EXPECT_TRUE(parse_io_mode("auto", &m));
  EXPECT_EQ(m, IoMode::kAuto);
  EXPECT_FALSE(parse_io_mode("aio", &m));
  BlockSync s = BlockSync::kNone;
  EXPECT_TRUE(parse_block_sync("full", &s));
  EXPECT_EQ(s, BlockSync::kFull);
  EXPECT_TRUE(parse_block_sync("data", &s));
  EXPECT_EQ(s, BlockSync::kData);
  EXPECT_FALSE(parse_block_sync("fsync", &s));
}

// io_uring_setup refused with EPERM by a seccomp filter (Docker's default profile does the same):
// auto runs on the threads and says why, asking for io_uring is an error, and the tier works.
TEST(BlockIo, FallsBackToThreadsWhenIoUringSetupIsRefused) {
  std::string why;
  const bool uring_here = uring_available(&why);
  std::printf("io_uring in this process: %s\n", uring_here ? "available" : why.c_str());
  const std::string dir = testing::temp_dir("kvio", "seccomp");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int failures = 0;
    auto check = [&](bool ok, const std::string& what) {
      if (!ok) {
        std::fprintf(stderr, "child: failed: %s\n", what.c_str());
        failures++;
      }
    };
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
    check(::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0, "no_new_privs");
    check(::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0, "seccomp filter");
    std::string w;
    check(!uring_available(&w), "io_uring is refused");
    if (uring_here)
      check(
          w.find("io_uring_setup") != std::string::npos && w.find(std::strerror(EPERM)) != std::string::npos,
          "the reason names io_uring_setup and EPERM: " + w);
    DiskIoOptions o;
    auto io = open_block_io(o, 2);
    check(!io->uring(), "auto took the threads");
    check(io->description().find("threads") == 0 && io->description().find(w) != std::string::npos,
          "the description says threads and why: " + io->description());
    o.mode = IoMode::kUring;
    bool threw = false;
    try {
      open_block_io(o, 2);
    } catch (const Error& e) {
      threw = std::string(e.what()).find(w) != std::string::npos;
    }
    check(threw, "asking for io_uring is an error that says why");
    DiskConfig dc;
    dc.dir = dir;
    dc.fingerprint = kFp;
    dc.block_bytes = kBytes;
    dc.capacity_bytes = size_t(1) << 30;
    {
      DiskTier disk(dc);
      check(!disk.io_uring(), "the tier runs on the threads");
      const auto data = pattern(5, kBytes);
      disk.write(key(5), data.data(), "chat", [] {});
      disk.drain();
      std::vector<std::byte> got(kBytes);
      Latch l(1);
      bool ok = false;
      disk.read(key(5), got.data(), "chat", [&](bool good) {
        ok = good;
        l.count();
      });
      l.wait();
      check(ok && got == data, "a block round trips on the threads");
    }
    std::fflush(stderr);
    ::_exit(failures);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died: status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "failed checks in the child (its stderr above)";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace beluga::kv
