// DeepSeek-V4's MoE routing on the GPU (ops.h: moe_route_v4): one thread per token scores its E
// logits (sqrtsoftplus, sigmoid or softmax), takes its experts from the frozen token -> experts table
// (hash layers) or as the top-k of score + bias (ties to the lower id, as the CPU backend's sort),
// and normalizes the chosen scores. E is at most a few hundred, so a token's scores stay in local
// memory; the loader checked the table's ids, and the embedding before read the same token ids.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

namespace {

constexpr int kMaxRouteExperts = 512;

struct RouteV4Args {
  int32_t* ids;
  float* weights;
  int64_t ldi, ldw;
  const float* logits;
  int64_t ldl;
  const float* bias;     // [E] or null
  const int32_t* table;  // [vocab, K] or null
  int64_t ldt;
  const int32_t* tokens;
  int T, E, K;
  RouterScoring scoring;
  float scale;
};

__global__ void moe_route_v4_kernel(RouteV4Args a) {
  pdl_entry();
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= a.T) return;
  const float* z = a.logits + int64_t(t) * a.ldl;
  float s[kMaxRouteExperts];
  if (a.scoring == RouterScoring::kSoftmax) {
    float mx = -INFINITY;
    for (int e = 0; e < a.E; ++e) mx = fmaxf(mx, z[e]);
    double sum = 0;
    for (int e = 0; e < a.E; ++e) sum += exp(double(z[e] - mx));
    for (int e = 0; e < a.E; ++e) s[e] = float(exp(double(z[e] - mx)) / sum);
  } else if (a.scoring == RouterScoring::kSigmoid) {
    for (int e = 0; e < a.E; ++e) s[e] = 1.0f / (1.0f + expf(-z[e]));
  } else {  // sqrt(softplus(z)), softplus as torch: z itself above 20
    for (int e = 0; e < a.E; ++e) s[e] = sqrtf(z[e] > 20.0f ? z[e] : float(log1p(exp(double(z[e])))));
  }
  int32_t* id = a.ids + int64_t(t) * a.ldi;
  if (a.table) {
    const int32_t* row = a.table + int64_t(a.tokens[t]) * a.ldt;
    for (int i = 0; i < a.K; ++i) id[i] = row[i];
  } else {
    uint32_t taken[kMaxRouteExperts / 32] = {};
    for (int i = 0; i < a.K; ++i) {
      int best = -1;
      float bv = 0;
      for (int e = 0; e < a.E; ++e) {
        if (taken[e / 32] >> (e % 32) & 1u) continue;
        const float v = s[e] + (a.bias ? a.bias[e] : 0.0f);
        if (best < 0 || v > bv) best = e, bv = v;
      }
      taken[best / 32] |= 1u << (best % 32);
      id[i] = best;
    }
  }
  float sum = 0;
  for (int i = 0; i < a.K; ++i) sum += s[id[i]];
  float* w = a.weights + int64_t(t) * a.ldw;
  for (int i = 0; i < a.K; ++i) w[i] = s[id[i]] / (sum + 1e-20f) * a.scale;
}

}  // namespace

void CudaOps::moe_route_v4(Tensor ids, Tensor weights, const Tensor& logits, const Tensor& bias,
                           const Tensor& hash_table, const Tensor& tokens, RouterScoring scoring,
                           float scale) {
  Prof prof_scope(this, "moe_route_v4");
  const int64_t T = logits.shape[0], E = logits.shape[1], K = ids.shape[1];
  BELUGA_CHECK(logits.dtype == DType::kF32 && logits.stride[1] == 1 && ids.dtype == DType::kI32 &&
                   ids.stride[1] == 1 && weights.dtype == DType::kF32 && weights.stride[1] == 1 &&
                   ids.shape[0] == T && weights.shape[0] == T && weights.shape[1] == K && K <= E &&
                   E <= kMaxRouteExperts &&
                   (bias.empty() || (bias.dtype == DType::kF32 && bias.numel() == E)),
               "moe_route_v4: shapes ", logits.describe(), " -> ", ids.describe(), " ", weights.describe());
  const bool hashed = !hash_table.empty();
  if (hashed)
    BELUGA_CHECK(hash_table.dtype == DType::kI32 && hash_table.stride[1] == 1 && hash_table.shape[1] == K &&
                     tokens.dtype == DType::kI32 && tokens.numel() == T,
                 "moe_route_v4: hash table I32 [vocab, k] and tokens I32 [T]");
  if (T == 0) return;
  const RouteV4Args a{ids.ptr<int32_t>(),
                      weights.ptr<float>(),
                      ids.stride[0],
                      weights.stride[0],
                      logits.ptr<const float>(),
                      logits.stride[0],
                      bias.empty() ? nullptr : bias.ptr<const float>(),
                      hashed ? hash_table.ptr<const int32_t>() : nullptr,
                      hashed ? hash_table.stride[0] : 0,
                      hashed ? tokens.ptr<const int32_t>() : nullptr,
                      int(T),
                      int(E),
                      int(K),
                      scoring,
                      scale};
  launch(moe_route_v4_kernel, int(ceil_div(T, 64)), 64, 0, S(stream_), a);
  BELUGA_LAUNCH_CHECK();
}

}  // namespace beluga
