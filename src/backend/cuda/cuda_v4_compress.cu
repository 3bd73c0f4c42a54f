// DeepSeek-V4's compressor on the GPU (ops.h: v4_compress): a block per step row; rows that complete
// a window pool its entry channel by channel (one pass with a running softmax over the window's gate +
// position-bias logits: rate of them, 2 rate with overlapping windows), then RMS-normalize it, rotate
// its trailing rope values at the window's first position and write it to the entry cache, all in F32
// with one rounding to BF16 at the end. The raw projections are read from the token cache through the
// block table, so the step needs no gather list from the host.
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_v4_paged.cuh"

namespace beluga {

using namespace cuda;

namespace {

constexpr int kCompressThreads = 256;

struct CompressArgs {
  bf16* entries;  // entry rows, d columns
  int64_t lde;
  int per_block;
  const bf16* proj;  // token rows: [kv (w) | gate (w)]
  int64_t ldp;
  const float* ape;  // [rate, w]
  int64_t lda;
  VecRef norm;
  float eps;
  const float *cos, *sin;  // [positions, rot / 2]
  int rot, d, rate;
  bool overlap;
  V4Step step;
};

__global__ void __launch_bounds__(kCompressThreads) v4_compress_kernel(CompressArgs a) {
  pdl_entry();
  extern __shared__ float y[];  // [d]
  __shared__ float red[33];
  const int t = blockIdx.x, p = a.step.positions[t];
  if ((p + 1) % a.rate != 0 || a.step.slots[t] < 0) return;
  const V4Row r = v4_row(a.step, t);
  const int e = p / a.rate, w = a.overlap ? 2 * a.d : a.d;
  // Window e's rows with overlap: window e - 1's first series (channels [0, d)), then its own second
  // series (channels [d, 2d)); without, its own rows at channel offset 0.
  const bool prev = a.overlap && e > 0;
  const int slots = prev ? 2 * a.rate : a.rate;
  float ss = 0;
  for (int ch = threadIdx.x; ch < a.d; ch += blockDim.x) {
    float m = -INFINITY, l = 0, acc = 0;
    for (int s = 0; s < slots; ++s) {
      const bool first = prev && s < a.rate;
      const int i = first ? s : prev ? s - a.rate : s;  // position in its window
      const int pos = (first ? e - 1 : e) * a.rate + i, off = first || !a.overlap ? 0 : a.d;
      const bf16* row = a.proj + v4_token_row(r.table, pos) * a.ldp;
      const float x = to_f(row[w + off + ch]) + a.ape[int64_t(i) * a.lda + off + ch];
      const float v = to_f(row[off + ch]);
      if (x > m) {
        const float c = __expf(m - x);  // 0 on the first slot
        l = l * c + 1.0f;
        acc = acc * c + v;
        m = x;
      } else {
        const float pe = __expf(x - m);
        l += pe;
        acc += pe * v;
      }
    }
    const float pooled = acc / l;
    y[ch] = pooled;
    ss += pooled * pooled;
  }
  const float inv = rsqrtf(block_sum(ss, red) / float(a.d) + a.eps);  // block_sum syncs: y is complete
  const int base = a.d - a.rot, at = e * a.rate, half = a.rot / 2;
  bf16* out = a.entries + v4_entry_row(r.table, e, a.rate, a.per_block) * a.lde;
  for (int ch = threadIdx.x; ch < a.d; ch += blockDim.x) {
    float v = y[ch] * inv * a.norm[ch];
    if (ch >= base) {  // interleaved pairs (2k, 2k + 1) of the tail
      const int k = (ch - base) >> 1, c0 = base + 2 * k;
      const float x0 = y[c0] * inv * a.norm[c0], x1 = y[c0 + 1] * inv * a.norm[c0 + 1];
      const float c = a.cos[int64_t(at) * half + k], s = a.sin[int64_t(at) * half + k];
      v = ((ch - base) & 1) ? x1 * c + x0 * s : x0 * c - x1 * s;
    }
    out[ch] = __float2bfloat16(v);
  }
}

}  // namespace

void CudaOps::v4_compress(Tensor entries, int per_block, const Tensor& proj, const Tensor& ape,
                          const Tensor& norm, float eps, const RopeTable& rope, int rate, bool overlap,
                          const AttnMeta& m) {
  Prof prof_scope(this, "v4_compress");
  check_bf16_rows(entries, "v4_compress entries");
  check_bf16_rows(proj, "v4_compress projections");
  const int64_t d = entries.shape[1], w = overlap ? 2 * d : d;
  BELUGA_CHECK(ape.dtype == DType::kF32 && ape.ndim == 2 && ape.stride[1] == 1 && ape.shape[0] == rate &&
                   ape.shape[1] == w && proj.shape[1] == 2 * w && rate > 0 && per_block > 0 &&
                   rope.interleaved && rope.rotary_dim % 2 == 0 && rope.rotary_dim <= d &&
                   norm.numel() == d && m.block_size == 64,
               "v4_compress: shapes ", entries.describe(), " ", proj.describe(), " ", ape.describe());
  if (m.num_tokens == 0) return;
  const CompressArgs a{entries.ptr<bf16>(),
                       entries.stride[0],
                       per_block,
                       proj.ptr<const bf16>(),
                       proj.stride[0],
                       ape.ptr<const float>(),
                       ape.stride[0],
                       vec(norm),
                       eps,
                       rope.cos.ptr<const float>(),
                       rope.sin.ptr<const float>(),
                       rope.rotary_dim,
                       int(d),
                       rate,
                       overlap,
                       v4_step(m)};
  launch(v4_compress_kernel, unsigned(m.num_tokens), kCompressThreads, size_t(d) * sizeof(float), S(stream_),
         a);
  BELUGA_LAUNCH_CHECK();
}

}  // namespace beluga
