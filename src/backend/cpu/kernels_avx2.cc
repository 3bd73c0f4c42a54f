// AVX2 + FMA kernels: the fallback for CPUs without AVX-512 BF16. Same tiling as the AVX-512 table,
// 8 lanes, K tails in scalar; BF16 activations are widened back to f32 (there is no bf16 dot here).
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/kernels.h"

namespace beluga::cpu {

namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 cvt_bf16(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline __m256 cvt_f8(const uint8_t* p, float s) {
  __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  __m256i mag = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7f)), 20);
  __m256i sign = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x80)), 24);
  __m256 f =
      _mm256_mul_ps(_mm256_mul_ps(_mm256_castsi256_ps(mag), _mm256_set1_ps(0x1p120f)), _mm256_set1_ps(s));
  return _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(f), sign));
}

inline float w_scalar(const GemmArgs& a, int n, int k) {
  switch (a.wtype) {
    case DType::kF32:
      return static_cast<const float*>(a.w)[int64_t(n) * a.ldw + k];
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(a.w)[int64_t(n) * a.ldw + k]);
    default:
      return f8e4m3_to_f32(static_cast<const uint8_t*>(a.w)[int64_t(n) * a.ldw + k]) *
             a.scale[(n / a.bn) * a.lds + k / a.bk];
  }
}

inline __m256 w_vec(const GemmArgs& a, int n, int k) {
  switch (a.wtype) {
    case DType::kF32:
      return _mm256_loadu_ps(static_cast<const float*>(a.w) + int64_t(n) * a.ldw + k);
    case DType::kBF16:
      return cvt_bf16(static_cast<const uint16_t*>(a.w) + int64_t(n) * a.ldw + k);
    default:
      return cvt_f8(static_cast<const uint8_t*>(a.w) + int64_t(n) * a.ldw + k,
                    a.scale[(n / a.bn) * a.lds + k / a.bk]);
  }
}

// x rows as f32: the bf16 copy, when given, is widened so results match the AVX-512 bf16 path's inputs.
inline __m256 x_vec(const GemmArgs& a, int m, int k) {
  if (a.xb && a.wtype == DType::kBF16) return cvt_bf16(a.xb + int64_t(m) * a.ldxb + k);
  return _mm256_loadu_ps(a.x + int64_t(m) * a.ldx + k);
}
inline float x_scalar(const GemmArgs& a, int m, int k) {
  if (a.xb && a.wtype == DType::kBF16) return bf16_to_f32(a.xb[int64_t(m) * a.ldxb + k]);
  return a.x[int64_t(m) * a.ldx + k];
}

template <int MR, int NR>
void tile(const GemmArgs& a, int m, int n) {
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  int k = 0;
  for (; k + 8 <= a.K; k += 8) {
    __m256 wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = w_vec(a, n + j, k);
    for (int i = 0; i < MR; ++i) {
      __m256 xv = x_vec(a, m + i, k);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) {
      float s = hsum(acc[i][j]);
      for (int kk = k; kk < a.K; ++kk) s += x_scalar(a, m + i, kk) * w_scalar(a, n + j, kk);
      a.out[int64_t(m + i) * a.ldo + n + j] = s;
    }
}

template <int NR>
void rows(const GemmArgs& a, int m, int mr, int n) {
  if (mr == 2)
    tile<2, NR>(a, m, n);
  else
    tile<1, NR>(a, m, n);
}

void gemm(const GemmArgs& a, int n0, int n1) {
  constexpr int kRowBlock = 64;
  for (int m0 = 0; m0 < a.M; m0 += kRowBlock) {
    const int m1 = std::min(a.M, m0 + kRowBlock);
    int n = n0;
    for (; n + 4 <= n1; n += 4)
      for (int m = m0; m < m1; m += 2) rows<4>(a, m, std::min(2, m1 - m), n);
    for (; n < n1; ++n)
      for (int m = m0; m < m1; m += 2) rows<1>(a, m, std::min(2, m1 - m), n);
  }
}

// NN tile: MR rows of x times 32 columns of b (4 vectors); column tails in scalar.
template <int MR>
inline void tile_nn(const float* x, int64_t ldx, int K, const float* b, int64_t ldb, float* out,
                    int64_t ldo) {
  __m256 acc[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int k = 0; k < K; ++k) {
    __m256 bv[4];
    for (int j = 0; j < 4; ++j) bv[j] = _mm256_loadu_ps(b + k * ldb + 8 * j);
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_set1_ps(x[i * ldx + k]);
      for (int j = 0; j < 4; ++j) acc[i][j] = _mm256_fmadd_ps(xv, bv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(out + i * ldo + 8 * j, acc[i][j]);
}

void gemm_nn(const float* x, int64_t ldx, int M, int K, const float* b, int64_t ldb, int N, float* out,
             int64_t ldo) {
  int n = 0;
  for (; n + 32 <= N; n += 32) {
    int m = 0;
    for (; m + 2 <= M; m += 2) tile_nn<2>(x + m * ldx, ldx, K, b + n, ldb, out + m * ldo + n, ldo);
    for (; m < M; ++m) tile_nn<1>(x + m * ldx, ldx, K, b + n, ldb, out + m * ldo + n, ldo);
  }
  for (; n < N; ++n)
    for (int m = 0; m < M; ++m) {
      float acc = 0.0f;
      for (int k = 0; k < K; ++k) acc += x[m * ldx + k] * b[k * ldb + n];
      out[m * ldo + n] = acc;
    }
}

float dot(const float* a, const float* b, int n) {
  __m256 s = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s);
  float r = hsum(s);
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

void axpy(float alpha, const float* x, float* y, int n) {
  __m256 av = _mm256_set1_ps(alpha);
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += alpha * x[i];
}

void to_bf16(const float* x, uint16_t* y, int n) {
  for (int i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}

// e^x as in the AVX-512 table; 2^n is built in the exponent bits (inputs clamped to [-87, 88.7]).
inline __m256 exp256(__m256 x) {
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);  // -> exactly 0
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.72f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // n + 127 in the exponent field; n = 128 (x near 88.7) is split into two factors to stay finite.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256 f1 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 f2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(_mm256_mul_ps(p, f1), f2));
}

float exp_sum(float* x, int n, float scale, float shift) {
  const __m256 sc = _mm256_set1_ps(scale), sh = _mm256_set1_ps(shift);
  __m256 sum = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp256(_mm256_fmsub_ps(_mm256_loadu_ps(x + i), sc, sh));
    _mm256_storeu_ps(x + i, e);
    sum = _mm256_add_ps(sum, e);
  }
  float s = hsum(sum);
  for (; i < n; ++i) s += (x[i] = std::exp(x[i] * scale - shift));
  return s;
}

void silu_mul(const float* g, const float* u, float* out, int n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

}  // namespace

const Kernels& kernels_avx2() {
  static const Kernels k{"avx2",  false,   gemm, gemm_nn, dot, axpy, to_bf16, split_bf16x3_scalar,
                         exp_sum, silu_mul};
  return k;
}

}  // namespace beluga::cpu
