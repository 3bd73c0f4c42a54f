// The reference attention kernel's arguments and launcher, shared by the attention files
// (cuda_attention.cu defines it; cuda_mla_decode.cu falls back to it): any head dims, F32 throughout,
// a block per (token, head), scores in a global workspace. Also the fillers of the fields that all the
// attention kernels' argument structs name alike.
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace beluga::cuda {

constexpr float kLog2e = 1.4426950408889634f;

// Reference attention: any head dims; mode 0 MLA absorbed, 1 MLA expanded, 2 GQA. A block per (token,
// head, key split).
struct RefArgs {
  int mode;
  const bf16* q;
  int64_t q0, q1;
  bf16* out;
  int64_t o0, o1;
  const bf16* cache;
  int entry;
  const int32_t* bt;
  int max_blocks, bs;
  const bf16* kv;
  int64_t kv0, kv1;
  const bf16* kpe;
  int64_t kpe0;
  int nope;
  int kv_heads, group;
  const int32_t* qs;
  const int32_t* ctx;
  int S, H, Dk, Dv;
  float scale;
  float* scores;
  int64_t max_keys;
  // Keys split over blocks: block z of a (token, head) takes keys [z chunk, (z + 1) chunk); with
  // splits > 1 each writes its partial [Dv unnormalised sums | max | sum of exps] to `part`
  // [T, H, splits, Dv + 2] and the token's ceil(n / chunk) splits are merged in order: by the last of
  // them to finish where `counters` ([T, H / heads a block serves] zeroed arrival counters) is set,
  // else by a second kernel.
  int chunk, splits;
  float* part;
  int* counters;
};

// Query and output: a.q (q0, q1) and a.out (o0, o1), [T, H, dim] BF16 with unit last stride.
template <typename Args>
void set_q_out(Args& a, const Tensor& q, const Tensor& out) {
  a.q = q.ptr<const bf16>();
  a.q0 = q.stride[0];
  a.q1 = q.stride[1];
  a.out = out.ptr<bf16>();
  a.o0 = out.stride[0];
  a.o1 = out.stride[1];
}
// Expanded MLA's k/v rows [C, H, nope + v] and the shared rope keys [C, rope].
template <typename Args>
void set_kv(Args& a, const Tensor& kv, const Tensor& k_pe) {
  a.kv = kv.ptr<const bf16>();
  a.kv0 = kv.stride[0];
  a.kv1 = kv.stride[1];
  a.kpe = k_pe.ptr<const bf16>();
  a.kpe0 = k_pe.stride[0];
}
// The step's sequences: query starts, cached lengths (and their count, where the struct has one).
template <typename Args>
void set_seqs(Args& a, const AttnMeta& m) {
  a.qs = m.query_start;
  a.ctx = m.context_len;
  if constexpr (requires { a.S; }) a.S = m.num_seqs;
}
// The paged cache and its block table, and the sequences.
template <typename Args>
void set_paged(Args& a, const Tensor& cache, const AttnMeta& m) {
  a.cache = cache.ptr<const bf16>();
  a.bt = m.block_table;
  a.max_blocks = m.max_blocks;
  a.bs = m.block_size;
  set_seqs(a, m);
}

// Launches the reference kernel for T tokens over at most max_keys keys; scores: F32 [T * H, max_keys];
// with a.splits > 1 and no a.counters also the merge kernel (a.part: F32 [T, H, a.splits, Dv + 2]).
void run_reference(RefArgs a, int T, int max_keys, Tensor scores, cudaStream_t st);

}  // namespace beluga::cuda
