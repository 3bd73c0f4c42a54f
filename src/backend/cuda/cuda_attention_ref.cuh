// The reference attention kernel's arguments and launcher, shared by the attention files
// (cuda_attention.cu defines it; cuda_mla_decode.cu falls back to it): any head dims, F32 throughout,
// a block per (token, head), scores in a global workspace.
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace beluga::cuda {

constexpr float kLog2e = 1.4426950408889634f;

// Reference attention: any head dims; mode 0 MLA absorbed, 1 MLA expanded, 2 GQA.
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
};

// Launches the reference kernel for T tokens over at most max_keys keys; scores: F32 [T * H, max_keys].
void run_reference(RefArgs a, int T, int max_keys, Tensor scores, cudaStream_t st);

}  // namespace beluga::cuda
