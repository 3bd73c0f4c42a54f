// Crash consistency of the file tier. (1) A writer process killed with SIGKILL at random points,
// mostly inside a block file's write: every block file left is whole and loads bit-exact, the
// partial files are only temporaries (never loadable), `beluga kv stats` reports them and `beluga
// kv gc` removes them. (2) A real `beluga serve` killed under load while it writes its directory:
// a server restarted on the same directory serves greedy output identical to a server without
// tiers, reports hits from the blocks that survived (usage and /metrics), never serves a block
// whose checksum fails (one is corrupted on purpose before the restart), and removes the dead
// server's partial files.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "engine/block_manager.h"
#include "kv_serve.h"
#include "kv_test_support.h"
#include "kvstore/block_file.h"
#include "kvstore/disk_tier.h"
#include "kvstore/fingerprint.h"

namespace beluga::kv {
namespace {

namespace fs = std::filesystem;
using testing::complete;
using testing::sample;
using testing::serve;

std::string run_cli(const std::string& args, int* rc) {
  const std::string cmd = std::string(BELUGA_BINARY) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  *rc = WEXITSTATUS(::pclose(p));
  return out;
}

struct DirCount {
  int blocks = 0, temps = 0;
};
DirCount count_files(const std::string& dir) {
  DirCount c;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const std::string name = it->path().filename().string();
    if (is_block_temp_name(name))
      c.temps++;
    else if (it->path().extension() == ".kvb")
      c.blocks++;
  }
  return c;
}

// Block `key`'s payload: a fixed random image with the key in its first 16 bytes, so a reader can
// check any block alone and a writer spends its time writing, not making data.
const std::vector<std::byte>& base_image(size_t n) {
  static const std::vector<std::byte> img = [n] {
    std::vector<std::byte> v(n);
    std::mt19937_64 g(99);
    for (size_t i = 0; i + 8 <= n; i += 8) {
      const uint64_t x = g();
      std::memcpy(v.data() + i, &x, 8);
    }
    return v;
  }();
  return img;
}
void fill_pattern(const BlockHash& key, std::byte* p, size_t n) {
  std::memcpy(p, base_image(n).data(), n);
  std::memcpy(p, &key, sizeof(key));
}

TEST(KvCrash, WriterKilledAtRandomPointsLeavesOnlyWholeBlocks) {
  const std::string dir = testing::temp_dir("kvcrash", "writer");
  // Large blocks: a write takes tens of milliseconds, so most kills land inside one.
  constexpr size_t kBytes = size_t(24) << 20;
  const BlockHash fp{0xc4a5, 0x11};
  std::mt19937 rng(std::random_device{}());
  int rounds = 0, killed = 0, caught = 0;
  bool last_left_partial = false;
  // At least 8 writers; more until the last one leaves a partial file (for gc below). Each new
  // writer's scan removes the partial files of the writers killed before it (their pids are gone).
  while (rounds < 8 || (!last_left_partial && rounds < 20)) {
    const int round = rounds++;
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // the writer: blocks round*1000 + i, for ever
      DiskConfig dc;
      dc.dir = dir;
      dc.fingerprint = fp;
      dc.block_bytes = kBytes;
      dc.capacity_bytes = size_t(1) << 40;
      dc.threads = 2;
      DiskTier disk(dc);
      std::vector<std::byte> a(kBytes), b(kBytes);
      fill_pattern({0, 0}, a.data(), kBytes);
      fill_pattern({0, 0}, b.data(), kBytes);
      for (uint64_t i = 0;; i += 2) {  // two writes at once, on two I/O threads
        const BlockHash k0{uint64_t(round) * 1000 + i, 5}, k1{uint64_t(round) * 1000 + i + 1, 5};
        std::memcpy(a.data(), &k0, sizeof(k0));
        std::memcpy(b.data(), &k1, sizeof(k1));
        disk.write(k0, a.data(), "chat", [] {});
        disk.write(k1, b.data(), "chat", [] {});
        disk.drain();
      }
    }
    // Once this writer's first file shows (the machine may be slow to start it), a random moment.
    const std::string mine = ".tmp." + std::to_string(pid) + ".";
    auto my_temps = [&] {
      int n = 0;
      std::error_code ec;
      for (auto it = fs::recursive_directory_iterator(dir, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
        n += it->path().filename().string().find(mine) != std::string::npos;
      return n;
    };
    const int before = count_files(dir).blocks;
    const auto t0 = std::chrono::steady_clock::now();
    while (my_temps() == 0 && count_files(dir).blocks == before &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(int(rng() % 400)));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int st = 0;
    ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    killed += WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
    last_left_partial = my_temps() > 0;
    caught += last_left_partial;
  }
  EXPECT_EQ(killed, rounds);
  const DirCount after = count_files(dir);
  std::printf(
      "[figures] %d writers killed, %d of them mid-write; left: %d whole block files, %d partial files\n",
      rounds, caught, after.blocks, after.temps);
  EXPECT_GT(after.blocks, 0);
  EXPECT_GT(after.temps, 0) << "the kills should have caught writes in progress";

  // `kv stats` sees the partial files as abandoned (their writers are gone), `kv gc` removes them
  // and keeps every block (nothing has expired).
  int rc = 0;
  const auto stats = nlohmann::json::parse(run_cli("kv stats --kv-disk-dir " + dir + " --json", &rc));
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(stats["blocks"], after.blocks);
  EXPECT_EQ(stats["partial_files"], after.temps);
  EXPECT_EQ(stats["abandoned_partial_files"], after.temps);
  EXPECT_EQ(stats["invalid_files"], 0) << "a torn file under a block's final name";
  const auto gc = nlohmann::json::parse(run_cli("kv gc --kv-disk-dir " + dir + " --json", &rc));
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(gc["partial_files_removed"], after.temps);
  EXPECT_EQ(gc["removed"], 0);
  EXPECT_EQ(gc["kept"], after.blocks);
  EXPECT_EQ(count_files(dir).temps, 0);

  // Every block left loads, verified, bit-exact (a restart: a fresh tier on the directory).
  DiskConfig dc;
  dc.dir = dir;
  dc.fingerprint = fp;
  dc.block_bytes = kBytes;
  dc.capacity_bytes = size_t(1) << 40;
  DiskTier disk(dc);
  std::vector<std::byte> got(kBytes), want(kBytes);
  int loaded = 0;
  // Every writer's keys: all rounds, which may be more than 8 (the loop above goes on until a kill
  // leaves a partial file); a writer writes tens of 24 MiB blocks, far below its range of 1000.
  for (int round = 0; round < rounds; ++round)
    for (uint64_t i = 0; i < 1000; ++i) {
      const BlockHash k{uint64_t(round) * 1000 + i, 5};
      if (!fs::exists(disk.path_of(k))) continue;
      std::mutex mu;
      std::condition_variable cv;
      int ok = -1;
      disk.read(k, got.data(), "chat", [&](bool good) {
        std::lock_guard<std::mutex> lk(mu);
        ok = good;
        cv.notify_all();
      });
      std::unique_lock<std::mutex> lk(mu);
      cv.wait(lk, [&] { return ok >= 0; });
      ASSERT_EQ(ok, 1) << "block " << k.lo << " is on disk but does not load";
      fill_pattern(k, want.data(), kBytes);
      ASSERT_EQ(std::memcmp(got.data(), want.data(), kBytes), 0) << "block " << k.lo << " differs";
      loaded++;
    }
  EXPECT_EQ(loaded, after.blocks);
  EXPECT_EQ(disk.stats().errors, 0);
  fs::remove_all(dir);
}

std::vector<std::vector<int>> random_prompts(int n, int tokens, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<std::vector<int>> out(size_t(n), std::vector<int>(size_t(tokens), 0));
  for (auto& p : out)
    for (int& t : p) t = 10 + int(g() % 8000u);
  return out;
}

std::string text_of(const nlohmann::json& j) {
  return j.is_object() ? j["choices"][0]["text"].get<std::string>() : std::string("<no reply>");
}

TEST(KvCrash, ServeKilledUnderLoadRestartsOnIntactBlocks) {
  const std::string dir = testing::temp_dir("kvcrash", "serve");
  const auto prompts = random_prompts(24, 6 * 64 + 10, 1234);
  // What a server without tiers answers.
  std::vector<std::string> want;
  {
    auto ref = serve({});
    ASSERT_GT(ref.port(), 0) << ref.log();
    for (const auto& p : prompts) want.push_back(text_of(complete(ref.port(), p, 8)));
  }
  const std::vector<std::string> tiers = {"--kv-disk-dir", dir, "--kv-host-gb", "0.05"};
  DirCount at_kill;
  {
    auto s1 = serve(tiers);
    ASSERT_GT(s1.port(), 0) << s1.log();
    // Load: four clients going round the prompts until the kill.
    std::atomic<bool> stop{false};
    std::vector<std::thread> clients;
    for (int c = 0; c < 4; ++c)
      clients.emplace_back([&, c] {
        for (size_t i = size_t(c); !stop; i += 4) complete(s1.port(), prompts[i % prompts.size()], 1);
      });
    const auto t0 = std::chrono::steady_clock::now();
    while (count_files(dir).blocks < 40 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::mt19937 rng(std::random_device{}());
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 100));
    s1.kill_now();  // mid-write, under load
    stop = true;
    for (auto& t : clients) t.join();
    at_kill = count_files(dir);
  }
  std::printf("[figures] serve killed with %d block files and %d partial files on disk\n", at_kill.blocks,
              at_kill.temps);
  ASSERT_GE(at_kill.blocks, 40);
  // Every block file the dead server left is whole.
  BlockHash fingerprint;
  for (auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().extension() != ".kvb") continue;
    BlockFileHeader h;
    ASSERT_EQ(read_block_header(e.path().string(), &h, nullptr), BlockFileStatus::kOk) << e.path();
    std::vector<std::byte> payload(h.payload_bytes);
    ASSERT_EQ(read_block_file(e.path().string(), h.fingerprint, h.key, h.payload_bytes, payload.data(), &h),
              BlockFileStatus::kOk)
        << e.path();
    fingerprint = h.fingerprint;
  }
  // Then the first block of a prompt (a block the restarted server will read) is corrupted on
  // purpose: a flipped payload byte, the header still valid. It must never be served.
  std::string corrupted;
  for (const auto& p : prompts) {
    const std::string hex = key_hex(tier_key(block_hashes(p, "", 1)[0], fingerprint));
    const std::string path = dir + "/" + key_hex(fingerprint) + "/" + hex.substr(0, 2) + "/" + hex + ".kvb";
    if (fs::exists(path)) {
      corrupted = path;
      break;
    }
  }
  ASSERT_FALSE(corrupted.empty()) << "no prompt's first block survived";
  {
    std::fstream f(corrupted, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(kBlockFileHeaderBytes + 100));
    f.put('\x5a' ^ char(f.peek()));
  }
  {
    auto s2 = serve(tiers);
    ASSERT_GT(s2.port(), 0) << s2.log();
    int64_t cached = 0, from_disk = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto j = complete(s2.port(), prompts[i], 8);
      ASSERT_TRUE(j.is_object()) << "prompt " << i << "\n" << s2.log();
      EXPECT_EQ(text_of(j), want[i]) << "prompt " << i << " after the restart";
      cached += j["usage"]["prompt_cache_hit_tokens"].get<int64_t>();
      from_disk += j["usage"]["prompt_cache_hit_tokens_by_tier"]["disk"].get<int64_t>();
      EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], j["usage"]["prompt_cache_hit_tokens"]);
    }
    EXPECT_GT(from_disk, 0) << "the surviving blocks should be served from the file tier";
    EXPECT_GE(cached, from_disk);
    const std::string m = server::testing::http_get(s2.port(), "/metrics").body;
    EXPECT_GT(sample(m, "beluga_kv_tier_hits_total", {"tier=\"disk\""}), 0) << m;
    EXPECT_GE(sample(m, "beluga_kv_tier_errors_total", {"tier=\"disk\""}), 1)
        << "the corrupted block should have failed its checksum";
    EXPECT_EQ(sample(m, "beluga_kv_hit_tokens_total", {"tier=\"disk\"", "traffic_class=\"chat\""}),
              double(from_disk));
    if (fs::exists(corrupted)) {  // removed when its checksum failed, and written anew when recomputed
      BlockFileHeader h;
      std::vector<std::byte> payload(size_t(64) << 20);
      ASSERT_EQ(read_block_header(corrupted, &h, nullptr), BlockFileStatus::kOk);
      EXPECT_EQ(read_block_file(corrupted, fingerprint, h.key, h.payload_bytes, payload.data(), &h),
                BlockFileStatus::kOk);
    }
    // The restarted server's scan removes what the dead one left half-written.
    double removed = -1;
    for (int i = 0; i < 100 && removed != double(at_kill.temps); ++i) {
      if (i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      removed = sample(server::testing::http_get(s2.port(), "/metrics").body,
                       "beluga_kv_tier_partial_files_removed_total", {"tier=\"disk\""});
    }
    EXPECT_EQ(removed, double(at_kill.temps));
    EXPECT_EQ(count_files(dir).temps, 0);
  }
  int rc = 0;
  const auto gc = nlohmann::json::parse(run_cli("kv gc --kv-disk-dir " + dir + " --json", &rc));
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(gc["removed"], 0);
  EXPECT_GT(gc["kept"].get<int>(), 0);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace beluga::kv
