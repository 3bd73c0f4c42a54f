#include "cli/bench_kv_agent.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "cli/model_args.h"
#include "engine/engine.h"
#include "kvstore/fingerprint.h"
#include "kvstore/tiered_store.h"
#include "model/batch.h"
#include "util/error.h"
#include "util/file.h"

namespace beluga::cli {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Trace {
  int sessions = 16, turns = 6, concurrency = 4;
  int system_tokens = 512, turn_tokens = 256, answer_tokens = 16;
  int device_blocks = 0;
  size_t host_bytes = 0;
  std::string disk_dir;
  int longest() const { return system_tokens + turns * (turn_tokens + answer_tokens); }
};

struct Turn {
  int session = 0, turn = 0, prompt = 0, cached = 0, host = 0, disk = 0;
  double ttft = 0;
};

struct Mode {
  std::string name;
  std::vector<Turn> turns;
  std::vector<std::vector<int>> contexts;  // each session's final context (prompts and answers)
  double wall = 0;
  kv::StoreStats store;
  bool has_store = false;
};

// Runs one turn to its end: returns its record and appends the answer to `ctx`.
Turn run_turn(Engine& e, std::vector<int>& ctx, int answer_tokens, const std::string& id) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false, first = true;
  std::string error;
  Turn t;
  t.prompt = int(ctx.size());
  std::vector<int> answer;
  const auto t0 = Clock::now();
  EngineRequest r;
  r.id = id;
  r.prompt = ctx;
  r.traffic_class = "agent";
  r.sampling.temperature = 0;
  r.sampling.max_tokens = answer_tokens;
  r.sampling.ignore_eos = true;
  r.on_output = [&](RequestOutput&& o) {
    std::lock_guard<std::mutex> lk(mu);
    t.cached = o.cached_tokens;
    t.host = o.cached_tokens_host;
    t.disk = o.cached_tokens_disk;
    for (const auto& s : o.seqs) {
      if (!s.tokens.empty() && first) {
        t.ttft = std::chrono::duration<double>(Clock::now() - t0).count();
        first = false;
      }
      answer.insert(answer.end(), s.tokens.begin(), s.tokens.end());
    }
    if (!o.error.empty()) error = o.error;
    if (o.finished) {
      done = true;
      cv.notify_all();
    }
  };
  std::string why;
  for (;;) {  // the queue may be full for a moment
    const SubmitStatus st = e.submit(EngineRequest(r), &why);
    if (st == SubmitStatus::kOk) break;
    BELUGA_CHECK(st == SubmitStatus::kQueueFull, "bench kv --agent-trace: ", why);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::unique_lock<std::mutex> lk(mu);
  cv.wait(lk, [&] { return done; });
  BELUGA_CHECK(error.empty(), "bench kv --agent-trace: ", error);
  ctx.insert(ctx.end(), answer.begin(), answer.end());
  return t;
}

// The trace: worker w owns sessions w, w + C, ... and plays them turn by turn, round robin, so that
// between two turns of a session every other session takes one.
Mode run_mode(const std::string& name, Model& model, const Trace& tr, kv::TieredStore* store, int vocab) {
  Mode m;
  m.name = name;
  EngineConfig ec;
  ec.num_kv_blocks = tr.device_blocks;
  ec.max_model_len = tr.longest() + 8;
  ec.max_num_seqs = tr.concurrency;
  ec.kv_connector = store;
  Engine e(model, ec);
  std::vector<int> system(size_t(tr.system_tokens));
  std::mt19937 g0(1);
  for (int& t : system) t = 2 + int(g0() % uint32_t(vocab - 2));
  m.contexts.assign(size_t(tr.sessions), system);
  std::mutex mu;
  const auto t0 = Clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < tr.concurrency; ++w)
    workers.emplace_back([&, w] {
      for (int turn = 0; turn < tr.turns; ++turn)
        for (int s = w; s < tr.sessions; s += tr.concurrency) {
          std::vector<int>& ctx = m.contexts[size_t(s)];
          std::mt19937 g(uint32_t(1000 * s + turn + 7));  // the same user turn in every mode
          for (int i = 0; i < tr.turn_tokens; ++i) ctx.push_back(2 + int(g() % uint32_t(vocab - 2)));
          Turn t =
              run_turn(e, ctx, tr.answer_tokens, name + "-" + std::to_string(s) + "-" + std::to_string(turn));
          t.session = s;
          t.turn = turn;
          std::lock_guard<std::mutex> lk(mu);
          m.turns.push_back(t);
        }
    });
  for (auto& w : workers) w.join();
  m.wall = std::chrono::duration<double>(Clock::now() - t0).count();
  if (store) {
    store->drain();
    m.store = store->stats();
    m.has_store = true;
  }
  return m;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5))];
}

nlohmann::ordered_json summarize(const Mode& m, const Trace& tr, double off_ttft) {
  int64_t prompt = 0, cached = 0, host = 0, disk = 0, wprompt = 0, wcached = 0;
  std::vector<double> ttft, wttft;
  for (const Turn& t : m.turns) {
    prompt += t.prompt;
    cached += t.cached;
    host += t.host;
    disk += t.disk;
    ttft.push_back(t.ttft);
    if (t.turn > 0) {
      wprompt += t.prompt;
      wcached += t.cached;
      wttft.push_back(t.ttft);
    }
  }
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / double(v.size());
  };
  nlohmann::ordered_json j;
  j["mode"] = m.name;
  j["prompt_tokens"] = prompt;
  j["hit_tokens"] = {{"device", cached - host - disk}, {"host", host}, {"disk", disk}};
  j["hit_rate"] = double(cached) / double(std::max<int64_t>(1, prompt));
  j["hit_rate_by_tier"] = {{"device", double(cached - host - disk) / double(std::max<int64_t>(1, prompt))},
                           {"host", double(host) / double(std::max<int64_t>(1, prompt))},
                           {"disk", double(disk) / double(std::max<int64_t>(1, prompt))}};
  j["warm_hit_rate"] = double(wcached) / double(std::max<int64_t>(1, wprompt));
  j["ttft_mean_s"] = mean(ttft);
  j["ttft_p50_s"] = percentile(ttft, 0.5);
  j["ttft_p90_s"] = percentile(ttft, 0.9);
  j["warm_ttft_mean_s"] = mean(wttft);
  j["ttft_vs_off"] = off_ttft > 0 ? mean(wttft) / off_ttft : 1.0;
  j["wall_s"] = m.wall;
  // Goodput: the tokens the trace asked for (prompts and answers) per second of wall time.
  j["goodput_tokens_per_s"] = double(prompt + int64_t(m.turns.size()) * tr.answer_tokens) / m.wall;
  if (m.has_store) {
    j["host_tier"] = {{"hits", m.store.host.hits},
                      {"evictions", m.store.host.evictions},
                      {"blocks", m.store.host.blocks},
                      {"capacity_bytes", m.store.host.capacity_bytes}};
    if (m.store.disk)
      j["disk_tier"] = {{"hits", m.store.disk->hits},
                        {"bytes_written", m.store.disk->bytes_written},
                        {"errors", m.store.disk->errors},
                        {"blocks", m.store.disk->blocks}};
  }
  return j;
}

}  // namespace

int bench_kv_agent(const Args& args) {
  Trace tr;
  tr.sessions = int(args.get_int("sessions", tr.sessions));
  tr.turns = int(args.get_int("turns", tr.turns));
  tr.concurrency = int(args.get_int("concurrency", tr.concurrency));
  tr.system_tokens = int(args.get_int("system-tokens", tr.system_tokens));
  tr.turn_tokens = int(args.get_int("turn-tokens", tr.turn_tokens));
  tr.answer_tokens = int(args.get_int("answer-tokens", tr.answer_tokens));
  tr.device_blocks = int(args.get_int("device-blocks", 0));
  const double host_gb = args.get_double("kv-host-gb", 0);
  tr.disk_dir = args.get_or("kv-disk-dir", "");
  const bool json = args.has("json");
  const std::string json_out = args.get_or("json-out", "");
  BELUGA_CHECK(tr.sessions > 0 && tr.turns > 0 && tr.concurrency > 0 && tr.concurrency <= tr.sessions,
               "--sessions, --turns > 0; 0 < --concurrency <= --sessions");
  BELUGA_CHECK(tr.system_tokens > 0 && tr.turn_tokens > 0 && tr.answer_tokens > 0 && host_gb >= 0,
               "--system-tokens, --turn-tokens, --answer-tokens must be positive");
  LoadedModel lm = load_model_from_args(args);
  args.check_all_used();
  BELUGA_CHECK(tr.longest() + 8 <= lm.model->max_positions(), "bench kv --agent-trace: a session grows to ",
               tr.longest(), " tokens, past the model's ", lm.model->max_positions(),
               " positions (fewer --turns or --turn-tokens, or raise --max-model-len)");
  const int longest_blocks = (tr.longest() + 8 + kKvBlockSize - 1) / kKvBlockSize;
  if (tr.device_blocks <= 0) tr.device_blocks = tr.concurrency * longest_blocks + 8;
  const size_t block = lm.model->kv_bytes_per_token() * kKvBlockSize;
  // Distinct context: the shared system prompt once, every session's own turns.
  const int64_t distinct_blocks =
      tr.system_tokens / kKvBlockSize +
      int64_t(tr.sessions) * ((tr.longest() - tr.system_tokens) / kKvBlockSize + 1);
  tr.host_bytes =
      host_gb > 0 ? size_t(host_gb * double(size_t(1) << 30)) : size_t(distinct_blocks + 64) * block;
  const BlockHash fp =
      kv::model_fingerprint(read_file(lm.config_path), lm.weights_digest, lm.ops->act_dtype(),
                            lm.model->kv_bytes_per_token(), kKvBlockSize);
  const int vocab = lm.cfg.vocab_size;

  std::vector<Mode> modes;
  modes.push_back(run_mode("off", *lm.model, tr, nullptr, vocab));
  {
    kv::StoreConfig sc;
    sc.block_bytes = block;
    sc.fingerprint = fp;
    sc.host_bytes = tr.host_bytes;
    kv::TieredStore store(sc);
    modes.push_back(run_mode("host", *lm.model, tr, &store, vocab));
  }
  if (!tr.disk_dir.empty()) {
    const std::string dir = tr.disk_dir + "/bench-agent";
    fs::remove_all(dir);
    kv::StoreConfig sc;
    sc.block_bytes = block;
    sc.fingerprint = fp;
    sc.disk_dir = dir;  // no host tier: its staging pool only, so hits come from the files
    {
      kv::TieredStore store(sc);
      modes.push_back(run_mode("disk", *lm.model, tr, &store, vocab));
    }
    fs::remove_all(dir);
  }

  double off_ttft = 0;
  {
    int n = 0;
    for (const Turn& t : modes[0].turns)
      if (t.turn > 0) off_ttft += t.ttft, ++n;
    off_ttft /= std::max(1, n);
  }
  nlohmann::ordered_json out;
  out["model"] = lm.dir;
  out["threads"] = lm.cpu ? lm.cpu->threads() : 0;
  out["trace"] = {{"sessions", tr.sessions},
                  {"turns", tr.turns},
                  {"concurrency", tr.concurrency},
                  {"system_tokens", tr.system_tokens},
                  {"turn_tokens", tr.turn_tokens},
                  {"answer_tokens", tr.answer_tokens},
                  {"device_blocks", tr.device_blocks},
                  {"distinct_context_blocks", distinct_blocks},
                  {"block_bytes", block},
                  {"host_tier_bytes", tr.host_bytes}};
  bool same = true;
  for (const Mode& m : modes) same = same && m.contexts == modes[0].contexts;
  out["outputs_identical"] = same;
  for (const Mode& m : modes) out["modes"].push_back(summarize(m, tr, off_ttft));
  if (!json_out.empty()) {
    std::ofstream f(json_out);
    BELUGA_CHECK(f.good(), "cannot write ", json_out);
    f << out.dump(2) << "\n";
  }
  if (json) {
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf(
        "agent trace: %d sessions x %d turns, %d at once; system %d + %d per turn + %d answer tokens; device "
        "pool "
        "%d blocks, distinct context %lld blocks (%zu bytes each)\n",
        tr.sessions, tr.turns, tr.concurrency, tr.system_tokens, tr.turn_tokens, tr.answer_tokens,
        tr.device_blocks, static_cast<long long>(distinct_blocks), block);
    std::printf("%-5s %7s %7s %7s %7s %9s %10s %10s %10s %9s %8s %10s\n", "mode", "hit%", "device", "host",
                "disk", "warm hit%", "TTFT mean", "TTFT p50", "warm TTFT", "vs off", "wall s", "goodput/s");
    for (const auto& j : out["modes"])
      std::printf("%-5s %6.1f%% %6.1f%% %6.1f%% %6.1f%% %8.1f%% %9.4fs %9.4fs %9.4fs %8.1f%% %8.2f %10.0f\n",
                  j["mode"].get<std::string>().c_str(), 100 * j["hit_rate"].get<double>(),
                  100 * j["hit_rate_by_tier"]["device"].get<double>(),
                  100 * j["hit_rate_by_tier"]["host"].get<double>(),
                  100 * j["hit_rate_by_tier"]["disk"].get<double>(), 100 * j["warm_hit_rate"].get<double>(),
                  j["ttft_mean_s"].get<double>(), j["ttft_p50_s"].get<double>(),
                  j["warm_ttft_mean_s"].get<double>(), 100 * j["ttft_vs_off"].get<double>(),
                  j["wall_s"].get<double>(), j["goodput_tokens_per_s"].get<double>());
    std::printf("every mode generated the same tokens: %s\n", same ? "yes" : "NO");
  }
  return same ? 0 : 1;
}

}  // namespace beluga::cli
