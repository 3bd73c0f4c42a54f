// `beluga bench model`: prefill and decode throughput of one model on this machine, next to the
// machine's floor measured in the same run (streaming read bandwidth; the GEMM kernel's peak on a
// compute-bound shape). Prints a table and writes JSON with --out.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>

#include "cli/bench_serve.h"
#include "cli/bench_tokenizer.h"
#include "cli/commands.h"
#include "cli/model_args.h"
#include "engine/generator.h"
#include "util/error.h"
#include "util/file.h"

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
    for (int64_t c = 0; c < int64_t(n >> 16); ++c) total += k.dot(buf.get() + (size_t(c) << 16), buf.get() + (size_t(c) << 16), 1 << 16);
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
    if (c.is_mla()) {
      const double H = c.num_heads, qd = c.qk_head_dim();
      attn = (c.q_lora_rank > 0 ? D * c.q_lora_rank + c.q_lora_rank * H * qd : D * H * qd) +
             D * (c.kv_lora_rank + c.qk_rope_head_dim) + c.kv_lora_rank * H * (c.qk_nope_head_dim + c.v_head_dim) +
             H * c.v_head_dim * D;
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

int bench_model(int argc, char** argv) {
  Args a(argc, argv);
  LoadedModel m = load_model_from_args(a);
  const int B = int(a.get_int("batch", 1));
  const int P = int(a.get_int("prompt-len", 512));
  const int G = int(a.get_int("gen-len", 32));
  const std::string out_path = a.get_or("out", "");
  const std::string dtype = a.get_or("dtype", "float32");
  a.check_all_used();
  BELUGA_CHECK(B > 0 && P > 0 && G > 0, "--batch, --prompt-len and --gen-len must be positive");
  const ModelConfig& c = m.cfg;

  std::printf("beluga bench model: %s (%s), %.1f M parameters, load %.2f s, %d threads, kernels %s, activations %s\n",
              m.dir.c_str(), arch_name(c.arch), double(m.model->num_parameters()) / 1e6, m.load_seconds,
              m.ops->threads(), m.ops->kernels().name, dtype.c_str());
  const double bw = measure_read_bandwidth(*m.ops);
  const double peak = measure_gemm_peak(*m.ops);
  std::printf("machine floor: streaming read %.1f GB/s; GEMM kernel peak %.1f GFLOP/s (bf16 weights, M=256 N=K=1024)\n",
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
  gp.max_tokens = G + 1;  // the first token comes from the prefill step
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
  const double decode_bytes = bytes_per_param * (cost.dense_params + cost.head_params +
                                                 cost.moe_layers * experts_touched * cost.expert_params) +
                              double(B) * avg_ctx * double(m.model->kv_bytes_per_token()) + B * c.hidden_size * 2.0;
  const double decode_floor = decode_bytes / bw;
  // FLOPs of prefill: 2 per active weight per token, plus attention (QK and PV over the causal half).
  const double active = cost.dense_params + cost.head_params + cost.moe_layers * k * cost.expert_params;
  const double attn_dim = c.is_mla() ? double(c.num_heads) * (c.qk_head_dim() + c.v_head_dim)
                                     : double(c.num_heads) * c.head_dim * 2;
  const double prefill_flops = double(B) * P * (2.0 * active + 2.0 * c.num_layers * attn_dim * (P + 1) / 2.0);
  const double prefill_tps = prefill_tokens / prefill_s;
  const double decode_tps = B / decode_mean;

  std::printf("\n%-8s %6s %8s %8s | %12s %12s %12s | %12s %10s\n", "phase", "batch", "prompt", "gen", "tokens/s",
              "ms/step", "GFLOP/s", "MB/step", "of floor");
  std::printf("%-8s %6d %8d %8d | %12.1f %12.2f %12.1f | %12s %9.0f%%\n", "prefill", B, P, 0, prefill_tps,
              prefill_s * 1e3, prefill_flops / prefill_s / 1e9, "-", 100.0 * prefill_flops / prefill_s / peak);
  std::printf("%-8s %6d %8d %8d | %12.1f %12.2f %12s | %12.1f %9.0f%%\n", "decode", B, P, G, decode_tps,
              decode_mean * 1e3, "-", decode_bytes / 1e6, 100.0 * decode_floor / decode_mean);
  std::printf("(prefill 'of floor' = achieved FLOP/s over the GEMM kernel peak; decode = bandwidth floor time over "
              "measured step time; decode p50 %.2f ms)\n",
              decode_p50 * 1e3);

  if (!out_path.empty()) {
    nlohmann::json j = {
        {"model", m.dir},
        {"architecture", arch_name(c.arch)},
        {"parameters", m.model->num_parameters()},
        {"threads", m.ops->threads()},
        {"kernels", m.ops->kernels().name},
        {"activations", dtype},
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

}  // namespace

int cmd_bench(int argc, char** argv) {
  BELUGA_CHECK(argc >= 1, "usage: beluga bench model|tokenizer [options]");
  const std::string what = argv[0];
  if (what == "model") return bench_model(argc - 1, argv + 1);
  if (what == "tokenizer") return bench_tokenizer(argc - 1, argv + 1);
  if (what == "serve") return bench_serve(argc - 1, argv + 1);
  fail("unknown benchmark '", what, "' (model, tokenizer, serve)");
}

}  // namespace beluga::cli
