// `beluga bench kv --model DIR --load-format dummy [--kv-disk-dir DIR] [--lengths 2048,16384]
//   [--prefix-frac 0.9] [--blocks 256] [--kv-disk-io auto|io_uring|threads] [--kv-disk-sync none|data|full]
//   [--io-block-bytes N] [--repeat 3] [--bandwidth-only] [--json]`; with --agent-trace, the multi-turn agent
//   trace of bench_kv_agent.h instead.
//
// 1. Bandwidth, each against the machine's own rate measured here: host tier store/load (the
//    device <-> host block copies, Ops::kv_block_to_host/_from_host) against memcpy; the file tier
//    through each I/O path (threads, and io_uring where the kernel allows it) and each sync mode, in
//    GB/s and files/s (block files of --io-block-bytes, default the model's block): store (drained:
//    in the page cache with sync none, on the device with data/full) against one sequential file of
//    the same bytes written (and fsync'ed); load (reads with checksum verification, checked bit-exact) with
//    the page cache dropped and from it, against that file read cold and warm; each the best of --repeat. The
//    headline store/load line is the path --kv-disk-io picks, store with sync data, load cold.
//    --bandwidth-only stops there.
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

struct FileTierRow {
  std::string io, sync;
  double store_gbps = 0, store_files_s = 0;          // drained: in the page cache, or synced per file
  double load_cold_gbps = 0, load_cold_files_s = 0;  // page cache dropped first
  double load_warm_gbps = 0, load_warm_files_s = 0;  // from the page cache
};

struct Bandwidth {
  double memcpy_gbps = 0, host_store_gbps = 0, host_load_gbps = 0;
  double file_write_gbps = 0, file_read_gbps = 0, disk_store_gbps = 0, disk_load_gbps = 0;
  double file_write_cached_gbps = 0, file_read_warm_gbps = 0;
  std::vector<FileTierRow> file_tier;  // per I/O path and sync mode
  std::string io_note;                 // why io_uring was not measured, if it was not
};

// Reads `nblocks` blocks through `disk` into `dst`; returns the seconds.
double tier_load(kv::DiskTier& disk, const std::vector<BlockHash>& keys, std::byte* dst, size_t block) {
  std::mutex mu;
  std::condition_variable cv;
  int left = int(keys.size()), ok = 0;
  const auto t0 = Clock::now();
  for (size_t i = 0; i < keys.size(); ++i)
    disk.read(keys[i], dst + i * block, "chat", [&](bool good) {
      std::lock_guard<std::mutex> lk(mu);
      ok += good;
      if (--left == 0) cv.notify_all();
    });
  std::unique_lock<std::mutex> lk(mu);
  cv.wait(lk, [&] { return left == 0; });
  const double s = since(t0);
  BELUGA_CHECK(ok == int(keys.size()), "bench kv: ", int(keys.size()) - ok, " block files failed to load");
  return s;
}

// The file tier through one I/O path and sync mode, on `dir` (emptied first): store, then (sync none)
// loads cold and warm, checked bit-exact against what was stored.
FileTierRow measure_file_tier(const std::string& dir, kv::IoMode io, kv::BlockSync sync,
                              const std::vector<std::byte>& a, std::vector<std::byte>& b, size_t block,
                              int nblocks) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  FileTierRow row;
  row.sync = kv::block_sync_name(sync);
  kv::DiskConfig dc;
  dc.dir = dir;
  dc.block_bytes = block;
  dc.fingerprint = {0xbe, 0xbc};
  dc.io.mode = io;
  dc.io.sync = sync;
  std::vector<BlockHash> keys;
  for (int i = 0; i < nblocks; ++i) keys.push_back({uint64_t(i) * 7919 + 1, 77});
  const double total = double(block) * nblocks;
  {
    kv::DiskTier disk(dc);
    row.io = disk.io_uring() ? "io_uring" : "threads";
    const auto t0 = Clock::now();
    for (int i = 0; i < nblocks; ++i)
      disk.write(keys[size_t(i)], a.data() + size_t(i) * block, "chat", [] {});
    disk.drain();
    const double st = since(t0);
    row.store_gbps = gbps(total, st);
    row.store_files_s = nblocks / st;
    if (sync != kv::BlockSync::kNone) return row;
  }
  kv::DiskTier disk(dc);  // a restart: its scan reads every header, so the cache is dropped after it
  for (int i = 0; i < 2000 && !disk.scan_done(); ++i) ::usleep(1000);
  drop_cache(dir);
  std::memset(b.data(), 0, b.size());
  double s = tier_load(disk, keys, b.data(), block);
  BELUGA_CHECK(std::memcmp(a.data(), b.data(), size_t(total)) == 0, "bench kv: a block loaded wrong");
  row.load_cold_gbps = gbps(total, s);
  row.load_cold_files_s = nblocks / s;
  s = tier_load(disk, keys, b.data(), block);
  row.load_warm_gbps = gbps(total, s);
  row.load_warm_files_s = nblocks / s;
  return row;
}

Bandwidth measure_bandwidth(const LoadedModel& m, const std::string& disk_dir, int nblocks, size_t io_block,
                            kv::IoMode io, int repeat) {
  Bandwidth bw;
  const size_t block = m.model->kv_bytes_per_token() * kKvBlockSize;
  const size_t total = std::max(block, io_block) * size_t(nblocks);
  std::vector<std::byte> a(total), b(total);
  std::mt19937_64 g(5);  // not a constant: a file system that compresses or dedupes cannot shortcut it
  for (size_t i = 0; i + 8 <= total; i += 8) {
    const uint64_t x = g();
    std::memcpy(a.data() + i, &x, 8);
  }
  std::memset(b.data(), 2, total);
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), block * size_t(nblocks));
    best = std::min(best, since(t0));
  }
  bw.memcpy_gbps = gbps(double(block * size_t(nblocks)), best);
  // Host tier: the runner's block copies between the KV cache and host slots.
  KvCache kv = m.model->make_kv_cache(nblocks);
  Ops& ops = *m.ops;
  ops.bind_thread();
  double st = 1e30, ld = 1e30;
  for (int r = 0; r < 5; ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < nblocks; ++i) ops.kv_block_to_host(kv.layers, i, b.data() + size_t(i) * block);
    ops.synchronize();
    st = std::min(st, since(t0));
    t0 = Clock::now();
    for (int i = 0; i < nblocks; ++i) ops.kv_block_from_host(kv.layers, i, b.data() + size_t(i) * block);
    ops.synchronize();
    ld = std::min(ld, since(t0));
  }
  bw.host_store_gbps = gbps(double(block * size_t(nblocks)), st);
  bw.host_load_gbps = gbps(double(block * size_t(nblocks)), ld);
  if (disk_dir.empty()) return bw;
  // The machine's sequential file rates, on the same file system: the same bytes as one file.
  const size_t fbytes = io_block * size_t(nblocks);
  const std::string dir = disk_dir + "/bench-bw";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string big = dir + "/sequential";
  for (int r = 0; r < repeat; ++r) {  // the best of `repeat`, as the file tier's rows
    {
      const auto t0 = Clock::now();
      const int fd = ::open(big.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      BELUGA_CHECK(fd >= 0, "cannot write ", big);
      for (size_t off = 0; off < fbytes;) {
        const ssize_t w = ::write(fd, a.data() + off, std::min<size_t>(fbytes - off, size_t(8) << 20));
        BELUGA_CHECK(w > 0, "write failed on ", big);
        off += size_t(w);
      }
      bw.file_write_cached_gbps = std::max(bw.file_write_cached_gbps, gbps(double(fbytes), since(t0)));
      ::fsync(fd);  // written back to the device (sync() would also flush other processes' writes)
      ::close(fd);
      bw.file_write_gbps = std::max(bw.file_write_gbps, gbps(double(fbytes), since(t0)));
    }
    drop_cache(dir);
    for (int pass = 0; pass < 2; ++pass) {  // cold, then from the page cache
      const auto t0 = Clock::now();
      const int fd = ::open(big.c_str(), O_RDONLY | O_CLOEXEC);
      for (size_t off = 0; off < fbytes;) {
        const ssize_t n = ::read(fd, b.data() + off, std::min<size_t>(fbytes - off, size_t(8) << 20));
        BELUGA_CHECK(n > 0, "read failed on ", big);
        off += size_t(n);
      }
      ::close(fd);
      double& best = pass == 0 ? bw.file_read_gbps : bw.file_read_warm_gbps;
      best = std::max(best, gbps(double(fbytes), since(t0)));
    }
  }
  fs::remove(big);
  // File tier: block files through each I/O path (io_uring where the kernel allows it) and sync mode.
  std::vector<kv::IoMode> paths = {kv::IoMode::kThreads};
  if (kv::uring_available(&bw.io_note)) paths.push_back(kv::IoMode::kUring);
  for (kv::IoMode p : paths)
    for (kv::BlockSync sync : {kv::BlockSync::kNone, kv::BlockSync::kData, kv::BlockSync::kFull}) {
      FileTierRow best = measure_file_tier(dir, p, sync, a, b, io_block, nblocks);
      for (int r = 1; r < repeat; ++r) {  // the best of `repeat`: the machine may be shared
        const FileTierRow x = measure_file_tier(dir, p, sync, a, b, io_block, nblocks);
        best.store_gbps = std::max(best.store_gbps, x.store_gbps);
        best.store_files_s = std::max(best.store_files_s, x.store_files_s);
        best.load_cold_gbps = std::max(best.load_cold_gbps, x.load_cold_gbps);
        best.load_cold_files_s = std::max(best.load_cold_files_s, x.load_cold_files_s);
        best.load_warm_gbps = std::max(best.load_warm_gbps, x.load_warm_gbps);
        best.load_warm_files_s = std::max(best.load_warm_files_s, x.load_warm_files_s);
      }
      bw.file_tier.push_back(best);
    }
  // The headline numbers, of the path `io` picks (auto: io_uring when available): the store with
  // each file fdatasync'ed (on the device, as the sequential file after its fsync: an fsync of every
  // file after the writes would be one journal commit after another), the load cold.
  const bool want_uring = io != kv::IoMode::kThreads && paths.size() > 1;
  for (const FileTierRow& r : bw.file_tier)
    if ((r.io == "io_uring") == want_uring) {
      if (r.sync == "data") bw.disk_store_gbps = r.store_gbps;
      if (r.sync == "none") bw.disk_load_gbps = r.load_cold_gbps;
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
    args.not_with({"lengths", "prefix-frac", "blocks", "kv-disk-io", "kv-disk-sync", "io-block-bytes",
                   "repeat", "bandwidth-only"},
                  "with --agent-trace");
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
  const bool bandwidth_only = args.has("bandwidth-only");
  BELUGA_CHECK(frac > 0 && frac < 1 && nblocks > 0, "--prefix-frac in (0, 1), --blocks > 0");
  kv::DiskIoOptions disk_io;
  const std::string io_s = args.get_or("kv-disk-io", "auto"), sync_s = args.get_or("kv-disk-sync", "none");
  BELUGA_CHECK(kv::parse_io_mode(io_s, &disk_io.mode), "--kv-disk-io must be auto, io_uring or threads");
  BELUGA_CHECK(kv::parse_block_sync(sync_s, &disk_io.sync), "--kv-disk-sync must be none, data or full");
  const long io_block_arg = args.get_int("io-block-bytes", 0);
  const int repeat = int(args.get_int("repeat", 3));
  BELUGA_CHECK(repeat >= 1, "--repeat must be >= 1");
  BELUGA_CHECK(io_block_arg >= 0, "--io-block-bytes must be >= 0");
  LoadedModel m = load_model_from_args(args);
  args.check_all_used();
  const size_t block = m.model->kv_bytes_per_token() * kKvBlockSize;
  const size_t io_block = io_block_arg > 0 ? size_t(io_block_arg) : block;
  const BlockHash fp = kv::model_fingerprint(read_file(m.config_path), m.weights_digest, m.ops->act_dtype(),
                                             m.model->kv_bytes_per_token(), kKvBlockSize);
  nlohmann::ordered_json out;
  out["model"] = m.dir;
  out["block_bytes"] = block;
  out["threads"] = m.cpu ? m.cpu->threads() : 0;

  const Bandwidth bw = measure_bandwidth(m, disk_dir, nblocks, io_block, disk_io.mode, repeat);
  out["bandwidth_gbps"] = {{"memcpy", bw.memcpy_gbps},
                           {"host_store", bw.host_store_gbps},
                           {"host_load", bw.host_load_gbps},
                           {"file_seq_write", bw.file_write_cached_gbps},
                           {"file_seq_write_fsync", bw.file_write_gbps},
                           {"file_seq_read_cold", bw.file_read_gbps},
                           {"file_seq_read_warm", bw.file_read_warm_gbps},
                           {"disk_tier_store_sync", bw.disk_store_gbps},
                           {"disk_tier_load_cold", bw.disk_load_gbps}};
  if (!disk_dir.empty()) {
    out["file_tier_block_bytes"] = io_block;
    if (!bw.io_note.empty()) out["io_uring_unavailable"] = bw.io_note;
    for (const FileTierRow& r : bw.file_tier)
      out["file_tier"].push_back({{"io", r.io},
                                  {"sync", r.sync},
                                  {"store_gbps", r.store_gbps},
                                  {"store_files_per_s", r.store_files_s},
                                  {"load_cold_gbps", r.load_cold_gbps},
                                  {"load_cold_files_per_s", r.load_cold_files_s},
                                  {"load_warm_gbps", r.load_warm_gbps},
                                  {"load_warm_files_per_s", r.load_warm_files_s}});
  }
  if (!json) {
    std::printf("block %zu bytes, %d blocks (%.1f MiB) per measurement\n", block, nblocks,
                double(block) * nblocks / (1 << 20));
    std::printf(
        "host tier  store %6.2f GB/s  load %6.2f GB/s   memcpy %6.2f GB/s  (store %3.0f%%, load %3.0f%%)\n",
        bw.host_store_gbps, bw.host_load_gbps, bw.memcpy_gbps, 100 * bw.host_store_gbps / bw.memcpy_gbps,
        100 * bw.host_load_gbps / bw.memcpy_gbps);
    if (!disk_dir.empty())
      std::printf(
          "disk tier  store %6.2f GB/s synced (seq write+fsync %6.2f: %3.0f%%)  load %6.2f GB/s (seq read, "
          "cold "
          "%6.2f: "
          "%3.0f%%)\n",
          bw.disk_store_gbps, bw.file_write_gbps, 100 * bw.disk_store_gbps / bw.file_write_gbps,
          bw.disk_load_gbps, bw.file_read_gbps, 100 * bw.disk_load_gbps / bw.file_read_gbps);
    if (!disk_dir.empty()) {
      std::printf(
          "file system: %zu bytes x %d as one file: write %.2f GB/s (+fsync %.2f), read cold %.2f GB/s, "
          "warm %.2f GB/s\n",
          io_block, nblocks, bw.file_write_cached_gbps, bw.file_write_gbps, bw.file_read_gbps,
          bw.file_read_warm_gbps);
      if (!bw.io_note.empty()) std::printf("io_uring not measured: %s\n", bw.io_note.c_str());
      std::printf("%-9s %-5s %17s %17s %17s\n", "file tier", "sync", "store GB/s files/s",
                  "load cold GB/s f/s", "load warm GB/s f/s");
      for (const FileTierRow& r : bw.file_tier) {
        std::printf("%-9s %-5s %7.2f %9.0f", r.io.c_str(), r.sync.c_str(), r.store_gbps, r.store_files_s);
        if (r.sync == "none")
          std::printf(" %8.2f %8.0f %8.2f %8.0f\n", r.load_cold_gbps, r.load_cold_files_s, r.load_warm_gbps,
                      r.load_warm_files_s);
        else
          std::printf("\n");
      }
    }
  }
  if (bandwidth_only) {
    if (json) std::printf("%s\n", out.dump(2).c_str());
    return 0;
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
    sc.disk_io = disk_io;
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
