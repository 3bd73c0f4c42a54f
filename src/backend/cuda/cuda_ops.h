// The CUDA backend (Hopper, sm_90a): BF16 activations and KV cache, F32 accumulation everywhere.
// Dense GEMMs go through cuBLAS; element-wise ops, MoE routing, the grouped expert GEMM and the
// attention kernels are our own (cuda_*.cu). Every op is enqueued on one stream; only copy_to_host
// and synchronize wait for the device. This header carries no CUDA types, so host code can include it.
#pragma once

#include <array>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/kv_host_copy.h"
#include "backend/ops.h"
#include "loader/weight_source.h"

namespace beluga {

namespace cuda {
struct RefArgs;
}

// How prefill MoE layers run their experts (see CudaOps::moe_experts). kAuto picks by size; the others
// force one path from 64 rows per expert (benchmarks and tests). Default: BELUGA_MOE_PREFILL
// (auto, kernel, per-expert, cublas-grouped), else kAuto.
enum class MoePrefill { kAuto, kKernel, kPerExpert, kCublasGrouped };

struct CudaOptions {
  int device = 0;
  std::optional<MoePrefill> moe_prefill;
  bool token_experts = true;  // false: one token's experts take the planned GEMV path too (tests)
  // false: 128-row expert tiles on mma.sync instead of wgmma (tests; BELUGA_MOE_WGMMA=0 for comparisons)
  bool wgmma_experts = true;
  // false: decode batches' experts (below 32 rows per expert) on tiles of token rows instead of tiles of
  // 128 weight rows against up to 32 tokens (tests; BELUGA_MOE_SWAP=0 for comparisons). Needs wgmma_experts.
  bool swap_experts = true;
  // false: a prefill's shared expert (from 256 tokens) stays in the grouped tiles instead of cuBLAS GEMMs
  // (tests; BELUGA_MOE_SHARED_CUBLAS=0 for comparisons).
  bool shared_experts_cublas = true;
  // false: the shared expert's GEMMs run on the main stream after the routed tiles, instead of on a side
  // stream from right after the norm, beside the routing, the plan and the routed tiles
  // (BELUGA_MOE_SHARED_SIDE=0). Without PDL (on by default), every later batch-1 decode graph ran
  // ~0.08 ms slower once a side stream had run (pytorch/pytorch#161104's symptom; bench/NOTES.md runs
  // 86-93, 96).
  bool shared_on_side = true;
  // Batch-invariant results (`--deterministic`, docs/deterministic.md): a row's bits do not depend on the
  // other rows of a step. Dense products on one fixed-order tensor-core GEMM (cuda_gemm_invariant.h)
  // instead of cuBLAS and the GEMVs; experts on the mma.sync grouped tiles alone, F32 down rows; MLA
  // decode splits of a fixed key count (set_deterministic_keys), always merged; no fused norm or gate
  // kernels (their GEMVs round differently from the GEMM).
  bool deterministic = false;
};

class CudaOps final : public Ops {
 public:
  explicit CudaOps(CudaOptions opt = {});
  ~CudaOps() override;

  Device device() const override { return Device::kCuda; }
  DType act_dtype() const override { return DType::kBF16; }

  Tensor scratch(DType dtype, std::initializer_list<int64_t> shape) override;
  void reset_scratch() override;
  ScratchMark scratch_mark() const override { return {chunks_.size(), used_}; }
  void scratch_release(ScratchMark m) override {
    if (chunks_.size() == m.chunks) used_ = m.used;  // a chunk added meanwhile stays until the reset
    gate_plan_ = {};                                 // its ids' bytes may be handed out again
  }
  Tensor alloc_persistent(DType dtype, std::initializer_list<int64_t> shape) override;
  Tensor upload(const Tensor& host) override;
  std::shared_ptr<void> upload_owned(const Tensor& host, Tensor* out) override;
  void copy_to_host(const Tensor& src, void* dst) override;
  void copy_from_host(Tensor dst, const void* src) override;
  void copy_to_host_async(const Tensor& src, void* dst) override;
  void wait_host_copies() override;
  void synchronize() override;
  void bind_thread() override;
  int device_index() const { return device_; }
  // CUDA devices present.
  static int device_count();
  // Copies `bytes` between any two buffers of this process (host, or any device's) and returns once
  // they are there: the exchanges of thread ranks on GPUs (LocalTransport).
  static void copy_between(void* dst, const void* src, size_t bytes);
  // Asynchronous on the stream (pinned host memory from host_alloc overlaps with compute); batched
  // by a gather/scatter kernel and whole-image DMAs (kv_host_copy.h).
  void kv_block_to_host(std::span<const Tensor> layers, int block, void* dst) override;
  void kv_block_from_host(std::span<const Tensor> layers, int block, const void* src) override;
  void kv_blocks_to_host(std::span<const Tensor> layers, std::span<const KvBlockCopy> copies) override;
  void kv_blocks_from_host(std::span<const Tensor> layers, std::span<const KvBlockCopy> copies) override;
  void* host_alloc(size_t bytes) override;  // cudaHostAlloc
  void host_free(void* p) override;

  bool supports_graphs() const override { return !profile_; }
  void begin_capture() override;
  int end_capture() override;
  void replay(int graph) override;
  void release_graph(int graph) override;
  uint64_t scratch_epoch() const override { return scratch_epoch_; }

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
  void normalize(const NormedInput& in) override;
  void norm_linear(Tensor out, const NormedInput& in, const Weight& w) override;
  void mtp_input(Tensor out, const MtpInput& in, const Weight& eh_proj) override;
  void head_argmax(Tensor ids, Tensor probs, const Tensor& x, const Tensor& rows,
                   const Weight& head) override;
  void norm_moe_gate(Tensor ids, Tensor weights, const NormedInput& in, const Weight& router,
                     const Tensor& bias, const RouterParams& p) override;
  void moe_gate(Tensor ids, Tensor weights, const Tensor& x, const Weight& router, const Tensor& bias,
                const RouterParams& p) override;
  void moe(Tensor out, const NormedInput& in, const MoeLayerRef& m) override;
  void moe_experts(Tensor out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                   std::span<const ExpertWeights> experts, const ExpertWeights* shared) override;

  void cache_write(Tensor cache, const Tensor& entries, const AttnMeta& m) override;
  void mla_prepare(Tensor cache, const Tensor& kva, const Tensor& norm_w, float eps, Tensor q_pe,
                   Tensor q_pe_out, const Tensor& positions, const RopeTable& rope,
                   const AttnMeta& m) override;
  void mla_prepare_absorbed(Tensor cache, const Tensor& kva, const Tensor& norm_w, float eps, Tensor q_pe,
                            Tensor q_pe_out, const Tensor& positions, const RopeTable& rope,
                            const AttnMeta& m, Tensor q_lat, const Tensor& q_nope,
                            const Tensor& w_uk_t) override;
  void mla_attention_absorbed(Tensor out, const Tensor& q, const Tensor& cache, const AttnMeta& m,
                              int kv_rank, float scale) override;
  void mla_attention_absorbed_uv(Tensor out, const Tensor& q, const Tensor& cache, const AttnMeta& m,
                                 int kv_rank, float scale, const Tensor& w_uv) override;
  void gather_context(Tensor out, const Tensor& cache, const AttnMeta& m) override;
  void mla_attention_expanded(Tensor out, const Tensor& q, const Tensor& kv, const Tensor& k_pe,
                              const AttnMeta& m, float scale) override;
  void gqa_attention(Tensor out, const Tensor& q, const Tensor& cache, const AttnMeta& m, int kv_heads,
                     float scale) override;

  // DeepSeek-V4 (cuda_v4_*.cu): hyper-connections, hash / sqrtsoftplus routing, and the step ops over
  // the paged hybrid cache (compressor, the indexer's top-k, attention with sinks). The single-sequence
  // ops (compress_pool, indexer_topk, sink_attention) are the CPU backend's alone.
  void hc_weights(Tensor pre, Tensor post, Tensor comb, const Tensor& mix, const Tensor& base,
                  const Tensor& scale, int sinkhorn_iters, float eps) override;
  void hc_collapse(Tensor out, const Tensor& streams, const Tensor& pre) override;
  void hc_expand(Tensor out, const Tensor& streams, const Tensor& post, const Tensor& comb,
                 const Tensor& y) override;
  void v4_compress(Tensor entries, int per_block, const Tensor& proj, const Tensor& ape, const Tensor& norm,
                   float eps, const RopeTable& rope, int rate, bool overlap, const AttnMeta& m) override;
  void v4_indexer_topk(Tensor ids, const Tensor& q, const Tensor& keys, int per_block, const Tensor& weights,
                       int rate, float q_scale, float w_scale, const AttnMeta& m) override;
  void v4_sink_attention(Tensor out, const Tensor& q, const Tensor& kv, const Tensor& comp, int per_block,
                         const Tensor& comp_ids, const Tensor& sinks, int window, int rate, float scale,
                         const AttnMeta& m) override;
  void moe_route_v4(Tensor ids, Tensor weights, const Tensor& logits, const Tensor& bias,
                    const Tensor& hash_table, const Tensor& tokens, RouterScoring scoring,
                    float scale) override;

  // ---- beyond the Ops interface (tests, benchmarks, loaders) ----
  // Fills a BF16/F32 device tensor with uniform values in [lo, hi) from a counter-based hash of
  // (seed, index), or with `lo` when hi <= lo. The dummy-weight source and the benchmarks use it.
  void fill_uniform(Tensor t, uint64_t seed, float lo, float hi);
  bool deterministic() const { return deterministic_; }
  // Deterministic mode: the longest key count a step can attend over (the model's positions). The
  // absorbed MLA kernel splits every token's keys into pieces of a fixed length that covers it in at
  // most its split limit, so a token's pieces depend on its own length alone.
  void set_deterministic_keys(int64_t max_keys);
  // Forces the reference (simple, any-shape) attention kernels instead of the tensor-core ones.
  void set_reference_attention(bool on) { reference_attention_ = on; }
  // Device properties read at start.
  int sm_count() const { return sm_count_; }
  void* stream() const { return stream_; }
  // Device-to-device copy bandwidth (bytes read + written per second) and cuBLAS BF16 GEMM FLOP/s.
  double measure_copy_bandwidth();
  double measure_gemm_peak();
  // Seconds per pass over dependent pure-read streams of stage_bytes[i] bytes each (distinct memory,
  // nothing computed): the floor of a step shaped as that chain of GEMVs. A kernel per stage with PDL
  // in one graph, or one persistent kernel with a grid barrier between stages; *Early: each thread's
  // first loads of a stage are issued before it waits for the previous stage.
  // `result` is the pass's final word and `expected` what it must be if every byte was read once and
  // each stage read the previous one's result after that stage ended (tests/gpu).
  enum class StreamChain { kKernels, kKernelsEarly, kPersistent, kPersistentEarly };
  struct StreamChainResult {
    double seconds;
    uint32_t result, expected;
  };
  // nullopt: the streams' bytes do not fit in the device's free memory (a large model loaded).
  std::optional<StreamChainResult> measure_stream_chain(const std::vector<int64_t>& stage_bytes,
                                                        StreamChain shape);
  // Benchmarks: with replay timing on, each graph replay is bracketed by two events, and
  // last_replay_ms() is the last replay's GPU time (waits for it). The rest of a step's wall time is the
  // host's (building the batch, launching, copying tokens back). 0 when no replay ran since the last call
  // (eager steps).
  void set_replay_timing(bool on);
  double last_replay_ms();
  size_t persistent_bytes() const { return persistent_bytes_; }
  // Per-layer expert tables on the device (weight pointers, widths), built on first use; defined
  // in cuda_common.cuh for the kernels' launchers.
  struct ExpertTable;
  // With BELUGA_CUDA_PROFILE=1 in the environment, every op synchronizes and its time is summed
  // per op name; the table is printed to stderr when the backend is destroyed.
  struct Prof {
    CudaOps* ops;
    const char* name;
    double t0;
    Prof(CudaOps* o, const char* n);
    ~Prof();
  };

 private:
  // The weight as a BF16 [out, in] matrix: BF16 weights as they are; F32 and FP8 (block scales)
  // converted once on first use and cached for the backend's lifetime. A view by value: it returned a
  // reference to one reused object for BF16 weights, which two live results silently shared.
  Tensor bf16_weight(const Tensor& w, const Tensor& scale, int block_n, int block_k);
  // The BF16 weight of an [N, K] product over M rows that a smem_gemv kernel (cuda_gemv.cuh) may run
  // in place of linear with the same bits: decode-sized (1 <= M <= kGemvRows, the rows in 48 KB of
  // shared memory), on the 32-lane GEMV gemm_bf16 would take, no bias, rows in 16-byte pieces; else
  // empty (the caller composes the ops).
  Tensor smem_gemv_weight(const Weight& w, int M, int N, int K);
  // out[M,N] = x[M,K] w[N,K]^T on the main stream, or always through cuBLAS on `cublas`'s stream.
  void gemm_bf16(Tensor out, const Tensor& x, const Tensor& w, void* cublas = nullptr);
  // --deterministic's products on the batch-invariant GEMM (cuda_gemm_invariant.h): out[M,N] = x[M,K]
  // w[N,K]^T, or per head (x [T,H,K], w [H,N,K], out [T,H,N]); x copied first when its rows are not 16-byte
  // pieces.
  void invariant_product(Tensor out, const Tensor& x, const Tensor& w, void* stream);

  const ExpertTable& expert_table(std::span<const ExpertWeights> experts, const ExpertWeights* shared);
  // The tensor-core grouped GEMMs (gate-up with SiLU-and-mul into H, down into Y) over planned rows.
  // ne_tiles: the experts that get tiles (all, or the routed ones when the shared one runs apart).
  void run_grouped(const Tensor& x, Tensor H, Tensor Y, const ExpertTable& tab, const int* start,
                   const int* tile_start, const int* row_token, int R, int bm, bool swap, int ne_tiles,
                   float swiglu_limit, void* stream);
  // The shared expert of a prefill as dense cuBLAS GEMMs, H = silu(x Wg^T) * (x Wu^T), Y = H Wd^T for
  // x's T rows (H in scratch), on the main stream or (side >= 0) on side stream `side`.
  void shared_expert_gemms(const Tensor& x, Tensor Y, const ExpertWeights& w, int side = -1);
  // How moe_experts runs T tokens' K experts of E (D wide, `inter` hidden units), by rows per expert.
  struct ExpertPath {
    bool gemv = false;              // the planned GEMV kernels (decode, a few rows)
    bool per_expert_gemms = false;  // one cuBLAS GEMM per expert and projection
    bool swap = false;              // tiles of weight rows against up to 32 token rows
    int bm = 0;                     // token rows per tile otherwise
    bool shared_apart = false;      // the shared expert as dense cuBLAS GEMMs, not in the tiles
    bool y_f32 = false;             // the experts' down rows (Y) in F32, else BF16
  };
  ExpertPath expert_path(int T, int K, int E, int D, int64_t inter, bool shared) const;
  // moe_experts; with shared_y, the shared expert's down rows [T, D] are being computed on side stream 0
  // (joined before the weighted sum) and the tiles cover the routed experts only.
  void moe_experts_impl(Tensor out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                        std::span<const ExpertWeights> experts, const ExpertWeights* shared,
                        const Tensor* shared_y);
  void silu_mul_on(Tensor out, const Tensor& gate_up, void* stream);
  // The same with one cuBLAS GEMM per expert and projection (prefill); reads the plan's row counts.
  // The GEMMs of different experts run side by side on kSideStreams streams: one expert's GEMM alone
  // covers a fraction of the SMs (768 x 1408 is 36 tiles of 128 x 256 on 132 SMs).
  // With swiglu_limit > 0 (DeepSeek-V4) gate is clamped to <= limit and up to [-limit, limit] before
  // silu(gate) * up, as in the other paths' epilogues.
  void run_expert_gemms(const Tensor& x, Tensor H, Tensor Y, std::span<const ExpertWeights> experts,
                        const ExpertWeights* shared, const int* start, const int* row_token, int R,
                        float swiglu_limit = 0);
  // The same products as cuBLAS grouped GEMMs (one call for gate+up of all experts, one for down):
  // no per-expert host launches, so it pays off at fewer rows per expert. False: unsupported here.
  bool run_expert_gemms_grouped(const Tensor& x, Tensor H, Tensor Y, std::span<const ExpertWeights> experts,
                                const ExpertWeights* shared, const int* start, const int* row_token, int R);
  // moe_gate (or norm_moe_gate, with `norm`) as one kernel for up to 32 tokens; false: not applicable
  // here, nothing enqueued.
  // With `tab` (the few-token path's tokens, a norm, a shared expert): extra blocks also compute the
  // shared expert's gate-up into rows t (K + 1) + K of H, beside the routing it does not depend on.
  bool fused_gate(Tensor ids, Tensor weights, const Tensor& x, const Weight& router, const Tensor& bias,
                  const RouterParams& p, const NormedInput* norm, const ExpertTable* tab = nullptr,
                  Tensor H = {});
  // A few tokens' experts (decode at batch 1, a verify step's rows): gate-up over a flat list of the
  // tokens' hidden units, down with the weighted sum fused (cuda_moe_token.cu). False: not applicable,
  // nothing enqueued. Whether tokens x with K routed experts take these kernels (token_experts): one
  // token, or up to kTokMaxTokens where the layer's experts fit in half the L2.
  bool few_token_path(const Tensor& x, int K, const ExpertTable& tab) const;
  // H: [T (K + 1), i_max] for the hidden rows (empty: scratch); shared_done: rows t (K + 1) + K (the
  // shared expert's) are there already (fused_gate computed them).
  bool token_experts(Tensor out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                     const ExpertTable& tab, bool shared, Tensor H = {}, bool shared_done = false);
  // The absorbed MLA decode kernel (and its split combine) into `out` [T, H, kv_rank]; with w_uv
  // (BF16) and several splits, the combine runs inside the W_UV product into uv_out instead, and the
  // result is true (out untouched). False: `out` holds the latent output.
  bool mla_decode(Tensor out, const Tensor& q, const Tensor& cache, const AttnMeta& m, int kv_rank,
                  float scale, const Tensor* w_uv, Tensor uv_out);
  // The reference attention kernel (the fast kernels' fallback) for `a` as the caller filled it (mode,
  // q, out, keys), with the head count, widths and scale set here.
  void reference_attention(cuda::RefArgs& a, const AttnMeta& m, int H, int Dk, int Dv, float scale);
  // n zeroed counters for kernels whose last block to finish does a final step (it counts itself in
  // with an atomic and leaves the counter at zero again, so graph replays find them zeroed). Kernels
  // run one at a time, so all share one buffer (kArrivalCounters, allocated at start).
  int* arrival_counters(int64_t n);

  // The expert plan the fused moe_gate left for the ids it wrote: the next moe_experts on those ids
  // uses it instead of planning again. Any moe_experts, moe_route, scratch release or reset drops it,
  // so an address match means the same ids (scratch is not reused in between).
  struct GatePlan {
    const void* ids = nullptr;
    int T = 0, K = 0, E = 0;
  };
  GatePlan gate_plan_;
  int* gate_plan_buf_ = nullptr;
  int64_t gate_plan_capacity_ = 0;
  MoePrefill moe_prefill_ = MoePrefill::kAuto;
  bool token_experts_ = true;
  bool wgmma_experts_ = true;
  bool swap_experts_ = true;
  bool shared_experts_cublas_ = true;
  bool shared_on_side_ = true;
  bool deterministic_ = false;
  int det_split_len_ = 1024;         // deterministic mode: keys per MLA decode split (set_deterministic_keys)
  void* replay_events_[2] = {};      // cudaEvent_t around the last replay, when timing replays
  void* host_copy_event_ = nullptr;  // cudaEvent_t: after the last copy_to_host_async
  bool replay_timed_ = false;        // a replay recorded them since last_replay_ms() last read them
  // The one-token fused gate's blocks per SM at the shared memory it was last launched with (the
  // occupancy query runs once per size, not once per layer).
  // The fused gate's blocks per SM at its shared memory, per kernel instance (1, 4 or 8 rows).
  struct GateOccupancy {
    size_t smem = 0;
    int blocks = 0;
  };
  std::array<GateOccupancy, 3> gate_occupancy_{};
  // Streams for independent work within one op, each with its own cuBLAS handle and workspace (a
  // workspace must not be shared by GEMMs that run at the same time); made on first use.
  static constexpr int kSideStreams = 4;
  struct SideStream {
    void* stream = nullptr;  // cudaStream_t
    void* cublas = nullptr;  // cublasHandle_t bound to `stream`
    void* ws = nullptr;
    void* done = nullptr;  // cudaEvent_t: this stream's work so far
  };
  std::vector<SideStream> side_;
  void* fork_ = nullptr;  // cudaEvent_t: the main stream's work so far
  void make_side_streams();
  void fork_side_streams();  // side streams wait for the main stream's work so far
  void join_side_streams();  // the main stream waits for the side streams' work so far

  int device_ = 0;
  void* stream_ = nullptr;
  cuda::KvHostCopier kv_host_;  // the KV block copies' staging
  static constexpr int64_t kArrivalCounters = 4096;
  int* counters_ = nullptr;
  std::vector<void*> graphs_;  // cudaGraphExec_t, by id
  uint64_t scratch_epoch_ = 0;
  void* cublas_ = nullptr;
  void* cublas_ws_ = nullptr;
  int sm_count_ = 0;
  int64_t l2_bytes_ = 0;  // the device's L2
  bool reference_attention_ = false;
  // The shortest key split of the absorbed MLA decode kernel (BELUGA_MLA_MIN_SPLIT, a multiple of
  // its 64-key tile; for benchmarking the trade of parallelism against partial outputs).
  int mla_min_split_ = 64;
  int token_gate_up_blocks_ = 0;  // blocks of the one-token gate-up kernel per SM (set on first use)
  // At batch 1-2, sequences of at most this many 64-key tiles split into one-tile pieces
  // (BELUGA_MLA_TILE_SPLITS; 0: pieces of at least two tiles).
  int mla_tile_splits_ = 32;
  // Key-tile buffers per MLA decode block: 0 picks by grid size, 1 or 2 forces (BELUGA_MLA_DECODE_BUFS,
  // for comparisons).
  int mla_decode_bufs_ = 0;
  // From batch 3 too, MLA decode divides each token's keys over the splits by its own length
  // (BELUGA_MLA_BY_LENGTH=0: split lengths from the step's longest key count, for comparisons).
  bool mla_by_length_ = true;
  // The MLA prefill's block split (plan_prefill_split) for the last sequences seen, keyed by heads and
  // their query and context lengths: every layer of a forward asks for the same one.
  struct {
    std::vector<int> key;
    int items = 0, split_min = 0, max_split = 0;
  } prefill_split_;
  // Scratch arena: bump allocation over device chunks, merged into one at the next reset.
  std::vector<void*> chunks_;
  std::vector<size_t> chunk_size_;
  size_t used_ = 0;
  std::vector<void*> persistent_;
  size_t persistent_bytes_ = 0;
  std::map<const void*, Tensor> converted_;
  bool profile_ = false;
  std::map<std::string, std::pair<double, long>> prof_;  // op -> (seconds, calls)
  std::map<std::pair<const void*, const void*>, std::unique_ptr<ExpertTable>>
      expert_tables_;  // (experts, shared)
};

// Dummy weights generated on the GPU (no host copy of a large model): the same values as
// DummyWeights (splitmix64 of seed, name and index), written straight into device memory.
class CudaDummyWeights : public WeightSource {
 public:
  explicit CudaDummyWeights(CudaOps& ops, uint64_t seed = 0) : ops_(ops), seed_(seed) {}
  Tensor get(const std::string& name, const std::vector<int64_t>& shape, DType dtype_hint) override;
  Tensor find(const std::string& name, const std::vector<int64_t>& shape, DType dtype_hint) override;
  size_t total_bytes() const override { return bytes_; }

 private:
  CudaOps& ops_;
  uint64_t seed_;
  size_t bytes_ = 0;
};

}  // namespace beluga
