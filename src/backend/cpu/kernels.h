// CPU compute kernels, one table per instruction set (AVX-512 with avx512_bf16, AVX2+FMA, scalar).
// select_kernels() picks the best the running CPU supports; tests compare every table with scalar.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace beluga::cpu {

// out[m*ldo + n] = sum_k x[m*ldx + k] * W[n, k] for m < M and n0 <= n < n1 (no bias).
// W is F32, BF16 or F8E4M3 (then multiplied by scale[(n/bn)*lds + k/bk]) with row stride ldw.
struct GemmArgs {
  const float* x;
  int64_t ldx;
  const uint16_t* xb;  // optional: x rounded to bf16 (row stride ldxb); used with BF16 weights when set
  int64_t ldxb;
  // optional: x split exactly into three bf16 terms hi + mid + lo (rows of 3*K: hi, then mid, then lo;
  // row stride 3*K). With BF16 weights the products are exact and accumulate in F32, so results keep
  // F32 precision while using the bf16 dot-product instruction. Only tables with split_exact use it.
  const uint16_t* xs;
  int M, K;
  const void* w;
  DType wtype;
  int64_t ldw;
  const float* scale;
  int64_t lds;
  int bn, bk;
  float* out;
  int64_t ldo;
};

struct Kernels {
  const char* name;
  bool split_exact;  // gemm uses GemmArgs::xs when given
  void (*gemm)(const GemmArgs& a, int n0, int n1);
  // out[m*ldo + n] = sum_k x[m*ldx + k] * b[k*ldb + n] for m < M, n < N: F32, B row-major ("NN").
  // No horizontal sums, so it suits small K (attention scores over a head dimension).
  void (*gemm_nn)(const float* x, int64_t ldx, int M, int K, const float* b, int64_t ldb, int N, float* out,
                  int64_t ldo);
  float (*dot)(const float* a, const float* b, int n);
  void (*axpy)(float alpha, const float* x, float* y, int n);  // y += alpha * x
  void (*to_bf16)(const float* x, uint16_t* y, int n);
  void (*split_bf16x3)(const float* x, uint16_t* y, int n);  // y[0..n) hi, [n..2n) mid, [2n..3n) lo
  // x[i] = exp(x[i] * scale - shift) for i < n; returns the sum (a softmax's denominator).
  float (*exp_sum)(float* x, int n, float scale, float shift);
  // out[i] = silu(g[i]) * u[i]
  void (*silu_mul)(const float* g, const float* u, float* out, int n);
};

const Kernels& kernels_scalar();
void split_bf16x3_scalar(const float* x, uint16_t* y, int n);
const Kernels& kernels_avx2();
const Kernels& kernels_avx512();
bool cpu_has_avx512_bf16();
bool cpu_has_avx2();
// The best supported table, unless BELUGA_CPU_KERNELS=scalar|avx2|avx512 says otherwise.
const Kernels& select_kernels();

}  // namespace beluga::cpu
