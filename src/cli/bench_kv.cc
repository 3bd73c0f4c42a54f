// `beluga bench kv --model DIR --load-format dummy [--kv-disk-dir DIR] [--lengths 2048,16384]
//   [--prefix-frac 0.9] [--blocks 256] [--json]`; with --agent-trace, the multi-turn agent trace of
//   bench_kv_agent.h instead.
//
// 1. Bandwidth, each against the machine's own rate measured here: host tier store/load (the
//    device <-> host block copies, Ops::kv_block_to_host/_from_host) against memcpy; file tier store
//    (DiskTier writes + sync) against one sequential file write + fsync; file tier load (reads with
//    checksum verification, page cache dropped first) against one sequential file read.
// 2. TTFT of a request whose first prefix-frac of the prompt sits in the host tier, in the file tier
//    (a fresh store on the directory, page cache dropped: a restart), against recomputing it: the
//    cold run of the same prompt with another suffix, which writes the prefix down (write-through;
//    the copies cost block bytes at the host store rate above, a small part of a prefill).
#include "cli/bench_kv.h"

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>

#include "cli/args.h"
#include "cli/bench_kv_agent.h"
#include "cli/model_args.h"
#include "engine/engine.h"
#include "kvstore/disk_tier.h"
#include "kvstore/fingerprint.h"
#include "kvstore/tiered_store.h"
#include "model/batch.h"
#include "util/error.h"
#include "util/file.h"

namespace beluga::cli {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Writes the page cache of every file under `dir` back and drops it, so the next reads come from
// the device (root is not needed: POSIX_FADV_DONTNEED on clean pages).
void drop_cache(const std::string& dir) {
  ::sync();
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const int fd = ::open(it->path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

double gbps(double bytes, double s) {
  return bytes / s / 1e9;
}

struct Bandwidth {
  double memcpy_gbps = 0, host_store_gbps = 0, host_load_gbps = 0;
  double file_write_gbps = 0, file_read_gbps = 0, disk_store_gbps = 0, disk_load_gbps = 0;
};

Bandwidth measure_bandwidth(const LoadedModel& m, const std::string& disk_dir, int nblocks) {
  Bandwidth bw;
  const size_t block = m.model->kv_bytes_per_token() * kKvBlockSize;
  const size_t total = block * size_t(nblocks);
  std::vector<std::byte> a(total), b(total);
  std::memset(a.data(), 1, total);
  std::memset(b.data(), 2, total);
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), total);
    best = std::min(best, since(t0));
  }
  bw.memcpy_gbps = gbps(double(total), best);
  // Host tier: the runner's block copies between the KV cache and host slots.
  KvCache kv = m.model->make_kv_cache(nblocks);
  Ops& ops = *m.ops;
  ops.bind_thread();
  double st = 1e30, ld = 1e30;
  for (int r = 0; r < 5; ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < nblocks; ++i) ops.kv_block_to_host(kv.layers, i, a.data() + size_t(i) * block);
    ops.synchronize();
    st = std::min(st, since(t0));
    t0 = Clock::now();
    for (int i = 0; i < nblocks; ++i) ops.kv_block_from_host(kv.layers, i, a.data() + size_t(i) * block);
    ops.synchronize();
    ld = std::min(ld, since(t0));
  }
  bw.host_store_gbps = gbps(double(total), st);
  bw.host_load_gbps = gbps(double(total), ld);
  if (disk_dir.empty()) return bw;
  // The machine's sequential file rates, on the same file system.
  const std::string dir = disk_dir + "/bench-bw";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string big = dir + "/sequential";
  {
    const auto t0 = Clock::now();
    const int fd = ::open(big.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    BELUGA_CHECK(fd >= 0, "cannot write ", big);
    for (size_t off = 0; off < total;) {
      const ssize_t w = ::write(fd, a.data() + off, std::min<size_t>(total - off, size_t(8) << 20));
      BELUGA_CHECK(w > 0, "write failed on ", big);
      off += size_t(w);
    }
    ::fsync(fd);  // written back to the device (sync() would also flush other processes' writes)
    ::close(fd);
    bw.file_write_gbps = gbps(double(total), since(t0));
  }
  drop_cache(dir);
  {
    const auto t0 = Clock::now();
    const int fd = ::open(big.c_str(), O_RDONLY | O_CLOEXEC);
    for (size_t off = 0; off < total;) {
      const ssize_t r = ::read(fd, b.data() + off, std::min<size_t>(total - off, size_t(8) << 20));
      BELUGA_CHECK(r > 0, "read failed on ", big);
      off += size_t(r);
    }
    ::close(fd);
    bw.file_read_gbps = gbps(double(total), since(t0));
  }
  fs::remove(big);
  // File tier: block files through its I/O pool.
  kv::DiskConfig dc;
  dc.dir = dir;
  dc.block_bytes = block;
  dc.fingerprint = {0xbe, 0xbc};
  std::vector<BlockHash> keys;
  for (int i = 0; i < nblocks; ++i) keys.push_back({uint64_t(i) * 7919 + 1, 77});
  {
    kv::DiskTier disk(dc);
    const auto t0 = Clock::now();
    for (int i = 0; i < nblocks; ++i)
      disk.write(keys[size_t(i)], a.data() + size_t(i) * block, "chat", [] {});
    disk.drain();
    for (const BlockHash& k : keys) {  // each file written back, as the sequential file above
      const int fd = ::open(disk.path_of(k).c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      ::fsync(fd);
      ::close(fd);
    }
    bw.disk_store_gbps = gbps(double(total), since(t0));
  }
  drop_cache(dir);
  {
    kv::DiskTier disk(dc);
    std::mutex mu;
    std::condition_variable cv;
    int left = nblocks, ok = 0;
    const auto t0 = Clock::now();
    for (int i = 0; i < nblocks; ++i)
      disk.read(keys[size_t(i)], b.data() + size_t(i) * block, "chat", [&](bool good) {
        std::lock_guard<std::mutex> lk(mu);
        ok += good;
        if (--left == 0) cv.notify_all();
      });
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return left == 0; });
    bw.disk_load_gbps = gbps(double(total), since(t0));
    BELUGA_CHECK(ok == nblocks, "bench kv: ", nblocks - ok, " block files failed to load");
  }
  fs::remove_all(dir);
  return bw;
}

// Submits `prompt` (one token wanted) and returns the seconds to its first token.
double ttft(Engine& e, const std::vector<int>& prompt, int* cached) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string error;
  EngineRequest r;
  r.id = "bench";
  r.prompt = prompt;
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 1;
  r.sampling.ignore_eos = true;
  r.on_output = [&](RequestOutput&& o) {
    std::lock_guard<std::mutex> lk(mu);
    *cached = o.cached_tokens;
    if (!o.error.empty()) error = o.error;
    if (o.finished) {
      done = true;
      cv.notify_all();
    }
  };
  const auto t0 = Clock::now();
  std::string why;
  BELUGA_CHECK(e.submit(std::move(r), &why) == SubmitStatus::kOk, "bench kv: ", why);
  std::unique_lock<std::mutex> lk(mu);
  cv.wait(lk, [&] { return done; });
  BELUGA_CHECK(error.empty(), "bench kv: ", error);
  return since(t0);
}

}  // namespace

int bench_kv(int argc, char** argv) {
  Args args = Args::for_command(argc, argv, "bench kv");
  if (args.has("agent-trace")) {
    args.not_with({"lengths", "prefix-frac", "blocks"}, "with --agent-trace");
    return bench_kv_agent(args);
  }
  args.not_with({"sessions", "turns", "concurrency", "system-tokens", "turn-tokens", "answer-tokens",
                 "device-blocks", "kv-host-gb", "json-out"},
                "without --agent-trace");
  const std::string disk_dir = args.get_or("kv-disk-dir", "");
  const std::vector<int> lengths = parse_int_list(args.get_or("lengths", "2048,16384"));
  const double frac = args.get_double("prefix-frac", 0.9);
  const int nblocks = int(args.get_int("blocks", 256));
  const bool json = args.has("json");
  BELUGA_CHECK(frac > 0 && frac < 1 && nblocks > 0, "--prefix-frac in (0, 1), --blocks > 0");
  LoadedModel m = load_model_from_args(args);
  args.check_all_used();
  const size_t block = m.model->kv_bytes_per_token() * kKvBlockSize;
  const BlockHash fp = kv::model_fingerprint(read_file(m.config_path), m.weights_digest, m.ops->act_dtype(),
                                             m.model->kv_bytes_per_token(), kKvBlockSize);
  nlohmann::ordered_json out;
  out["model"] = m.dir;
  out["block_bytes"] = block;
  out["threads"] = m.cpu ? m.cpu->threads() : 0;

  const Bandwidth bw = measure_bandwidth(m, disk_dir, nblocks);
  out["bandwidth_gbps"] = {{"memcpy", bw.memcpy_gbps},
                           {"host_store", bw.host_store_gbps},
                           {"host_load", bw.host_load_gbps},
                           {"file_seq_write_fsync", bw.file_write_gbps},
                           {"file_seq_read_cold", bw.file_read_gbps},
                           {"disk_tier_store_sync", bw.disk_store_gbps},
                           {"disk_tier_load_cold", bw.disk_load_gbps}};
  if (!json) {
    std::printf("block %zu bytes, %d blocks (%.1f MiB) per measurement\n", block, nblocks,
                double(block) * nblocks / (1 << 20));
    std::printf(
        "host tier  store %6.2f GB/s  load %6.2f GB/s   memcpy %6.2f GB/s  (store %3.0f%%, load %3.0f%%)\n",
        bw.host_store_gbps, bw.host_load_gbps, bw.memcpy_gbps, 100 * bw.host_store_gbps / bw.memcpy_gbps,
        100 * bw.host_load_gbps / bw.memcpy_gbps);
    if (!disk_dir.empty())
      std::printf(
          "disk tier  store %6.2f GB/s (seq write+fsync %6.2f: %3.0f%%)  load %6.2f GB/s (seq read, cold "
          "%6.2f: "
          "%3.0f%%)\n",
          bw.disk_store_gbps, bw.file_write_gbps, 100 * bw.disk_store_gbps / bw.file_write_gbps,
          bw.disk_load_gbps, bw.file_read_gbps, 100 * bw.disk_load_gbps / bw.file_read_gbps);
  }

  std::mt19937 g(7);
  const int V = m.cfg.vocab_size;
  for (int len : lengths) {
    BELUGA_CHECK(len <= m.model->max_positions(), "--lengths: ", len, " is past the model's ",
                 m.model->max_positions(), " positions (raise max_position_embeddings / --max-model-len)");
    const int prefix = int(double(len) * frac) / kKvBlockSize * kKvBlockSize;
    std::vector<int> a(static_cast<size_t>(len));
    for (int& t : a) t = 2 + int(g() % uint32_t(V - 2));
    std::vector<int> b = a;
    for (int i = prefix; i < len; ++i) b[size_t(i)] = 2 + int(g() % uint32_t(V - 2));  // another suffix
    EngineConfig ec;
    ec.num_kv_blocks = (len + kKvBlockSize - 1) / kKvBlockSize * 2 + 4;
    ec.max_model_len = len + 8;
    nlohmann::ordered_json row;
    row["tokens"] = len;
    row["prefix_tokens"] = prefix;
    int cached = 0;
    kv::StoreConfig sc;
    sc.block_bytes = block;
    sc.fingerprint = fp;
    sc.host_bytes = size_t(ec.num_kv_blocks) * block;
    const std::string dir = disk_dir.empty() ? "" : disk_dir + "/bench-ttft";
    if (!dir.empty()) fs::remove_all(dir);
    sc.disk_dir = dir;
    {
      kv::TieredStore store(sc);
      EngineConfig c = ec;
      c.kv_connector = &store;
      {  // recompute: a cold run, which also writes the prefix down (write-through)
        Engine e(*m.model, c);
        row["recompute_s"] = ttft(e, a, &cached);
      }
      store.drain();
      double best = 1e30;
      for (int r = 0; r < 2; ++r) {  // the best of two (the first one also warms the new shapes up)
        Engine e(*m.model, c);       // an empty device pool: the prefix comes from the host tier
        best = std::min(best, ttft(e, b, &cached));
      }
      row["host_hit_s"] = best;
      row["host_cached_tokens"] = cached;
    }
    if (!dir.empty()) {
      double best = 1e30;
      for (int r = 0; r < 2; ++r) {
        drop_cache(dir);
        kv::TieredStore store(sc);  // a restart: only the files hold the prefix
        EngineConfig c = ec;
        c.kv_connector = &store;
        Engine e(*m.model, c);
        best = std::min(best, ttft(e, b, &cached));
        store.drain();
      }
      row["disk_hit_s"] = best;
      row["disk_cached_tokens"] = cached;
      fs::remove_all(dir);
    }
    if (!json) {
      std::printf("TTFT %6d tokens (%d in a tier): recompute %8.3f s | host hit %8.3f s (%4.1f%%)", len,
                  prefix, row["recompute_s"].get<double>(), row["host_hit_s"].get<double>(),
                  100 * row["host_hit_s"].get<double>() / row["recompute_s"].get<double>());
      if (row.contains("disk_hit_s"))
        std::printf(" | disk hit %8.3f s (%4.1f%%)", row["disk_hit_s"].get<double>(),
                    100 * row["disk_hit_s"].get<double>() / row["recompute_s"].get<double>());
      std::printf("\n");
      std::fflush(stdout);
    }
    out["ttft"].push_back(row);
  }
  if (json) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace beluga::cli
