// `beluga bench model`: prefill and decode throughput of one model on this machine, next to the
// machine's floor measured in the same run (streaming read bandwidth; the GEMM kernel's peak on a
// compute-bound shape). Prints a table and writes JSON with --out.
// --device cuda runs a sweep instead (decode at --decode-batches x --decode-contexts, prefill at
// --prefill-lens), each row with the bytes and FLOPs the step must move and do and the achieved
// fraction of the floor from the measured device copy bandwidth and cuBLAS BF16 peak.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <unordered_map>

#include "cli/bench_ep.h"
#include "cli/bench_eplb.h"
#include "cli/bench_fleet.h"
#include "cli/bench_grammar.h"
#include "cli/bench_kv.h"
#include "cli/bench_pd.h"
#include "cli/bench_router.h"
#include "cli/bench_sampler.h"
#include "cli/bench_serve.h"
#include "cli/bench_tokenizer.h"
#include "cli/commands.h"
#include "cli/model_args.h"
#include "engine/generator.h"
#include "engine/sampler.h"
#include "util/error.h"
#include "util/file.h"
#ifdef BELUGA_WITH_CUDA
#include "backend/cuda/cuda_ops.h"
#endif

namespace beluga::cli {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Streaming read bandwidth (bytes/s): threads sum disjoint parts of a buffer far larger than the caches.
double measure_read_bandwidth(const CpuOps& ops) {
  const size_t n = size_t(256) << 20;  // 1 GiB of floats
  std::unique_ptr<float[]> buf(new float[n]);
  const int nt = ops.threads();
#pragma omp parallel for num_threads(nt) schedule(static)
  for (size_t i = 0; i < n; ++i) buf[i] = 1.0f;
  const auto& k = ops.kernels();
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    float total = 0;
    const double t0 = now_s();
#pragma omp parallel for num_threads(nt) schedule(static) reduction(+ : total)
    for (int64_t c = 0; c < int64_t(n >> 16); ++c)
      total += k.dot(buf.get() + (size_t(c) << 16), buf.get() + (size_t(c) << 16), 1 << 16);
    const double dt = now_s() - t0;
    // The same buffer is passed twice; the second read hits the line the first just loaded.
    if (total > 0) best = std::max(best, double(n) * 4 / dt);
  }
  return best;
}

// FLOP/s of the GEMM kernel on a compute-bound BF16 shape, for the activation dtype in use.
double measure_gemm_peak(CpuOps& ops) {
  const int M = 256, N = 1024, K = 1024;
  std::vector<float> x(size_t(M) * K, 0.5f), out(size_t(M) * N);
  std::vector<uint16_t> w(size_t(N) * K, f32_to_bf16(0.01f));
  Weight wt;
  wt.w = Tensor::make(w.data(), DType::kBF16, {N, K});
  Tensor xt = Tensor::make(x.data(), DType::kF32, {M, K}), ot = Tensor::make(out.data(), DType::kF32, {M, N});
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    ops.reset_scratch();
    const double t0 = now_s();
    ops.linear(ot, xt, wt);
    best = std::max(best, 2.0 * M * N * K / (now_s() - t0));
  }
  return best;
}

struct ModelCost {
  double dense_params = 0;   // read by every token: attention, dense MLPs, shared experts, norms
  double expert_params = 0;  // one routed expert of one layer
  int moe_layers = 0;
  double embed_params = 0, head_params = 0;
};

ModelCost model_cost(const ModelConfig& c) {
  ModelCost m;
  const double D = c.hidden_size;
  m.embed_params = double(c.vocab_size) * D;
  m.head_params = double(c.vocab_size) * D;
  for (int l = 0; l < c.num_layers; ++l) {
    double attn;
    if (c.arch == Arch::kDeepseekV4) {
      // q low rank, the one K = V head, grouped output projection, compressors and the indexer, and
      // the two hyper-connection mixes (DeepSeek-V4's layer, deepseek_v4_attention.h).
      const V4Config& v = c.v4;
      const double H = c.num_heads, hd = c.head_dim, id = v.index_head_dim, n = v.hc_mult;
      attn = D * c.q_lora_rank + c.q_lora_rank * H * hd + D * hd + H * hd * v.o_lora_rank +
             double(v.o_groups) * v.o_lora_rank * D + 2.0 * (2 + n) * n * n * D;
      if (v.attention[size_t(l)] == V4Attention::kCompressedSparse)
        attn +=
            2.0 * D * 2 * hd + 2.0 * D * 2 * id + c.q_lora_rank * v.index_n_heads * id + D * v.index_n_heads;
      else if (v.attention[size_t(l)] == V4Attention::kHeavilyCompressed)
        attn += 2.0 * D * hd;
    } else if (c.is_mla()) {
      const double H = c.num_heads, qd = c.qk_head_dim();
      attn = (c.q_lora_rank > 0 ? D * c.q_lora_rank + c.q_lora_rank * H * qd : D * H * qd) +
             D * (c.kv_lora_rank + c.qk_rope_head_dim) +
             c.kv_lora_rank * H * (c.qk_nope_head_dim + c.v_head_dim) + H * c.v_head_dim * D;
    } else {
      attn = D * c.head_dim * (c.num_heads * 2.0 + c.num_kv_heads * 2.0);
    }
    m.dense_params += attn;
    if (c.is_moe_layer(l)) {
      m.moe_layers++;
      m.dense_params += 3.0 * D * c.moe_intermediate_size * c.n_shared_experts + D * c.n_routed_experts;
      m.expert_params = 3.0 * D * c.moe_intermediate_size;
    } else {
      m.dense_params += 3.0 * D * c.intermediate_size;
    }
  }
  return m;
}

// Cache bytes one decode step of one sequence at context `ctx` reads: every token's entry, or for
// DeepSeek-V4 per layer the sliding window's K = V rows and the complete compressed entries
// (`value_bytes` each: F32 on the CPU, BF16 on CUDA).
double kv_read_per_seq(const ModelConfig& c, double ctx, double kv_bytes_per_token,
                       double value_bytes = 4.0) {
  if (c.arch != Arch::kDeepseekV4) return ctx * kv_bytes_per_token;
  const V4Config& v = c.v4;
  double values = 0;
  for (int l = 0; l < c.num_layers; ++l) {
    values += std::min(ctx, double(v.sliding_window)) * c.head_dim;
    const int rate = v.compress_rate[size_t(l)];
    if (rate > 0)
      values +=
          std::floor(ctx / rate) *
          (c.head_dim + (v.attention[size_t(l)] == V4Attention::kCompressedSparse ? v.index_head_dim : 0));
  }
  return values * value_bytes;
}

// The --device cuda sweep's options, read before the model loads.
struct CudaSweepOptions {
  std::vector<int> batches, contexts, prefills;
  int steps = 8;
  std::string out_path;
  std::string sample_where = "gpu";
  bool gpu_sample = true;
  bool eager = false;
};

CudaSweepOptions parse_cuda_sweep_options(const Args& a) {
  CudaSweepOptions o;
  o.batches = parse_int_list(a.get_or("decode-batches", "1,16,64,256"));
  o.contexts = parse_int_list(a.get_or("decode-contexts", "1024,4096"));
  o.prefills = parse_int_list(a.get_or("prefill-lens", "512,2048,8192"));
  o.steps = int(a.get_int("steps", 8));
  o.out_path = a.get_or("out", "");
  // Decode steps sample greedily on the GPU (R ids come back) unless --sample host copies the F32 logits;
  // device / host-sampled: temperature 0.8, top_p 0.95 on the device sampler (R ids back) or on the host
  // sampler after the copy, the sampling inside the timed step.
  o.sample_where = a.get_or("sample", "gpu");
  BELUGA_CHECK(o.sample_where == "gpu" || o.sample_where == "host" || o.sample_where == "device" ||
                   o.sample_where == "host-sampled",
               "--sample must be gpu, host, device or host-sampled");
  o.gpu_sample = o.sample_where == "gpu" || o.sample_where == "device";
  o.eager = a.has("enforce-eager");
  BELUGA_CHECK(o.steps > 0, "--steps must be positive");
  return o;
}

#ifdef BELUGA_WITH_CUDA
int bench_model_cuda(const CudaSweepOptions& o, LoadedModel& m);
#endif

int bench_model(int argc, char** argv) {
  Args a = Args::for_command(argc, argv, "bench model");
  const ModelArgs ma = parse_model_args(a);
  if (ma.device == "cuda") {
    const CudaSweepOptions o = parse_cuda_sweep_options(a);
    a.not_with({"batch", "prompt-len", "gen-len"},
               "with --device cuda (its sweep has --decode-batches, ...)");
    a.check_all_used();
#ifdef BELUGA_WITH_CUDA
    LoadedModel m = load_model_dir(ma);
    return bench_model_cuda(o, m);
#endif
  }
  const int B = int(a.get_int("batch", 1));
  const int P = int(a.get_int("prompt-len", 512));
  const int G = int(a.get_int("gen-len", 32));
  const std::string out_path = a.get_or("out", "");
  const std::string dtype = a.get_or("dtype", "float32");
  a.not_with({"decode-batches", "decode-contexts", "prefill-lens", "steps", "sample"},
             "without --device cuda");
  a.check_all_used();
  BELUGA_CHECK(B > 0 && P > 0 && G > 0, "--batch, --prompt-len and --gen-len must be positive");
  LoadedModel m = load_model_dir(ma);
  const ModelConfig& c = m.cfg;

  std::printf(
      "beluga bench model: %s (%s), %.1f M parameters, load %.2f s, %d rank(s) x %d threads, kernels %s, "
      "activations %s%s\n",
      m.dir.c_str(), arch_name(c.arch), double(m.model->num_parameters()) / 1e6, m.load_seconds,
      group_ranks(ma), m.cpu->threads(), m.cpu->kernels().name, dtype.c_str(),
      ma.cpu.deterministic ? ", deterministic" : "");
  // The floor of every thread the model's ranks run on together.
  CpuOptions floor_opt = ma.cpu;
  floor_opt.threads = m.cpu->threads() * group_ranks(ma);
  CpuOps floor_ops(floor_opt);
  const double bw = measure_read_bandwidth(floor_ops);
  const double peak = measure_gemm_peak(floor_ops);
  std::printf(
      "machine floor: streaming read %.1f GB/s; GEMM kernel peak %.1f GFLOP/s (bf16 weights, M=256 "
      "N=K=1024)\n",
      bw / 1e9, peak / 1e9);

  uint64_t rng = 12345;
  auto next = [&]() {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return int((rng >> 33) % uint64_t(c.vocab_size));
  };
  std::vector<std::vector<int>> prompts(B, std::vector<int>(P));
  for (auto& p : prompts)
    for (auto& t : p) t = next();

  Generator gen(*m.model);
  GenerateParams warm;
  warm.max_tokens = 2;
  gen.generate({std::vector<int>(prompts[0].begin(), prompts[0].begin() + std::min(P, 16))}, warm);

  GenerateParams gp;
  gp.mla_mode = mla_mode_for(ma, MlaMode::kAuto);  // --deterministic: absorbed for every step
  gp.max_tokens = G + 1;                           // the first token comes from the prefill step
  double prefill_s = 0;
  int prefill_tokens = 0;
  std::vector<double> decode_s;
  gen.generate(prompts, gp, [&](const StepTiming& st) {
    if (st.prefill) {
      prefill_s += st.seconds;
      prefill_tokens += st.tokens;
    } else {
      decode_s.push_back(st.seconds);
    }
  });
  std::sort(decode_s.begin(), decode_s.end());
  const double decode_mean = std::accumulate(decode_s.begin(), decode_s.end(), 0.0) / double(decode_s.size());
  const double decode_p50 = decode_s[decode_s.size() / 2];

  // Bytes a decode step must read: the non-expert weights, the distinct routed experts B tokens touch
  // (expected value under uniform routing), the LM head, and every sequence's KV cache.
  const ModelCost cost = model_cost(c);
  const double bytes_per_param = double(m.weights->total_bytes()) / double(m.model->num_parameters());
  const double E = c.n_routed_experts, k = c.num_experts_per_tok;
  const double experts_touched = E > 0 ? E * (1.0 - std::pow(1.0 - k / E, B)) : 0;
  const double avg_ctx = P + G / 2.0;
  // A tensor-parallel group's ranks each cache their own heads: the group reads all of them.
  const StepPeers* peers = m.model->step_peers();
  const double kv_group_bytes = double(m.model->kv_bytes_per_token()) * (peers ? peers->cache_shards() : 1);
  const double decode_bytes =
      bytes_per_param *
          (cost.dense_params + cost.head_params + cost.moe_layers * experts_touched * cost.expert_params) +
      double(B) * kv_read_per_seq(c, avg_ctx, kv_group_bytes) + B * c.hidden_size * 2.0;
  const double decode_floor = decode_bytes / bw;
  // FLOPs of prefill: 2 per active weight per token, plus attention (QK and PV over the causal half).
  const double active = cost.dense_params + cost.head_params + cost.moe_layers * k * cost.expert_params;
  const double attn_dim = c.is_mla() ? double(c.num_heads) * (c.qk_head_dim() + c.v_head_dim)
                                     : double(c.num_heads) * c.head_dim * 2;
  const double prefill_flops = double(B) * P * (2.0 * active + 2.0 * c.num_layers * attn_dim * (P + 1) / 2.0);
  const double prefill_tps = prefill_tokens / prefill_s;
  const double decode_tps = B / decode_mean;

  std::printf("\n%-8s %6s %8s %8s | %12s %12s %12s | %12s %10s\n", "phase", "batch", "prompt", "gen",
              "tokens/s", "ms/step", "GFLOP/s", "MB/step", "of floor");
  std::printf("%-8s %6d %8d %8d | %12.1f %12.2f %12.1f | %12s %9.0f%%\n", "prefill", B, P, 0, prefill_tps,
              prefill_s * 1e3, prefill_flops / prefill_s / 1e9, "-",
              100.0 * prefill_flops / prefill_s / peak);
  std::printf("%-8s %6d %8d %8d | %12.1f %12.2f %12s | %12.1f %9.0f%%\n", "decode", B, P, G, decode_tps,
              decode_mean * 1e3, "-", decode_bytes / 1e6, 100.0 * decode_floor / decode_mean);
  std::printf(
      "(prefill 'of floor' = achieved FLOP/s over the GEMM kernel peak; decode = bandwidth floor time over "
      "measured step time; decode p50 %.2f ms)\n",
      decode_p50 * 1e3);

  if (!out_path.empty()) {
    nlohmann::json j = {
        {"model", m.dir},
        {"architecture", arch_name(c.arch)},
        {"parameters", m.model->num_parameters()},
        {"threads", m.cpu->threads()},
        {"kernels", m.cpu->kernels().name},
        {"activations", dtype},
        {"deterministic", ma.deterministic},
        {"batch", B},
        {"prompt_len", P},
        {"gen_len", G},
        {"read_bandwidth_gbs", bw / 1e9},
        {"gemm_peak_gflops", peak / 1e9},
        {"prefill_tokens_per_s", prefill_tps},
        {"prefill_seconds", prefill_s},
        {"prefill_gflops", prefill_flops / prefill_s / 1e9},
        {"prefill_fraction_of_gemm_peak", prefill_flops / prefill_s / peak},
        {"decode_tokens_per_s", decode_tps},
        {"decode_ms_per_step_mean", decode_mean * 1e3},
        {"decode_ms_per_step_p50", decode_p50 * 1e3},
        {"decode_bytes_per_step", decode_bytes},
        {"decode_fraction_of_bandwidth_floor", decode_floor / decode_mean},
    };
    write_file(out_path, j.dump(2) + "\n");
  }
  return 0;
}

#ifdef BELUGA_WITH_CUDA
// One of a batch-1 decode step's dependent streams: the stage that reads it and its bytes.
struct DecodeStream {
  const char* stage;
  int64_t bytes;
};

// A batch-1 decode step's dependent streams in the stages the CUDA path runs (BF16 weights): per layer
// the attention chain (norm + q / kv_a, prologue + W_UK, the KV of `ctx` keys, combine + W_UV, o_proj),
// then router + shared gate-up, routed gate-up, down (a dense MLP: gate-up, down); last the LM head.
std::vector<DecodeStream> decode_streams(const ModelConfig& c, double kv_layer_bytes_per_token, double ctx) {
  const double D = c.hidden_size, H = c.num_heads;
  std::vector<DecodeStream> s;
  auto w = [&](const char* stage, double params) { s.push_back({stage, int64_t(2.0 * params)}); };
  for (int l = 0; l < c.num_layers; ++l) {
    if (c.is_mla()) {
      const double qd = H * c.qk_head_dim(), kva = c.kv_lora_rank + c.qk_rope_head_dim;
      if (c.q_lora_rank > 0) {
        w("norm + q_a / kv_a", D * (c.q_lora_rank + kva));
        w("q_b", double(c.q_lora_rank) * qd);
      } else {
        w("norm + q / kv_a", D * (qd + kva));
      }
      w("W_UK", H * c.qk_nope_head_dim * c.kv_lora_rank);
      s.push_back({"attention (KV)", int64_t(ctx * kv_layer_bytes_per_token)});
      w("combine + W_UV", H * c.v_head_dim * c.kv_lora_rank);
      w("o_proj", H * c.v_head_dim * D);
    } else {
      w("norm + qkv", D * c.head_dim * (c.num_heads + 2.0 * c.num_kv_heads));
      s.push_back({"attention (KV)", int64_t(ctx * kv_layer_bytes_per_token)});
      w("o_proj", H * c.head_dim * D);
    }
    if (c.is_moe_layer(l)) {
      const double I = c.moe_intermediate_size, Is = I * c.n_shared_experts, k = c.num_experts_per_tok;
      w("router + shared gate-up", D * (c.n_routed_experts + 2.0 * Is));
      w("routed gate-up", k * 2.0 * I * D);
      w("down (routed + shared)", (k * I + Is) * D);
    } else {
      w("dense gate-up", 2.0 * c.intermediate_size * D);
      w("dense down", double(c.intermediate_size) * D);
    }
  }
  w("LM head", double(c.vocab_size) * D);
  return s;
}

// Per stage name: its streams alone as a chain of kernels, the time per stream (us).
struct StageFloor {
  std::string stage;
  int count = 0;
  double mb = 0, us = 0;
};

// One decode or prefill row of the CUDA sweep.
struct SweepRow {
  std::string phase;
  int batch = 0, context = 0, tokens = 0;
  double ms = 0, tokens_per_s = 0, bytes = 0, flops = 0, floor_ms = 0;
  double graph_ms = 0;  // decode: the graph replay's GPU time (CUDA graphs only)
  // Batch-1 decode: its weight streams as dependent pure reads (CudaOps::measure_stream_chain): all in
  // one stream; a kernel per stage; one persistent kernel; each of those two with every stage's first
  // loads before its wait. 0 for other rows.
  int stages = 0;
  double one_stream_ms = 0, chain_ms = 0, chain_early_ms = 0, persistent_ms = 0, persistent_early_ms = 0;
  std::vector<StageFloor> stage_floors;
};

int bench_model_cuda(const CudaSweepOptions& o, LoadedModel& m) {
  const std::vector<int>& batches = o.batches;
  const std::vector<int>& contexts = o.contexts;
  const std::vector<int>& prefills = o.prefills;
  const int steps = o.steps;
  const std::string& out_path = o.out_path;
  const bool gpu_sample = o.gpu_sample;
  const std::string& sample_where = o.sample_where;
  auto& ops = dynamic_cast<CudaOps&>(*m.ops);
  const ModelConfig& c = m.cfg;
  Model& model = *m.model;
  std::printf(
      "beluga bench model --device cuda: %s (%s), %.2f B parameters, load %.2f s, %.1f GiB on the device\n",
      m.dir.c_str(), arch_name(c.arch), double(model.num_parameters()) / 1e9, m.load_seconds,
      double(ops.persistent_bytes()) / double(1 << 30));
  const double bw = ops.measure_copy_bandwidth();
  const double peak = ops.measure_gemm_peak();
  std::printf("device floor: copy %.0f GB/s (read + write); cuBLAS BF16 GEMM 8192^3 %.0f TFLOP/s\n", bw / 1e9,
              peak / 1e12);
  std::fflush(stdout);

  // One KV cache for every row, sized for the largest; filled with random values (never zeros).
  int max_blocks = 1;
  for (int b : batches)
    for (int ctx : contexts)
      max_blocks = std::max(max_blocks, b * ((ctx + steps + 2 + kKvBlockSize - 1) / kKvBlockSize));
  for (int p : prefills) max_blocks = std::max(max_blocks, (p + kKvBlockSize - 1) / kKvBlockSize);
  KvCache kv = model.make_kv_cache(max_blocks);
  for (size_t l = 0; l < kv.layers.size(); ++l) ops.fill_uniform(kv.layers[l], 1000 + l, -1.0f, 1.0f);
  std::printf("KV cache: %d blocks, %.1f GiB\n", max_blocks,
              double(max_blocks) * kKvBlockSize * double(model.kv_bytes_per_token()) / double(1 << 30));

  const ModelCost cost = model_cost(c);
  const double E = c.n_routed_experts, k = c.num_experts_per_tok, L = c.num_layers, H = c.num_heads;
  const double active = cost.dense_params + cost.head_params + cost.moe_layers * k * cost.expert_params;
  const double kvb = double(model.kv_bytes_per_token());
  uint64_t rng = 12345;
  auto next_token = [&]() {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return int((rng >> 33) % uint64_t(c.vocab_size));
  };
  auto now = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  std::vector<SweepRow> rows;
  std::vector<float> logits;

  for (int P : prefills) {
    Batch b;
    for (int i = 0; i < P; ++i) b.tokens.push_back(next_token());
    std::vector<int> table((P + kKvBlockSize - 1) / kKvBlockSize);
    for (size_t i = 0; i < table.size(); ++i) table[i] = int(i);
    b.seqs.push_back({0, P, table});
    b.logit_rows = {P - 1};
    logits.resize(size_t(c.vocab_size));
    std::vector<double> t;
    for (int rep = 0; rep < 4; ++rep) {
      const double t0 = now();
      model.forward(b, kv, logits.data());
      if (rep > 0) t.push_back(now() - t0);
    }
    std::sort(t.begin(), t.end());
    SweepRow r;
    r.phase = "prefill";
    r.batch = 1;
    r.context = P;
    r.tokens = P;
    r.ms = t[t.size() / 2] * 1e3;
    r.tokens_per_s = P / t[t.size() / 2];
    // Every weight once (all experts are touched), the KV written; FLOPs: 2 per active weight per
    // token (the LM head for the last row only) and causal attention in the expanded form.
    const double attn_dim = c.is_mla() ? H * (c.qk_head_dim() + c.v_head_dim) : H * c.head_dim * 2.0;
    r.bytes =
        2.0 * (cost.dense_params + cost.head_params + cost.moe_layers * E * cost.expert_params) + P * kvb;
    r.flops = 2.0 * P * (active - cost.head_params) + 2.0 * cost.head_params +
              2.0 * L * attn_dim * double(P) * (P + 1) / 2.0;
    r.floor_ms = std::max(r.bytes / bw, r.flops / peak) * 1e3;
    rows.push_back(r);
    std::printf("  prefill %5d: %.2f ms\n", P, r.ms);
    std::fflush(stdout);
  }

  for (int ctx : contexts)
    for (int B : batches) {
      const int bps = (ctx + steps + 2 + kKvBlockSize - 1) / kKvBlockSize;
      logits.resize(size_t(B) * c.vocab_size);
      std::vector<int32_t> sampled(static_cast<size_t>(B) * kSampleOutCols);
      ForwardOptions fo;
      // Sampled modes: temperature 0.8, top_p 0.95, a uniform per (sequence, step) as the engine draws.
      SamplingParams sp;
      sp.temperature = 0.8f;
      sp.top_p = 0.95f;
      const std::vector<int> no_prompt, no_stops;
      const std::unordered_map<int, int> no_counts;
      std::vector<float> sample_scratch;
      std::vector<int> sample_idx;
      DeviceSampling ds;
      if (sample_where == "device") {
        fo.sampling = &ds;
        fo.sampled = sampled.data();
      } else if (gpu_sample) {
        fo.greedy_tokens = sampled.data();
      }
      std::vector<double> t, gpu;
      ops.set_replay_timing(true);
      for (int step = 0; step < steps + 2; ++step) {
        Batch b;
        for (int s = 0; s < B; ++s) {
          std::vector<int> table(bps);
          for (int i = 0; i < bps; ++i) table[i] = s * bps + i;
          b.seqs.push_back({ctx + step, 1, table});
          b.tokens.push_back(next_token());
          b.logit_rows.push_back(s);
        }
        const double t0 = now();
        if (fo.sampling) {
          ds.rows.clear();
          for (int s = 0; s < B; ++s)
            ds.rows.push_back(device_sample_row({&sp, &no_prompt, &no_counts, step, &no_stops, 7, s}));
        }
        model.forward(b, kv, logits.data(), fo);
        if (sample_where == "host-sampled")
          for (int s = 0; s < B; ++s)
            sampled[size_t(s)] =
                sample(logits.data() + size_t(s) * c.vocab_size, c.vocab_size,
                       {&sp, &no_prompt, &no_counts, step, &no_stops, 7, s}, sample_scratch, sample_idx)
                    .token;
        if (step >= 2) {
          t.push_back(now() - t0);
          gpu.push_back(ops.last_replay_ms());
        }
      }
      ops.set_replay_timing(false);
      const double mean = std::accumulate(t.begin(), t.end(), 0.0) / double(t.size());
      SweepRow r;
      r.phase = "decode";
      r.batch = B;
      r.context = ctx;
      r.tokens = B;
      r.ms = mean * 1e3;
      r.tokens_per_s = B / mean;
      // Graph replays only (0 with --enforce-eager): the GPU's part of the step, the rest is the host's.
      r.graph_ms = std::accumulate(gpu.begin(), gpu.end(), 0.0) / double(gpu.size());
      // Bytes: the non-expert weights, the distinct experts B tokens touch (uniform routing), the LM
      // head, every sequence's KV cache, and (--sample host) the F32 logits copied out. FLOPs: 2 per active
      // weight per token and absorbed attention (QK over 576, PV over 512 per head per cached token).
      const double touched = E > 0 ? E * (1.0 - std::pow(1.0 - k / E, B)) : 0;
      const double avg_ctx = ctx + steps / 2.0 + 2;
      // DeepSeek-V4 reads per layer its window's rows and the complete compressed entries (BF16), and
      // spends 4 H flops per value read (QK and PV over the same K = V rows).
      const bool v4 = c.arch == Arch::kDeepseekV4;
      const double kv_seq = v4 ? kv_read_per_seq(c, avg_ctx, kvb, 2.0) : avg_ctx * kvb;
      r.bytes =
          2.0 * (cost.dense_params + cost.head_params + cost.moe_layers * touched * cost.expert_params) +
          B * kv_seq + (gpu_sample ? 0.0 : 4.0 * B * c.vocab_size);
      const double attn = c.is_mla() ? 2.0 * H * (c.kv_entry_dim() + c.kv_lora_rank) : 4.0 * H * c.head_dim;
      r.flops = B * (2.0 * active + (v4 ? 2.0 * H * kv_seq : L * attn * avg_ctx));
      r.floor_ms = std::max(r.bytes / bw, r.flops / peak) * 1e3;
      if (B == 1 && !v4) {  // decode_streams knows the MLA and GQA layers' stages only
        const std::vector<DecodeStream> ds = decode_streams(c, kvb / L, avg_ctx);
        std::vector<int64_t> st;
        for (const DecodeStream& d : ds) st.push_back(d.bytes);
        const int64_t total = std::accumulate(st.begin(), st.end(), int64_t(0));
        using SC = CudaOps::StreamChain;
        // ms per pass, or -1 when the streams do not fit beside the model (then no chain rows).
        auto pass_ms = [&](const std::vector<int64_t>& v, SC shape) {
          const auto res = ops.measure_stream_chain(v, shape);
          return res ? res->seconds * 1e3 : -1.0;
        };
        r.one_stream_ms = pass_ms({total}, SC::kKernels);
        if (r.one_stream_ms < 0) {
          r.one_stream_ms = 0;
          std::printf("  decode b=1 ctx=%d: stream chain skipped (%.1f GB of free device memory needed)\n",
                      ctx, double(total) / 1e9);
        } else {
          r.stages = int(st.size());
        }
        for (const DecodeStream& d : ds) {
          if (r.stages == 0) break;
          if (std::any_of(r.stage_floors.begin(), r.stage_floors.end(),
                          [&](const StageFloor& f) { return f.stage == d.stage; }))
            continue;
          StageFloor f;
          f.stage = d.stage;
          std::vector<int64_t> same;
          for (const DecodeStream& e : ds)
            if (f.stage == e.stage) same.push_back(e.bytes);
          f.count = int(same.size());
          f.mb = double(same[0]) / 1e6;
          f.us = pass_ms(same, SC::kKernels) * 1e3 / double(f.count);
          r.stage_floors.push_back(f);
        }
        if (r.stages > 0) {
          r.chain_ms = pass_ms(st, SC::kKernels);
          r.chain_early_ms = pass_ms(st, SC::kKernelsEarly);
          r.persistent_ms = pass_ms(st, SC::kPersistent);
          r.persistent_early_ms = pass_ms(st, SC::kPersistentEarly);
        }
      }
      rows.push_back(r);
      if (r.graph_ms > 0)
        std::printf("  decode b=%d ctx=%d: %.2f ms/step (graph replay %.2f ms on the GPU)\n", B, ctx, r.ms,
                    r.graph_ms);
      else
        std::printf("  decode b=%d ctx=%d: %.2f ms/step\n", B, ctx, r.ms);
      std::fflush(stdout);
    }

  std::printf("\n%-8s %6s %8s | %12s %10s | %10s %10s %10s | %8s %s\n", "phase", "batch", "context",
              "tokens/s", "ms/step", "GB/step", "TFLOP/step", "floor ms", "of floor", "bound");
  for (const SweepRow& r : rows)
    std::printf("%-8s %6d %8d | %12.1f %10.3f | %10.3f %10.3f %10.3f | %7.1f%% %s\n", r.phase.c_str(),
                r.batch, r.context, r.tokens_per_s, r.ms, r.bytes / 1e9, r.flops / 1e12, r.floor_ms,
                100.0 * r.floor_ms / r.ms, r.bytes / bw > r.flops / peak ? "memory" : "compute");
  std::printf(
      "(floor = max(bytes / copy bandwidth, FLOPs / cuBLAS peak); 'of floor' = floor time / measured time; "
      "decode steps end with %s)\n",
      sample_where == "device"         ? "sampling on the GPU (T 0.8, top_p 0.95; B token ids copied back)"
      : sample_where == "host-sampled" ? "copying the F32 logits and sampling on the host (T 0.8, top_p 0.95)"
      : gpu_sample ? "greedy sampling on the GPU (B token ids copied back; --sample host copies the logits)"
                   : "copying the F32 logits to the host (--sample host)");
  bool chain_header = false;
  for (const SweepRow& r : rows) {
    if (r.stages == 0) continue;
    if (!chain_header) {
      std::printf(
          "\nbatch-1 decode against its weight streams read with nothing computed (distinct memory):\n"
          "%8s %7s | %10s | %10s | %12s %12s | %12s %12s\n",
          "context", "stages", "ms/step", "one stream", "kernels", "+ early", "persistent", "+ early");
      chain_header = true;
    }
    std::printf("%8d %7d | %10.3f | %10.3f | %12.3f %12.3f | %12.3f %12.3f\n", r.context, r.stages, r.ms,
                r.one_stream_ms, r.chain_ms, r.chain_early_ms, r.persistent_ms, r.persistent_early_ms);
  }
  if (chain_header)
    std::printf(
        "(ms; one stream: all of the step's bytes as one read; kernels: a kernel per stage, each waiting for "
        "the previous one (PDL, one CUDA graph); persistent: one kernel, a grid barrier between stages; "
        "+ early: each stage's first loads issued before it waits)\n");
  for (const SweepRow& r : rows) {
    if (r.stage_floors.empty()) continue;
    std::printf(
        "\nbatch-1 decode at context %d, each stage's streams alone as a chain of kernels (pure reads):\n",
        r.context);
    std::printf("  %-26s %6s %10s %12s %10s\n", "stage", "count", "MB each", "us each", "GB/s");
    for (const StageFloor& f : r.stage_floors)
      std::printf("  %-26s %6d %10.2f %12.2f %10.0f\n", f.stage.c_str(), f.count, f.mb, f.us,
                  f.mb * 1e3 / f.us);
  }
  const bool eager = o.eager;
  std::printf("decode steps: %s (%d graphs recorded)\n", eager ? "eager (--enforce-eager)" : "CUDA graphs",
              model.num_graphs());
  if (!out_path.empty()) {
    nlohmann::json j = {{"model", m.dir},
                        {"device", "cuda"},
                        {"cuda_graphs", !eager},
                        {"sample", sample_where},
                        {"parameters", model.num_parameters()},
                        {"copy_bandwidth_gbs", bw / 1e9},
                        {"gemm_peak_tflops", peak / 1e12}};
    for (const SweepRow& r : rows)
      j["rows"].push_back({{"phase", r.phase},
                           {"batch", r.batch},
                           {"context", r.context},
                           {"tokens_per_s", r.tokens_per_s},
                           {"ms_per_step", r.ms},
                           {"bytes_per_step", r.bytes},
                           {"flops_per_step", r.flops},
                           {"floor_ms", r.floor_ms},
                           {"fraction_of_floor", r.floor_ms / r.ms},
                           {"graph_gpu_ms", r.graph_ms},
                           {"stream_stages", r.stages},
                           {"one_stream_ms", r.one_stream_ms},
                           {"stream_chain_ms", r.chain_ms},
                           {"stream_chain_early_ms", r.chain_early_ms},
                           {"stream_persistent_ms", r.persistent_ms},
                           {"stream_persistent_early_ms", r.persistent_early_ms}});
    write_file(out_path, j.dump(2) + "\n");
  }
  return 0;
}
#endif

}  // namespace

int cmd_bench(int argc, char** argv) {
  BELUGA_CHECK(argc >= 1, "usage: beluga bench model|tokenizer [options]");
  const std::string what = argv[0];
  if (what == "model") return bench_model(argc - 1, argv + 1);
  if (what == "tokenizer") return bench_tokenizer(argc - 1, argv + 1);
  if (what == "serve") return bench_serve(argc - 1, argv + 1);
  if (what == "grammar") return bench_grammar(argc - 1, argv + 1);
  if (what == "kv") return bench_kv(argc - 1, argv + 1);
  if (what == "router") return bench_router(argc - 1, argv + 1);
  if (what == "sampler") return bench_sampler(argc - 1, argv + 1);
  if (what == "fleet") return bench_fleet(argc - 1, argv + 1);
  if (what == "pd") return bench_pd(argc - 1, argv + 1);
  if (what == "eplb") return bench_eplb(argc - 1, argv + 1);
  if (what == "ep") return bench_ep(argc - 1, argv + 1);
  fail("unknown benchmark '", what,
       "' (model, tokenizer, serve, grammar, kv, router, sampler, fleet, pd, ep, eplb)");
}

}  // namespace beluga::cli
