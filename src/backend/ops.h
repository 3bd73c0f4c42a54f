// Ops: the closed set of operations a model needs. Models are written once against this interface;
// backend/cpu and backend/cuda implement it. Tensors passed in live on the backend's device.
// Activations are the backend's act_dtype() (F32 on the CPU); weights stay in their stored dtype.
// Row-major [rows, cols] tensors may have a row stride larger than cols (views into wider tensors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <span>
#include <vector>

#include "tensor/tensor.h"
#include "util/error.h"

namespace beluga {

// A linear layer's weight as stored: w [out, in] (F32, BF16 or F8E4M3 with block scales) + optional bias.
struct Weight {
  Tensor w;
  Tensor scale;  // F32 [ceil(out/block_n), ceil(in/block_k)] when w is F8E4M3
  Tensor bias;   // [out] or empty
  int block_n = 128, block_k = 128;
  int64_t out_features() const { return w.shape[0]; }
  int64_t in_features() const { return w.shape[1]; }
};

struct ExpertWeights {
  Weight gate, up, down;
  // > 0: gate x clamped to <= limit and up x to [-limit, limit] before silu(gate) * up (DeepSeek-V4).
  // CUDA applies it in every expert kernel's gate-up epilogue (graph-safe, as the plain SwiGLU).
  float swiglu_limit = 0;
  // The device memory these weights live in when they are not the backend's (a live EPLB reload:
  // freed when the last placement holding the expert goes); null: the backend's or the checkpoint's.
  std::shared_ptr<void> owner = nullptr;
};

// Positions of the step's tokens in the paged KV cache (vLLM V1 style: all tokens flattened).
// All pointers are device memory of the backend, filled by the model runner each step.
struct AttnMeta {
  int num_seqs = 0;
  int num_tokens = 0;
  const int32_t* query_start = nullptr;  // [num_seqs + 1]: token rows of each sequence
  const int32_t* context_len = nullptr;  // [num_seqs]: tokens already cached before this step
  const int32_t* block_table = nullptr;  // [num_seqs, max_blocks]
  int max_blocks = 0;
  // [num_tokens]: cache slot (block * block_size + offset) per token; < 0: not written (padding rows)
  const int32_t* slot_mapping = nullptr;
  const int32_t* positions = nullptr;  // [num_tokens]
  int block_size = 64;
  // Host-side copies for backends that schedule on the host (sizes are small); h_block_table is
  // filled by Model::forward's eager path only (the CPU's DeepSeek-V4 step ops read the hybrid cache
  // through it).
  std::vector<int32_t> h_query_start, h_context_len, h_block_table;
};

// Precomputed rotary tables: cos/sin [max_positions, rotary_dim/2] F32 on the device.
struct RopeTable {
  Tensor cos, sin;
  int rotary_dim = 0;
  bool interleaved = false;  // pairs (2i, 2i+1) as DeepSeek; otherwise (i, i + d/2) as Llama/Qwen
};

enum class RouterScoring { kSoftmax, kSigmoid, kSqrtSoftplus };  // sqrtsoftplus: moe_route_v4 only

struct RouterParams {
  RouterScoring scoring = RouterScoring::kSoftmax;
  int top_k = 1;
  int n_group = 1;
  int topk_group = 1;
  bool group_by_top2_sum = false;  // noaux_tc: group score = sum of top-2 biased scores; else the max
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
};

// A MoE feed-forward layer as the ops see it: router, selection bias (empty: none), routing
// parameters, the routed experts and the shared one (null: none).
struct MoeLayerRef {
  const Weight& router;
  const Tensor& bias;
  const RouterParams& params;
  std::span<const ExpertWeights> experts;
  const ExpertWeights* shared;
};

// A sublayer's input still to be formed (pre-norm residual blocks): sum = residual + delta (the
// residual alone when delta is empty), out = rmsnorm(sum) * w. An op that takes it stores the sum and
// `out` as add_rmsnorm would, so later ops read `out` and the next sublayer the sum.
struct NormedInput {
  Tensor residual, delta, w, out;
  float eps = 0;
  // Where the sum goes: another buffer of residual's shape, or residual itself (in place; also when
  // empty). Out of place, a kernel that normalizes in every block can read residual while one block
  // writes the sum. Unused without a delta.
  Tensor residual_out;
};

// The MTP module's input stage (DeepSeek-V3): out [T, D] = eh_proj . [rmsnorm(e_t, enorm) ;
// rmsnorm(h_t, hnorm)], with h_t = hidden[r_t], r_t = rows[t] (t when rows is empty), and e_t =
// table[ids[i_t]], i_t = r_t when ids_by_row (the previous pass's ids, one per hidden row) else t.
struct MtpInput {
  Tensor table, ids, hidden, rows, enorm, hnorm;
  bool ids_by_row = false;
  float eps = 0;
};

// One KV block's copy between the device cache and a host image of it (every layer's slice of the
// block, layer after layer): the engine's KvCopy (engine/kv_connector.h).
struct KvBlockCopy {
  int block = 0;
  std::byte* host = nullptr;
};

class Ops {
 public:
  virtual ~Ops() = default;

  virtual Device device() const = 0;
  virtual DType act_dtype() const = 0;

  // ---- memory ----
  // Scratch for one forward step; everything from it is released by reset_scratch().
  virtual Tensor scratch(DType dtype, std::initializer_list<int64_t> shape) = 0;
  virtual void reset_scratch() = 0;
  // Scratch taken after scratch_mark() may be handed back with scratch_release() once nothing will
  // read it: ops run in order, so later ops may reuse the bytes. Keeps a step's scratch from growing
  // with the number of layers. A backend may ignore it (the defaults).
  struct ScratchMark {
    size_t chunks = 0, used = 0;
  };
  virtual ScratchMark scratch_mark() const { return {}; }
  virtual void scratch_release(ScratchMark) {}
  // Long-lived device memory (KV cache, derived weights); zero-filled; freed with the backend.
  virtual Tensor alloc_persistent(DType dtype, std::initializer_list<int64_t> shape) = 0;
  // Makes a host tensor available to the device (weights). The CPU backend returns the same view.
  virtual Tensor upload(const Tensor& host) = 0;
  // The same into memory of its own, freed with the returned owner (null when nothing was allocated:
  // the CPU's view), from any thread (the caller's device binding is left as it was): weights that
  // replace others while the backend steps (live EPLB's moved experts).
  virtual std::shared_ptr<void> upload_owned(const Tensor& host, Tensor* out) {
    *out = upload(host);
    return nullptr;
  }
  virtual void copy_to_host(const Tensor& src, void* dst) = 0;
  virtual void copy_from_host(Tensor dst, const void* src) = 0;
  // Copies `src` to `dst` behind the ops queued before it and returns at once; the bytes are there
  // once wait_host_copies() returns, so the host reads a step's small outputs while later ops run
  // (CUDA: `dst` must be host_alloc memory, page-locked, or the copy completes before returning).
  virtual void copy_to_host_async(const Tensor& src, void* dst) { copy_to_host(src, dst); }
  virtual void wait_host_copies() {}
  virtual void synchronize() = 0;
  // Called once on each thread that will issue ops (CUDA: selects the device).
  virtual void bind_thread() {}

  // ---- KV block transfers (engine/kv_connector.h) ----
  // Copies block `block` (an index along dim 0) of every cache in `layers` to `dst`, layer after
  // layer, or back from `src`. Ordered with the other ops: the host memory must stay as it is until
  // synchronize(). The defaults copy each layer's slice with copy_to_host / copy_from_host.
  virtual void kv_block_to_host(std::span<const Tensor> layers, int block, void* dst);
  virtual void kv_block_from_host(std::span<const Tensor> layers, int block, const void* src);
  // A step's block copies at once (the same layout per block): a backend batches them (CUDA: one
  // gather kernel and one DMA per run of adjacent host images, not one copy per layer and block).
  // The defaults copy block after block with the calls above.
  virtual void kv_blocks_to_host(std::span<const Tensor> layers, std::span<const KvBlockCopy> copies);
  virtual void kv_blocks_from_host(std::span<const Tensor> layers, std::span<const KvBlockCopy> copies);
  // Host memory for the KV tiers below the device (any thread): page-locked where the device copies
  // faster from it (CUDA), plain 64-byte-aligned memory otherwise; nullptr when none is left.
  virtual void* host_alloc(size_t bytes) { return std::aligned_alloc(64, (bytes + 63) / 64 * 64); }
  virtual void host_free(void* p) { std::free(p); }

  // ---- step graphs (optional; CUDA graphs) ----
  // Between begin_capture and end_capture the enqueued work is recorded, not run; replay(id) runs it
  // again on the same device addresses, so a replayed step reads its inputs from the buffers the
  // capture used. Scratch handed out while capturing stays valid for replays until scratch_epoch()
  // changes (scratch memory was reallocated); then release them and capture again.
  virtual bool supports_graphs() const { return false; }
  virtual void begin_capture() {}
  virtual int end_capture() { return -1; }
  virtual void replay(int /*graph*/) {}
  virtual void release_graph(int /*graph*/) {}
  virtual uint64_t scratch_epoch() const { return 0; }

  // ---- element-wise and normalisation ----
  virtual void embedding(Tensor out, const Tensor& table, const Tensor& ids) = 0;  // ids I32 [T]
  virtual void rmsnorm(Tensor out, const Tensor& x, const Tensor& w, float eps) = 0;
  // residual += x; out = rmsnorm(residual)
  virtual void add_rmsnorm(Tensor residual, const Tensor& x, Tensor out, const Tensor& w, float eps) = 0;
  // add_rmsnorm (into in.residual_out), or rmsnorm of the residual alone when `in` has no delta.
  virtual void normalize(const NormedInput& in);
  virtual void add(Tensor out, const Tensor& a, const Tensor& b) = 0;
  // Same shape, any strides; BF16/F32 (CPU: F32), or I32 to I32 (contiguous on CUDA).
  virtual void copy(Tensor out, const Tensor& x) = 0;
  // out [M, I] = silu(gate_up[:, :I]) * gate_up[:, I:]
  virtual void silu_mul(Tensor out, const Tensor& gate_up) = 0;
  // x [T, heads, dim] (dim >= rotary_dim; the first rotary_dim values rotate), in place.
  virtual void rope(Tensor x, const Tensor& positions, const RopeTable& table) = 0;
  virtual void gather_rows(Tensor out, const Tensor& x, const Tensor& rows) = 0;  // rows I32
  // out I32 [R] = ids[rows[r]] (ids I32, contiguous; rows I32 [R]): token ids picked by row.
  virtual void gather_ids(Tensor out, const Tensor& ids, const Tensor& rows) = 0;
  // ids I32 [R] = argmax of each row of logits F32 [R, V] (ties: the lowest id), for greedy sampling
  // without copying the logits to the host; with `probs` (F32 [R], or empty) also each row's softmax
  // probability of that id, 1 / sum_v exp(l_v - max) (a draft's confidence, speculative decoding).
  virtual void argmax_rows(Tensor ids, const Tensor& logits, Tensor probs) = 0;
  // argmax_rows of the head's logits x[rows] . head^T (rows I32 [R], or empty: x's first R rows), R =
  // ids.numel(): a greedy step's argmaxes without its logits. A backend may fuse the gather, the
  // product and the argmax; the ids must equal the composition's, the probabilities up to the order of
  // their sums.
  virtual void head_argmax(Tensor ids, Tensor probs, const Tensor& x, const Tensor& rows, const Weight& head);

  // ---- matrix products (F32 accumulation) ----
  virtual void linear(Tensor out, const Tensor& x, const Weight& w) = 0;  // out[M,N] = x[M,K] W^T + b
  // normalize(in), then linear(out, in.out, w): a backend may fold the norm into the product's pass
  // over its input (decode: one kernel instead of two); the results must equal the composition.
  virtual void norm_linear(Tensor out, const NormedInput& in, const Weight& w);
  // The MTP input stage as one op (six at a drafting step: the id and row gathers, the embedding,
  // two norms and the product); a backend may fuse them; the results must equal the composition.
  virtual void mtp_input(Tensor out, const MtpInput& in, const Weight& eh_proj);
  // Per-head products: out [T, H, N] = x [T, H, K] · w[h]^T with w [H, N, K] (may be strided).
  virtual void linear_heads(Tensor out, const Tensor& x, const Tensor& w) = 0;

  // ---- mixture of experts ----
  // From router logits [T, E] (F32): top-k expert ids (I32 [T, k]) and weights (F32 [T, k]).
  virtual void moe_route(Tensor ids, Tensor weights, const Tensor& logits, const Tensor& bias,
                         const RouterParams& p) = 0;
  // The router and the routing as one op: logits = x [T, D] · router^T (F32 [T, E]), then exactly
  // moe_route(ids, weights, logits, bias, p). Decode spends more on launching the two than on their
  // work, so a backend may fuse them; the default composes them.
  virtual void moe_gate(Tensor ids, Tensor weights, const Tensor& x, const Weight& router, const Tensor& bias,
                        const RouterParams& p);
  // normalize(in), then moe_gate(ids, weights, in.out, ...), fusable as norm_linear is.
  virtual void norm_moe_gate(Tensor ids, Tensor weights, const NormedInput& in, const Weight& router,
                             const Tensor& bias, const RouterParams& p);
  // The whole MoE feed-forward: out = moe_experts(x, norm_moe_gate(in)) with x = in.out. The shared
  // expert does not depend on the routing, so a backend may run the two side by side; the default
  // composes the ops.
  virtual void moe(Tensor out, const NormedInput& in, const MoeLayerRef& m);
  // out [T, D] = sum_i weights[t,i] * E_{ids[t,i]}(x[t]) (+ shared(x[t]) when given),
  // E(x) = down(silu(gate x) * up x).
  virtual void moe_experts(Tensor out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                           std::span<const ExpertWeights> experts, const ExpertWeights* shared) = 0;

  // ---- attention over the paged cache; cache [num_blocks, block_size, entry_dim] ----
  virtual void cache_write(Tensor cache, const Tensor& entries,
                           const AttnMeta& m) = 0;  // entries [T, entry_dim]
  // MLA's per-token prologue, fusable into one pass: cache[slot] = [rmsnorm(kva[:, :r]) * norm_w |
  // rope(kva[:, r:])] with r = kva width - rope width, then q_pe [T, H, rope] rotated in place and,
  // when q_pe_out is given, copied there. The default composes the primitive ops.
  virtual void mla_prepare(Tensor cache, const Tensor& kva, const Tensor& norm_w, float eps, Tensor q_pe,
                           Tensor q_pe_out, const Tensor& positions, const RopeTable& rope,
                           const AttnMeta& m);
  // mla_prepare, and the absorbed query's latent part q_lat [T, H, r] = linear_heads(q_nope [T, H,
  // nope], w_uk_t [H, r, nope]): independent of the prologue (other columns), so a backend may run
  // both in one launch. The default runs them one after the other.
  virtual void mla_prepare_absorbed(Tensor cache, const Tensor& kva, const Tensor& norm_w, float eps,
                                    Tensor q_pe, Tensor q_pe_out, const Tensor& positions,
                                    const RopeTable& rope, const AttnMeta& m, Tensor q_lat,
                                    const Tensor& q_nope, const Tensor& w_uk_t);
  // MLA absorbed: q [T, H, r + rope] against cache rows [c_kv (r) | k_pe (rope)];
  // out [T, H, r] = sum_j p_j c_kv_j (the latent output, before W_UV).
  virtual void mla_attention_absorbed(Tensor out, const Tensor& q, const Tensor& cache, const AttnMeta& m,
                                      int kv_rank, float scale) = 0;
  // mla_attention_absorbed, then out [T, H, v] = linear_heads(latent, w_uv [H, v, r]): a backend may
  // merge its split-KV combine into the product. The default runs the two ops.
  virtual void mla_attention_absorbed_uv(Tensor out, const Tensor& q, const Tensor& cache, const AttnMeta& m,
                                         int kv_rank, float scale, const Tensor& w_uv);
  // Every sequence's whole context (cached + new) as cache rows, concatenated: [sum ctx, entry_dim].
  virtual void gather_context(Tensor out, const Tensor& cache, const AttnMeta& m) = 0;
  // MLA expanded: q [T, H, nope + rope]; kv [C, H, nope + v] (k_nope | v per head, from W_kvb·c_kv);
  // k_pe [C, rope]; C indexes gather_context rows. out [T, H, v]. Causal within each sequence.
  virtual void mla_attention_expanded(Tensor out, const Tensor& q, const Tensor& kv, const Tensor& k_pe,
                                      const AttnMeta& m, float scale) = 0;
  // GQA: q [T, H, D]; cache entries [K (kvh*D) | V (kvh*D)]; out [T, H, D].
  virtual void gqa_attention(Tensor out, const Tensor& q, const Tensor& cache, const AttnMeta& m,
                             int kv_heads, float scale) = 0;

  // ---- DeepSeek-V4 (CPU and CUDA; the defaults throw "not supported on this backend yet") ----
  // Small parameters (bases, scales, biases, sinks) are F32; one sequence's rows at a time where a
  // row's position is its row index.
  //
  // Hyper-connection weights from the mixing logits mix [T, (2+n)*n] (n = hc streams) with base
  // [(2+n)*n] and scale [3]: pre = sigmoid(mix*scale0 + base) + eps, post = 2 sigmoid(...scale1...),
  // comb [T, n, n] = softmax_rows(...scale2...) + eps, then Sinkhorn: columns normalized, then
  // (rows, columns) iters-1 times, each divided by (sum + eps). With post and comb empty, mix is
  // [T, n] and only pre is formed (the hyper head: base [n], scale [1]).
  virtual void hc_weights(Tensor pre, Tensor post, Tensor comb, const Tensor& mix, const Tensor& base,
                          const Tensor& scale, int sinkhorn_iters, float eps);
  // out [T, D] = sum_j pre[t, j] * streams[t, j] with streams [T, n*D].
  virtual void hc_collapse(Tensor out, const Tensor& streams, const Tensor& pre);
  // out[t, k] = post[t, k] * y[t] + sum_j comb[t, j, k] * streams[t, j]; out, streams [T, n*D], y [T, D].
  virtual void hc_expand(Tensor out, const Tensor& streams, const Tensor& post, const Tensor& comb,
                         const Tensor& y);
  // Gated pooling of every `rate` rows: out [T / rate, d] with, per channel, a softmax over the
  // window's rows of gate + ape[i] weighting kv. kv, gate [T, d] and ape [rate, d]; with `overlap`
  // they are [T, 2d] and window w pools 2*rate slots: window w-1's first d channels (ape[i][:d]) then
  // its own last d channels (ape[i][d:]); window 0 has only its own.
  virtual void compress_pool(Tensor out, const Tensor& kv, const Tensor& gate, const Tensor& ape, int rate,
                             bool overlap);
  // Lightning indexer: row t is at position p = first_pos + t; score[t, w] = sum_h (weights[t, h] *
  // w_scale) * relu(q[t, h] . keys[w]) * q_scale over entries w < (p + 1) / rate (complete by p);
  // ids [T, k] I32 = the top-k entries in no particular order, -1 past the number of entries t may
  // see. q [T, H, d], keys [W, d] (entry w of the sequence), weights [T, H]. Ties are broken as the
  // reference (torch.topk on the CPU) breaks them: the scores of all W entries in index order, unseen
  // ones at -inf, std::nth_element at k-1 on the value alone; so, as there, a tied query's pick may
  // depend on W (incremental decode passes the entries complete at the chunk's end, as a full forward
  // over the same tokens does).
  virtual void indexer_topk(Tensor ids, const Tensor& q, const Tensor& keys, const Tensor& weights, int rate,
                            float q_scale, float w_scale, int first_pos);
  // Shared-KV attention with per-head sinks. Query t (q [T, H, D]) is at position p = first_pos + t;
  // kv row j (kv [N, D]) holds position kv_first + j. Query t sees the kv rows of positions
  // (p - window, p] (they must be in kv) and compressed entries comp [W, D] (entry w of the
  // sequence): all w < (p + 1) / rate when comp_ids is empty, else the ids >= 0 in comp_ids [T, k].
  // The softmax has one more logit per head, sinks[h], that adds no value. out [T, H, D] = sum p *
  // row (K = V).
  virtual void sink_attention(Tensor out, const Tensor& q, const Tensor& kv, const Tensor& comp,
                              const Tensor& comp_ids, const Tensor& sinks, int window, int rate, float scale,
                              int first_pos, int kv_first);
  // ---- DeepSeek-V4 over a layer's paged hybrid cache: a whole step at once, from meta's device
  // arrays alone (no host block tables, no uploads), so a decode step can be recorded as a graph ----
  // Paged views: `tokens` is the layer's token tensor flattened to [blocks * 64, width] (a column range
  // of it), `entries` its entry tensor flattened to [blocks * per_block, width]. Token p of a sequence
  // with block table `table` is row table[p / 64] * 64 + p % 64; entry e (tokens [e r, e r + r)) is row
  // table[((e + 1) r - 1) / 64] * per_block + e % per_block. Row t of the step is at position
  // positions[t] of its sequence (query_start); rows whose slot is < 0 (a graph's padding) write nothing.
  //
  // v4_compress: each row whose token completes a window ((p + 1) % rate == 0) pools entry e = p / rate
  // from the raw projections `proj` (token columns [kv (w) | gate (w)], w = 2d with overlap) as
  // compress_pool does, normalizes it (rmsnorm with `norm`, eps), rotates its trailing
  // rope.rotary_dim values at position e * rate and writes it to `entries` ([d] columns).
  virtual void v4_compress(Tensor entries, int per_block, const Tensor& proj, const Tensor& ape,
                           const Tensor& norm, float eps, const RopeTable& rope, int rate, bool overlap,
                           const AttnMeta& m);
  // v4_indexer_topk: indexer_topk for every row (q [T, H, d], weights [T, H]) over its sequence's
  // entry keys (`keys`: entry columns [d]), as many as are complete at the end of the sequence's rows
  // in this step: ids [T, k].
  virtual void v4_indexer_topk(Tensor ids, const Tensor& q, const Tensor& keys, int per_block,
                               const Tensor& weights, int rate, float q_scale, float w_scale,
                               const AttnMeta& m);
  // v4_sink_attention: sink_attention for every row (q, out [T, H, D]) over its window's rows of `kv`
  // (token columns [D]) and, unless `comp` is empty (sliding layers), its sequence's entries (`comp`:
  // entry columns [D]): every complete one, or the picks of comp_ids [T, k] (v4_indexer_topk's).
  virtual void v4_sink_attention(Tensor out, const Tensor& q, const Tensor& kv, const Tensor& comp,
                                 int per_block, const Tensor& comp_ids, const Tensor& sinks, int window,
                                 int rate, float scale, const AttnMeta& m);
  // DeepSeek-V4 routing from logits [T, E]: s = score(logits) (sqrtsoftplus, sigmoid or softmax);
  // ids [T, k] = hash_table[tokens[t]] when hash_table (I32 [vocab, k]) is given, else the top-k of
  // s + bias (bias may be empty); weights = s[ids] / (sum + 1e-20) * scale.
  virtual void moe_route_v4(Tensor ids, Tensor weights, const Tensor& logits, const Tensor& bias,
                            const Tensor& hash_table, const Tensor& tokens, RouterScoring scoring,
                            float scale);
};

[[noreturn]] inline void unsupported_on_backend(const char* op) {
  fail(op, ": not supported on this backend yet (DeepSeek-V4 runs on the CPU and CUDA backends)");
}

inline void Ops::hc_weights(Tensor, Tensor, Tensor, const Tensor&, const Tensor&, const Tensor&, int, float) {
  unsupported_on_backend("hc_weights");
}
inline void Ops::hc_collapse(Tensor, const Tensor&, const Tensor&) {
  unsupported_on_backend("hc_collapse");
}
inline void Ops::hc_expand(Tensor, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  unsupported_on_backend("hc_expand");
}
inline void Ops::compress_pool(Tensor, const Tensor&, const Tensor&, const Tensor&, int, bool) {
  unsupported_on_backend("compress_pool");
}
inline void Ops::indexer_topk(Tensor, const Tensor&, const Tensor&, const Tensor&, int, float, float, int) {
  unsupported_on_backend("indexer_topk");
}
inline void Ops::sink_attention(Tensor, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                const Tensor&, int, int, float, int, int) {
  unsupported_on_backend("sink_attention");
}
inline void Ops::v4_compress(Tensor, int, const Tensor&, const Tensor&, const Tensor&, float,
                             const RopeTable&, int, bool, const AttnMeta&) {
  unsupported_on_backend("v4_compress");
}
inline void Ops::v4_indexer_topk(Tensor, const Tensor&, const Tensor&, int, const Tensor&, int, float, float,
                                 const AttnMeta&) {
  unsupported_on_backend("v4_indexer_topk");
}
inline void Ops::v4_sink_attention(Tensor, const Tensor&, const Tensor&, const Tensor&, int, const Tensor&,
                                   const Tensor&, int, int, float, const AttnMeta&) {
  unsupported_on_backend("v4_sink_attention");
}
inline void Ops::moe_route_v4(Tensor, Tensor, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              RouterScoring, float) {
  unsupported_on_backend("moe_route_v4");
}

inline void Ops::mla_prepare(Tensor cache, const Tensor& kva, const Tensor& norm_w, float eps, Tensor q_pe,
                             Tensor q_pe_out, const Tensor& positions, const RopeTable& rope,
                             const AttnMeta& m) {
  const int64_t T = kva.shape[0], width = kva.shape[1], r = width - rope.rotary_dim;
  Tensor latent = scratch(act_dtype(), {T, width});
  rmsnorm(latent.cols(0, r), kva.cols(0, r), norm_w, eps);
  copy(latent.cols(r, width), kva.cols(r, width));
  Tensor one_head = latent;  // [T, 1, width]: rope() takes heads
  one_head.ndim = 3;
  one_head.shape = {T, 1, width, 0};
  one_head.stride = {latent.stride[0], width, 1, 0};
  this->rope(one_head.cols(r, width), positions, rope);
  this->rope(q_pe, positions, rope);
  cache_write(cache, latent, m);
  if (!q_pe_out.empty()) copy(q_pe_out, q_pe);
}

inline void Ops::mla_prepare_absorbed(Tensor cache, const Tensor& kva, const Tensor& norm_w, float eps,
                                      Tensor q_pe, Tensor q_pe_out, const Tensor& positions,
                                      const RopeTable& rope, const AttnMeta& m, Tensor q_lat,
                                      const Tensor& q_nope, const Tensor& w_uk_t) {
  mla_prepare(cache, kva, norm_w, eps, q_pe, q_pe_out, positions, rope, m);
  linear_heads(q_lat, q_nope, w_uk_t);
}

inline void Ops::mla_attention_absorbed_uv(Tensor out, const Tensor& q, const Tensor& cache,
                                           const AttnMeta& m, int kv_rank, float scale, const Tensor& w_uv) {
  Tensor latent = scratch(act_dtype(), {q.shape[0], q.shape[1], kv_rank});
  mla_attention_absorbed(latent, q, cache, m, kv_rank, scale);
  linear_heads(out, latent, w_uv);
}

inline void Ops::kv_block_to_host(std::span<const Tensor> layers, int block, void* dst) {
  auto* out = static_cast<char*>(dst);
  for (const Tensor& t : layers) {
    const Tensor b = t.rows(block, block + 1);
    copy_to_host(b, out);
    out += b.nbytes();
  }
}

inline void Ops::kv_block_from_host(std::span<const Tensor> layers, int block, const void* src) {
  const auto* in = static_cast<const char*>(src);
  for (const Tensor& t : layers) {
    const Tensor b = t.rows(block, block + 1);
    copy_from_host(b, in);
    in += b.nbytes();
  }
}

inline void Ops::kv_blocks_to_host(std::span<const Tensor> layers, std::span<const KvBlockCopy> copies) {
  for (const KvBlockCopy& c : copies) kv_block_to_host(layers, c.block, c.host);
}

inline void Ops::kv_blocks_from_host(std::span<const Tensor> layers, std::span<const KvBlockCopy> copies) {
  for (const KvBlockCopy& c : copies) kv_block_from_host(layers, c.block, c.host);
}

inline void Ops::normalize(const NormedInput& in) {
  if (in.delta.empty()) {
    rmsnorm(in.out, in.residual, in.w, in.eps);
  } else if (in.residual_out.empty() || in.residual_out.data == in.residual.data) {
    add_rmsnorm(in.residual, in.delta, in.out, in.w, in.eps);
  } else {
    add(in.residual_out, in.residual, in.delta);
    rmsnorm(in.out, in.residual_out, in.w, in.eps);
  }
}

inline void Ops::norm_linear(Tensor out, const NormedInput& in, const Weight& w) {
  normalize(in);
  linear(out, in.out, w);
}

inline void Ops::mtp_input(Tensor out, const MtpInput& in, const Weight& eh_proj) {
  const int64_t T = out.shape[0], D = out.shape[1];
  const DType act = out.dtype;
  Tensor ids = in.ids;
  if (in.ids_by_row) {
    ids = scratch(DType::kI32, {T});
    gather_ids(ids, in.ids, in.rows);
  }
  Tensor emb = scratch(act, {T, D});
  embedding(emb, in.table, ids);
  Tensor h = in.hidden.rows(0, T);
  if (!in.rows.empty()) {
    h = scratch(act, {T, D});
    gather_rows(h, in.hidden, in.rows);
  }
  Tensor cat = scratch(act, {T, 2 * D});
  rmsnorm(cat.cols(0, D), emb, in.enorm, in.eps);
  rmsnorm(cat.cols(D, 2 * D), h, in.hnorm, in.eps);
  linear(out, cat, eh_proj);
}

inline void Ops::head_argmax(Tensor ids, Tensor probs, const Tensor& x, const Tensor& rows,
                             const Weight& head) {
  const int64_t R = ids.numel();
  Tensor sel = x.rows(0, R);
  if (!rows.empty()) {
    sel = scratch(x.dtype, {R, x.shape[1]});
    gather_rows(sel, x, rows);
  }
  Tensor lg = scratch(DType::kF32, {R, head.out_features()});
  linear(lg, sel, head);
  argmax_rows(ids, lg, probs);
}

inline void Ops::norm_moe_gate(Tensor ids, Tensor weights, const NormedInput& in, const Weight& router,
                               const Tensor& bias, const RouterParams& p) {
  normalize(in);
  moe_gate(ids, weights, in.out, router, bias, p);
}

inline void Ops::moe(Tensor out, const NormedInput& in, const MoeLayerRef& m) {
  const int64_t T = in.out.shape[0], K = m.params.top_k;
  Tensor ids = scratch(DType::kI32, {T, K});
  Tensor weights = scratch(DType::kF32, {T, K});
  norm_moe_gate(ids, weights, in, m.router, m.bias, m.params);
  moe_experts(out, in.out, ids, weights, m.experts, m.shared);
}

inline void Ops::moe_gate(Tensor ids, Tensor weights, const Tensor& x, const Weight& router,
                          const Tensor& bias, const RouterParams& p) {
  Tensor logits = scratch(DType::kF32, {x.shape[0], router.out_features()});
  linear(logits, x, router);
  moe_route(ids, weights, logits, bias, p);
}

}  // namespace beluga
