// The CPU backend: F32 activations, weights read in their stored dtype (BF16, F32, FP8 with block
// scales), OpenMP threads, SIMD kernels chosen at run time (kernels.h).
// With bf16_activations, GEMM inputs are rounded to BF16 for BF16 weights (2x the arithmetic rate,
// as llama.cpp does); accumulation stays F32 either way.
// With deterministic, every op computes a row the same way whatever the other rows are (batch
// invariant): the GEMMs keep one kernel path per weight dtype instead of choosing by the row count.
#pragma once

#include <memory>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/op_profile.h"
#include "backend/ops.h"

namespace beluga {

struct CpuOptions {
  int threads = 0;  // 0: all cores OpenMP sees
  bool bf16_activations = false;
  // Batch-invariant results (`--deterministic`): a row's output bits do not depend on M. The one
  // path chosen by M is the exact bf16x3 split for few rows (maybe_split), whose products round
  // differently from the F32 path; it is off in this mode (decode then converts each weight).
  bool deterministic = false;
};

class CpuOps final : public Ops {
 public:
  explicit CpuOps(CpuOptions opt = {});
  ~CpuOps() override;

  Device device() const override { return Device::kCpu; }
  DType act_dtype() const override { return DType::kF32; }
  int threads() const { return threads_; }
  bool deterministic() const { return deterministic_; }
  const cpu::Kernels& kernels() const { return *k_; }
  // Bytes the scratch arena holds (its high-water mark since the backend was made).
  size_t scratch_capacity() const {
    size_t n = 0;
    for (size_t s : chunk_size_) n += s;
    return n;
  }

  Tensor scratch(DType dtype, std::initializer_list<int64_t> shape) override;
  void reset_scratch() override;
  ScratchMark scratch_mark() const override { return {chunks_.size(), used_}; }
  void scratch_release(ScratchMark m) override {
    if (chunks_.size() == m.chunks) used_ = m.used;  // a chunk added meanwhile stays until the reset
  }
  Tensor alloc_persistent(DType dtype, std::initializer_list<int64_t> shape) override;
  Tensor upload(const Tensor& host) override { return host; }
  void copy_to_host(const Tensor& src, void* dst) override;
  void copy_from_host(Tensor dst, const void* src) override;
  void synchronize() override {}

  void embedding(Tensor out, const Tensor& table, const Tensor& ids) override;
  void rmsnorm(Tensor out, const Tensor& x, const Tensor& w, float eps) override;
  void add_rmsnorm(Tensor residual, const Tensor& x, Tensor out, const Tensor& w, float eps) override;
  void add(Tensor out, const Tensor& a, const Tensor& b) override;
  void copy(Tensor out, const Tensor& x) override;
  void silu_mul(Tensor out, const Tensor& gate_up) override;
  void rope(Tensor x, const Tensor& positions, const RopeTable& table) override;
  void gather_rows(Tensor out, const Tensor& x, const Tensor& rows) override;
  void argmax_rows(Tensor ids, const Tensor& logits, Tensor probs) override;
  void gather_ids(Tensor out, const Tensor& ids, const Tensor& rows) override;

  void linear(Tensor out, const Tensor& x, const Weight& w) override;
  void linear_heads(Tensor out, const Tensor& x, const Tensor& w) override;

  void moe_route(Tensor ids, Tensor weights, const Tensor& logits, const Tensor& bias,
                 const RouterParams& p) override;
  void moe_experts(Tensor out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                   std::span<const ExpertWeights> experts, const ExpertWeights* shared) override;

  void cache_write(Tensor cache, const Tensor& entries, const AttnMeta& m) override;
  void mla_attention_absorbed(Tensor out, const Tensor& q, const Tensor& cache, const AttnMeta& m,
                              int kv_rank, float scale) override;
  void gather_context(Tensor out, const Tensor& cache, const AttnMeta& m) override;
  void mla_attention_expanded(Tensor out, const Tensor& q, const Tensor& kv, const Tensor& k_pe,
                              const AttnMeta& m, float scale) override;
  void gqa_attention(Tensor out, const Tensor& q, const Tensor& cache, const AttnMeta& m, int kv_heads,
                     float scale) override;

  // DeepSeek-V4 (cpu_deepseek_v4.cc)
  void hc_weights(Tensor pre, Tensor post, Tensor comb, const Tensor& mix, const Tensor& base,
                  const Tensor& scale, int sinkhorn_iters, float eps) override;
  void hc_collapse(Tensor out, const Tensor& streams, const Tensor& pre) override;
  void hc_expand(Tensor out, const Tensor& streams, const Tensor& post, const Tensor& comb,
                 const Tensor& y) override;
  void compress_pool(Tensor out, const Tensor& kv, const Tensor& gate, const Tensor& ape, int rate,
                     bool overlap) override;
  void indexer_topk(Tensor ids, const Tensor& q, const Tensor& keys, const Tensor& weights, int rate,
                    float q_scale, float w_scale, int first_pos) override;
  void sink_attention(Tensor out, const Tensor& q, const Tensor& kv, const Tensor& comp,
                      const Tensor& comp_ids, const Tensor& sinks, int window, int rate, float scale,
                      int first_pos, int kv_first) override;
  void moe_route_v4(Tensor ids, Tensor weights, const Tensor& logits, const Tensor& bias,
                    const Tensor& hash_table, const Tensor& tokens, RouterScoring scoring,
                    float scale) override;
  // The step ops over the paged hybrid cache (cpu_v4_paged.cc): the single-sequence ops above, per
  // sequence, on rows copied out of the cache.
  void v4_compress(Tensor entries, int per_block, const Tensor& proj, const Tensor& ape, const Tensor& norm,
                   float eps, const RopeTable& rope, int rate, bool overlap, const AttnMeta& m) override;
  void v4_indexer_topk(Tensor ids, const Tensor& q, const Tensor& keys, int per_block, const Tensor& weights,
                       int rate, float q_scale, float w_scale, const AttnMeta& m) override;
  void v4_sink_attention(Tensor out, const Tensor& q, const Tensor& kv, const Tensor& comp, int per_block,
                         const Tensor& comp_ids, const Tensor& sinks, int window, int rate, float scale,
                         const AttnMeta& m) override;

 private:
  // Runs the GEMM for rows of x against W rows [0, N), split over threads by columns.
  void gemm(float* out, int64_t ldo, const float* x, int64_t ldx, int M, int K, const Weight& w, int N);
  // x rounded to BF16 (row stride K) when bf16_activations is on, else null.
  const uint16_t* maybe_bf16(const float* x, int64_t ldx, int M, int K);
  // x split into three exact bf16 terms for F32-exact products on the bf16 dot instruction; used for
  // few rows (decode, memory-bound), where it saves the per-element weight conversion. Else null.
  const uint16_t* maybe_split(const float* x, int64_t ldx, int M, int K, int max_rows = kSplitMaxRows);
  static constexpr int kSplitMaxRows = 2;

  cpu::OpProfile profile_;  // first member: destroyed last, after the ops it measured
  const cpu::Kernels* k_;
  int threads_;
  bool bf16_act_;
  bool deterministic_;
  // Scratch arena: bump allocation; grows by adding chunks, merged into one at the next reset.
  std::vector<std::unique_ptr<unsigned char[]>> chunks_;
  std::vector<size_t> chunk_size_;
  size_t used_ = 0;
  std::vector<std::unique_ptr<unsigned char[]>> persistent_;
};

}  // namespace beluga
