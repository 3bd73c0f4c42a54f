// AVX-512 kernels (compiled with -mavx512f/bw/vl/dq/bf16; only called when the CPU has them).
// GEMM as register tiles of MR rows of x times NR rows of W, both K-contiguous: each W vector is
// converted once to f32 and reused for MR rows; F32 activations keep results within float rounding of
// the reference, BF16 activations (xb) use vdpbf16ps at twice the rate.
// GCC 12's AVX-512 headers build some intrinsics on _mm512_undefined_*(), which -Wuninitialized
// reports at every use; the values are fully written before they are read.
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // a GCC-only group
#endif
#include <immintrin.h>

#include <algorithm>

#include "backend/cpu/kernels.h"

namespace beluga::cpu {

namespace {

inline __m512 cvt_bf16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// e4m3 bits moved into an f32's exponent/mantissa, times 2^120, is the exact value (see dtype.h).
inline __m512 cvt_f8(__m128i b, __m512 scale) {
  __m512i v = _mm512_cvtepu8_epi32(b);
  __m512i mag = _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x7f)), 20);
  __m512i sign = _mm512_slli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0x80)), 24);
  __m512 f = _mm512_mul_ps(_mm512_mul_ps(_mm512_castsi512_ps(mag), _mm512_set1_ps(0x1p120f)), scale);
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(f), sign));
}

struct WF32 {
  const float* w;
  int64_t ldw;
  __m512 load(int j, int k, __mmask16 m) const { return _mm512_maskz_loadu_ps(m, w + j * ldw + k); }
};
struct WBF16 {
  const uint16_t* w;
  int64_t ldw;
  __m512 load(int j, int k, __mmask16 m) const {
    return cvt_bf16(_mm256_maskz_loadu_epi16(m, w + j * ldw + k));
  }
};
struct WF8 {
  const uint8_t* w;
  int64_t ldw;
  const float* scale;  // scale row of this tile's first W row
  int64_t lds;
  int n, bn, bk;  // absolute index of row 0, block sizes
  __m512 load(int j, int k, __mmask16 m) const {
    float s = scale[((n + j) / bn - n / bn) * lds + k / bk];
    return cvt_f8(_mm_maskz_loadu_epi8(m, w + j * ldw + k), _mm512_set1_ps(s));
  }
};

template <int MR, int NR, typename W>
inline void tile_f32(const float* x, int64_t ldx, int K, const W& w, float* out, int64_t ldo) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  int k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = w.load(j, k, 0xffff);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (k < K) {
    __mmask16 m = __mmask16((1u << (K - k)) - 1);
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = w.load(j, k, m);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m512 xv = _mm512_maskz_loadu_ps(m, x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) out[i * ldo + j] = _mm512_reduce_add_ps(acc[i][j]);
}

template <int MR, int NR>
inline void tile_bf16(const uint16_t* x, int64_t ldx, int K, const uint16_t* w, int64_t ldw, float* out,
                      int64_t ldo) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  int k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512i wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = _mm512_loadu_si512(w + j * ldw + k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m512i xv = _mm512_loadu_si512(x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)xv, (__m512bh)wv[j]);
    }
  }
  if (k < K) {
    __mmask32 m = __mmask32((1ull << (K - k)) - 1);
    __m512i wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = _mm512_maskz_loadu_epi16(m, w + j * ldw + k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      __m512i xv = _mm512_maskz_loadu_epi16(m, x + i * ldx + k);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)xv, (__m512bh)wv[j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) out[i * ldo + j] = _mm512_reduce_add_ps(acc[i][j]);
}

// x split into three exact bf16 terms (GemmArgs::xs): three dot-product instructions per W vector.
template <int MR, int NR>
inline void tile_bf16x3(const uint16_t* x, int64_t ldx, int K, const uint16_t* w, int64_t ldw, float* out,
                        int64_t ldo) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int k = 0; k < K; k += 32) {
    const __mmask32 m = K - k >= 32 ? __mmask32(0xffffffffu) : __mmask32((1ull << (K - k)) - 1);
    __m512i wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = _mm512_maskz_loadu_epi16(m, w + j * ldw + k);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 3
      for (int part = 0; part < 3; ++part) {
        const __m512i xv = _mm512_maskz_loadu_epi16(m, x + i * ldx + part * K + k);
#pragma GCC unroll 8
        for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], (__m512bh)xv, (__m512bh)wv[j]);
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) out[i * ldo + j] = _mm512_reduce_add_ps(acc[i][j]);
}

template <int NR, typename W>
inline void rows_f32(const GemmArgs& a, int m, int mr, const W& w, int n) {
  const float* x = a.x + int64_t(m) * a.ldx;
  float* o = a.out + int64_t(m) * a.ldo + n;
  switch (mr) {
    case 4:
      tile_f32<4, NR>(x, a.ldx, a.K, w, o, a.ldo);
      break;
    case 3:
      tile_f32<3, NR>(x, a.ldx, a.K, w, o, a.ldo);
      break;
    case 2:
      tile_f32<2, NR>(x, a.ldx, a.K, w, o, a.ldo);
      break;
    default:
      tile_f32<1, NR>(x, a.ldx, a.K, w, o, a.ldo);
      break;
  }
}

template <int NR>
inline void rows_bf16(const GemmArgs& a, int m, int mr, const uint16_t* w, int n) {
  const uint16_t* x = a.xb + int64_t(m) * a.ldxb;
  float* o = a.out + int64_t(m) * a.ldo + n;
  switch (mr) {
    case 4:
      tile_bf16<4, NR>(x, a.ldxb, a.K, w, a.ldw, o, a.ldo);
      break;
    case 3:
      tile_bf16<3, NR>(x, a.ldxb, a.K, w, a.ldw, o, a.ldo);
      break;
    case 2:
      tile_bf16<2, NR>(x, a.ldxb, a.K, w, a.ldw, o, a.ldo);
      break;
    default:
      tile_bf16<1, NR>(x, a.ldxb, a.K, w, a.ldw, o, a.ldo);
      break;
  }
}

template <int NR>
void tile_any(const GemmArgs& a, int m, int mr, int n) {
  switch (a.wtype) {
    case DType::kF32:
      rows_f32<NR>(a, m, mr, WF32{static_cast<const float*>(a.w) + int64_t(n) * a.ldw, a.ldw}, n);
      break;
    case DType::kBF16: {
      const uint16_t* w = static_cast<const uint16_t*>(a.w) + int64_t(n) * a.ldw;
      if (a.xs) {
        const uint16_t* x = a.xs + int64_t(m) * 3 * a.K;
        float* o = a.out + int64_t(m) * a.ldo + n;
        if (mr == 2)
          tile_bf16x3<2, NR>(x, 3 * a.K, a.K, w, a.ldw, o, a.ldo);
        else
          for (int i = 0; i < mr; ++i)
            tile_bf16x3<1, NR>(x + i * 3 * a.K, 3 * a.K, a.K, w, a.ldw, o + i * a.ldo, a.ldo);
      } else if (a.xb)
        rows_bf16<NR>(a, m, mr, w, n);
      else
        rows_f32<NR>(a, m, mr, WBF16{w, a.ldw}, n);
      break;
    }
    case DType::kF8E4M3:
      rows_f32<NR>(a, m, mr,
                   WF8{static_cast<const uint8_t*>(a.w) + int64_t(n) * a.ldw, a.ldw,
                       a.scale + (n / a.bn) * a.lds, a.lds, n, a.bn, a.bk},
                   n);
      break;
    default:
      break;
  }
}

void gemm(const GemmArgs& a, int n0, int n1) {
  // Blocks of x rows stay in L2 while the W tiles of [n0, n1) stream past them.
  constexpr int kRowBlock = 64;
  for (int m0 = 0; m0 < a.M; m0 += kRowBlock) {
    const int m1 = std::min(a.M, m0 + kRowBlock);
    int n = n0;
    // One or two rows (decode): eight W rows at a time keep more memory streams in flight.
    if (m1 - m0 <= 2)
      for (; n + 8 <= n1; n += 8)
        for (int m = m0; m < m1; ++m) tile_any<8>(a, m, 1, n);
    for (; n + 4 <= n1; n += 4)
      for (int m = m0; m < m1; m += 4) tile_any<4>(a, m, std::min(4, m1 - m), n);
    for (; n < n1; ++n)
      for (int m = m0; m < m1; m += 4) tile_any<1>(a, m, std::min(4, m1 - m), n);
  }
}

// NN register tile: MR rows of x times 16*NV columns of b; x values are broadcast, b rows loaded.
template <int MR, int NV>
inline void tile_nn(const float* x, int64_t ldx, int K, const float* b, int64_t ldb, int cols, float* out,
                    int64_t ldo) {
  __m512 acc[MR][NV];
  __mmask16 mask[NV];
#pragma GCC unroll 8
  for (int j = 0; j < NV; ++j) {
    const int left = cols - 16 * j;
    mask[j] = left >= 16 ? __mmask16(0xffff) : left <= 0 ? __mmask16(0) : __mmask16((1u << left) - 1);
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int k = 0; k < K; ++k) {
    __m512 bv[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) bv[j] = _mm512_maskz_loadu_ps(mask[j], b + k * ldb + 16 * j);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_set1_ps(x[i * ldx + k]);
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_fmadd_ps(xv, bv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) _mm512_mask_storeu_ps(out + i * ldo + 16 * j, mask[j], acc[i][j]);
}

void gemm_nn(const float* x, int64_t ldx, int M, int K, const float* b, int64_t ldb, int N, float* out,
             int64_t ldo) {
  for (int n = 0; n < N; n += 64) {
    const int cols = std::min(64, N - n);
    int m = 0;
    for (; m + 4 <= M; m += 4) tile_nn<4, 4>(x + m * ldx, ldx, K, b + n, ldb, cols, out + m * ldo + n, ldo);
    for (; m < M; ++m) tile_nn<1, 4>(x + m * ldx, ldx, K, b + n, ldb, cols, out + m * ldo + n, ldo);
  }
}

float dot(const float* a, const float* b, int n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  for (; i < n; i += 16) {
    __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

void axpy(float alpha, const float* x, float* y, int n) {
  __m512 av = _mm512_set1_ps(alpha);
  for (int i = 0; i < n; i += 16) {
    __mmask16 m = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(
        y + i, m, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

void split_bf16x3(const float* x, uint16_t* y, int n) {
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    const __m256bh hi = _mm512_cvtneps_pbh(v);
    const __m512 r1 =
        _mm512_sub_ps(v, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)hi), 16)));
    const __m256bh mid = _mm512_cvtneps_pbh(r1);
    const __m512 r2 =
        _mm512_sub_ps(r1, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)mid), 16)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), (__m256i)hi);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + n + i), (__m256i)mid);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + 2 * n + i), (__m256i)_mm512_cvtneps_pbh(r2));
  }
  if (i < n) {  // the tail, in the same layout
    for (int j = i; j < n; ++j) {
      const uint16_t hi = f32_to_bf16(x[j]);
      const float r1 = x[j] - bf16_to_f32(hi);
      const uint16_t mid = f32_to_bf16(r1);
      y[j] = hi;
      y[n + j] = mid;
      y[2 * n + j] = f32_to_bf16(r1 - bf16_to_f32(mid));
    }
  }
}

void to_bf16(const float* x, uint16_t* y, int n) {
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), (__m256i)h);
  }
  for (; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}

// e^x: x = n ln2 + r with |r| <= ln2/2 (two-part ln2), a degree-6 polynomial for e^r (relative error
// below 2e-7), then 2^n by scalef. Inputs below -110 give 0; above 88.7 clamp to the largest float.
inline __m512 exp512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-110.0f)), _mm512_set1_ps(88.72f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

inline __mmask16 tail_mask(int n, int i) {
  return n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
}

float exp_sum(float* x, int n, float scale, float shift) {
  const __m512 sc = _mm512_set1_ps(scale), sh = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n, i);
    const __m512 e = exp512(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(m, x + i), sc, sh));
    _mm512_mask_storeu_ps(x + i, m, e);
    sum = _mm512_mask_add_ps(sum, m, sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

void silu_mul(const float* g, const float* u, float* out, int n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n, i);
    const __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
    const __m512 s = _mm512_div_ps(gv, _mm512_add_ps(one, exp512(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + i)));
  }
}

}  // namespace

const Kernels& kernels_avx512() {
  static const Kernels k{"avx512", true, gemm, gemm_nn, dot, axpy, to_bf16, split_bf16x3, exp_sum, silu_mul};
  return k;
}

}  // namespace beluga::cpu
