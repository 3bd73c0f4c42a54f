#include "cli/bench_pd.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/bench_processes.h"
#include "cli/bench_serve.h"
#include "cli/model_args.h"
#include "kvstore/kv_receiver.h"
#include "kvstore/tcp_kv_transfer.h"
#include "kvstore/tiered_store.h"
#include "model/batch.h"
#include "util/error.h"

namespace beluga::cli {

namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The link's rate: `bytes` over `conns` loopback TCP connections at once (an equal share each), in
// writes of `chunk`, the readers only recv()ing. GB/s.
double loopback_rate(size_t bytes, size_t chunk, int conns) {
  std::vector<char> src(chunk, 'x');
  const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  BELUGA_CHECK(::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && ::listen(ls, conns) == 0 &&
                   ::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) == 0,
               "cannot listen on loopback");
  const size_t share = bytes / size_t(conns);
  std::vector<std::thread> readers, writers;
  for (int c = 0; c < conns; ++c)
    readers.emplace_back([ls, share] {
      const int fd = ::accept(ls, nullptr, nullptr);
      std::vector<char> buf(1 << 20);
      size_t got = 0;
      while (got < share) {
        const ssize_t n = ::recv(fd, buf.data(), buf.size(), 0);
        if (n <= 0) break;
        got += size_t(n);
      }
      const char ack = 1;
      (void)::send(fd, &ack, 1, MSG_NOSIGNAL);
      ::close(fd);
    });
  std::vector<int> fds;
  for (int c = 0; c < conns; ++c) {
    fds.push_back(::socket(AF_INET, SOCK_STREAM, 0));
    BELUGA_CHECK(::connect(fds.back(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0,
                 "cannot connect on loopback");
  }
  const auto t0 = Clock::now();
  for (int c = 0; c < conns; ++c)
    writers.emplace_back([fd = fds[size_t(c)], share, chunk, &src] {
      for (size_t sent = 0; sent < share;) {
        const ssize_t n = ::send(fd, src.data(), std::min(chunk, share - sent), MSG_NOSIGNAL);
        BELUGA_CHECK(n > 0, "loopback send failed");
        sent += size_t(n);
      }
      char ack = 0;
      (void)::recv(fd, &ack, 1, 0);  // the reader has everything
    });
  for (auto& t : writers) t.join();
  const double s = since(t0);
  for (int fd : fds) ::close(fd);
  for (auto& t : readers) t.join();
  ::close(ls);
  return double(share * size_t(conns)) / s / 1e9;
}

// The transfer: `n` blocks of `block_bytes` from one store's host tier to a receiver's, over
// TcpKvTransfer in at most `conns` connections (a new key set each time, so every block is stored).
class TransferRig {
 public:
  TransferRig(size_t block_bytes, int n, int conns) : n_(n), block_bytes_(block_bytes) {
    kv::StoreConfig c;
    c.block_bytes = block_bytes;
    c.fingerprint = {0xbe1, 0x9a};
    c.host_bytes = size_t(n) * block_bytes;
    from_ = std::make_unique<kv::TieredStore>(c);
    to_ = std::make_unique<kv::TieredStore>(c);
    kv::ReceiverConfig rc;
    rc.fingerprint = c.fingerprint;
    rc.block_bytes = block_bytes;
    rc.threads = std::max(conns, 1);
    rx_ = std::make_unique<kv::KvReceiver>(rc, *to_);
    kv::TcpTransferConfig tc;
    tc.fingerprint = c.fingerprint;
    tc.block_bytes = block_bytes;
    tc.connections = conns;
    tx_ = std::make_unique<kv::TcpKvTransfer>(tc);
    run();  // unmeasured: both host tiers' pages are touched once, as in a serving engine's warm tier
  }

  // One transfer's rate, GB/s.
  double run() {
    std::vector<BlockHash> keys;
    for (int i = 0; i < n_; ++i) {
      keys.push_back({uint64_t(round_) * 1000003u + uint64_t(i) + 1, 0x5eed});
      auto slot = from_->begin_import(keys.back(), "chat");
      BELUGA_CHECK(slot.dst, "the sender's host tier is full");
      std::fill(slot.dst, slot.dst + block_bytes_, std::byte(i & 0xff));
      from_->end_import(slot.slot, true);
    }
    ++round_;
    auto pinned = from_->pin_host_blocks(keys.data(), n_);
    std::vector<kv::OutgoingBlock> out;
    for (int i = 0; i < pinned.size(); ++i) out.push_back({keys[size_t(i)], pinned.data(i)});
    const kv::TransferResult t = tx_->send(rx_->address(), "chat", out);
    BELUGA_CHECK(t.ok && t.accepted == n_, "the transfer failed: ", t.error);
    return double(t.bytes) / t.seconds / 1e9;
  }

 private:
  int n_, round_ = 0;
  size_t block_bytes_;
  std::unique_ptr<kv::TieredStore> from_, to_;
  std::unique_ptr<kv::KvReceiver> rx_;
  std::unique_ptr<kv::TcpKvTransfer> tx_;
};

Json spread(const std::vector<double>& v) {
  return {{"best", *std::max_element(v.begin(), v.end())},
          {"worst", *std::min_element(v.begin(), v.end())},
          {"all", v}};
}

std::vector<int> parse_cores(const std::string& s) {
  std::vector<int> out;
  for (size_t p = 0; p < s.size();) {
    const size_t c = s.find(',', p);
    out.push_back(std::stoi(s.substr(p, c == std::string::npos ? std::string::npos : c - p)));
    if (c == std::string::npos) break;
    p = c + 1;
  }
  return out;
}

}  // namespace

int bench_pd(int argc, char** argv) {
  Args args = Args::for_command(argc, argv, "bench pd");
  std::string model_dir = args.get_or("model", "");
  if (model_dir.empty()) model_dir = default_model_dir();
  const auto cores = parse_cores(args.get_or("cores", "0,1"));
  BELUGA_CHECK(cores.size() >= 2,
               "--cores needs two cores or more (prefill gets the first, decode the rest)");
  const long transfer_mb = args.get_int("transfer-mb", 256);
  const int repeat = int(args.get_int("repeat", 3));
  const int conns = int(args.get_int("connections", 4));
  const std::string kv_mb = std::to_string(args.get_int("kv-cache-mb", 256));
  const std::string out_path = args.get_or("out", "");
  const bool transfer_only = args.has("transfer-only");
  // Each engine's own options (e.g. --device cuda --load-format dummy --tokenizer DIR), split at spaces.
  std::vector<std::string> serve_args;
  const std::string serve_args_s = args.get_or("serve-args", "");
  for (size_t p = 0; p < serve_args_s.size();) {
    size_t e = serve_args_s.find(' ', p);
    if (e == std::string::npos) e = serve_args_s.size();
    if (e > p) serve_args.push_back(serve_args_s.substr(p, e - p));
    p = e + 1;
  }
  const long block_bytes_flag = args.get_int("block-bytes", 0);
  const std::string router_model = args.get_or("router-model", model_dir);
  std::vector<std::string> trace = {"--dataset",
                                    "random",
                                    "--num-prompts",
                                    std::to_string(args.get_int("num-prompts", 48)),
                                    "--input-len",
                                    std::to_string(args.get_int("input-len", 768)),
                                    "--output-len",
                                    std::to_string(args.get_int("output-len", 96)),
                                    "--request-rate",
                                    args.get_or("request-rate", "2"),
                                    "--max-concurrency",
                                    std::to_string(args.get_int("max-concurrency", 16)),
                                    "--seed",
                                    std::to_string(args.get_int("seed", 0))};
  BELUGA_CHECK(transfer_mb > 0 && repeat > 0 && conns > 0,
               "--transfer-mb, --repeat and --connections must be positive");
  args.check_all_used();

  // 1. The transfer against the link, in the model's blocks.
  size_t block_bytes = size_t(std::max(0L, block_bytes_flag));
  if (block_bytes == 0) {  // the model's (its weights loaded on the CPU: for a small model)
    ModelArgs ma;
    ma.dir = model_dir;
    ma.config_path = model_dir + "/config.json";
    LoadedModel m = load_model_dir(ma);
    block_bytes = m.model->kv_bytes_per_token() * kKvBlockSize;
  }
  const size_t bytes = size_t(transfer_mb) << 20;
  const int n = int(std::max<size_t>(1, bytes / block_bytes));
  // Each repeat measures all four, one after the other, so a busy machine's swings hit them alike.
  std::vector<double> link1, linkn, kv1, kvn;
  {
    TransferRig one(block_bytes, n, 1), many(block_bytes, n, conns);
    for (int r = 0; r < repeat; ++r) {
      link1.push_back(loopback_rate(size_t(n) * block_bytes, block_bytes, 1));
      linkn.push_back(loopback_rate(size_t(n) * block_bytes, block_bytes, conns));
      kv1.push_back(one.run());
      kvn.push_back(many.run());
    }
  }
  const auto best = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  const auto worst = [](const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); };
  std::printf("KV transfer, %d blocks of %zu bytes (%.0f MiB), best (worst) of %d:\n", n, block_bytes,
              double(size_t(n) * block_bytes) / double(1 << 20), repeat);
  std::printf("  loopback TCP (recv only), 1 connection     %7.2f (%5.2f) GB/s\n", best(link1), worst(link1));
  std::printf("  loopback TCP (recv only), %d connections    %7.2f (%5.2f) GB/s\n", conns, best(linkn),
              worst(linkn));
  std::printf("  TcpKvTransfer -> KvReceiver, 1 connection  %7.2f (%5.2f) GB/s  (%.0f%% of 1 connection)\n",
              best(kv1), worst(kv1), 100 * best(kv1) / best(link1));
  std::printf(
      "  TcpKvTransfer -> KvReceiver, %d connections %7.2f (%5.2f) GB/s  (%.0f%% of %d connections, %.0f%% "
      "of "
      "1)\n",
      conns, best(kvn), worst(kvn), 100 * best(kvn) / best(linkn), conns, 100 * best(kvn) / best(link1));
  Json j{{"transfer",
          {{"blocks", n},
           {"block_bytes", block_bytes},
           {"connections", conns},
           {"link_gbps", best(link1)},
           {"link_n_gbps", best(linkn)},
           {"kv_1_gbps", best(kv1)},
           {"kv_gbps", best(kvn)},
           {"fraction", best(kvn) / best(linkn)},
           {"link_1", spread(link1)},
           {"link_n", spread(linkn)},
           {"kv_1", spread(kv1)},
           {"kv_n", spread(kvn)}}}};

  if (!transfer_only) {
    // 2. The trace, colocated on all the cores, then prefill on the first and decode on the rest.
    const std::vector<int> rest(cores.begin() + 1, cores.end());
    const std::string all_threads = std::to_string(cores.size()), rest_threads = std::to_string(rest.size());
    const std::vector<std::string> common = {"--model",         model_dir,       "--port", "0",
                                             "--no-access-log", "--kv-cache-mb", kv_mb};
    auto serve = [&](std::vector<std::string> extra, const std::vector<int>& on) {
      std::vector<std::string> a = {"serve"};
      a.insert(a.end(), common.begin(), common.end());
      a.insert(a.end(), extra.begin(), extra.end());
      a.insert(a.end(), serve_args.begin(), serve_args.end());
      return std::make_unique<BenchProcess>(a, "beluga serve: serving ", 600, on);
    };
    Json colocated, disaggregated;
    {
      auto c = serve({"--threads", all_threads}, cores);
      std::fprintf(stderr, "bench pd: colocated on %zu cores\n", cores.size());
      colocated = bench_serve_report(c->url(), trace);
      c->stop();
    }
    {
      auto p = serve({"--threads", "1", "--role", "prefill"}, {cores[0]});
      auto d = serve({"--threads", rest_threads, "--role", "decode"}, rest);
      BenchProcess router({"router", "--model", router_model, "--port", "0", "--prefill", p->url(),
                           "--decode", d->url(), "--health-interval-ms", "100"},
                          "beluga router: routing to ");
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the decode engine's KV address learned
      std::fprintf(stderr, "bench pd: prefill on core %d, decode on %zu core(s)\n", cores[0], rest.size());
      disaggregated = bench_serve_report(router.url(), trace);
      router.stop();
      d->stop();
      p->stop();
    }
    std::printf("\n%-14s %10s %10s %10s %10s %10s %10s %10s\n", "mode", "tok/s", "TTFT p50", "TTFT p99",
                "TPOT p50", "TPOT p99", "ITL p50", "ITL p99");
    for (const auto& [name, r] :
         {std::pair<const char*, const Json*>{"colocated", &colocated}, {"disaggregated", &disaggregated}}) {
      const Json& row = *r;  // a named reference: clang 14 cannot capture a structured binding
      auto ms = [&](const char* k, const char* p) { return row[k].value(p, 0.0); };
      std::printf("%-14s %10.1f %10.1f %10.1f %10.2f %10.2f %10.2f %10.2f\n", name,
                  row.value("output_throughput", 0.0), ms("ttft", "p50_ms"), ms("ttft", "p99_ms"),
                  ms("tpot", "p50_ms"), ms("tpot", "p99_ms"), ms("itl", "p50_ms"), ms("itl", "p99_ms"));
    }
    std::printf("(ms; %s)\n", "failed requests: see the JSON's \"failed\"");
    j["colocated"] = colocated;
    j["disaggregated"] = disaggregated;
  }
  if (!out_path.empty()) {
    std::ofstream f(out_path);
    BELUGA_CHECK(f.good(), "cannot write ", out_path);
    f << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace beluga::cli
