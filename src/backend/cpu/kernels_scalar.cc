// Reference kernels in plain C++: the fallback on old CPUs and the oracle for the SIMD tables.
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "util/error.h"

namespace beluga::cpu {

namespace {

inline float load_w(const GemmArgs& a, int n, int k) {
  const char* row = static_cast<const char*>(a.w) + int64_t(n) * a.ldw * int64_t(dtype_size(a.wtype));
  switch (a.wtype) {
    case DType::kF32:
      return reinterpret_cast<const float*>(row)[k];
    case DType::kBF16:
      return bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[k]);
    case DType::kF8E4M3:
      return f8e4m3_to_f32(reinterpret_cast<const uint8_t*>(row)[k]) * a.scale[(n / a.bn) * a.lds + k / a.bk];
    default:
      return 0.0f;
  }
}

void gemm(const GemmArgs& a, int n0, int n1) {
  const bool use_xb = a.xb && a.wtype == DType::kBF16;
  for (int m = 0; m < a.M; ++m)
    for (int n = n0; n < n1; ++n) {
      float acc = 0.0f;
      for (int k = 0; k < a.K; ++k) {
        float xv = use_xb ? bf16_to_f32(a.xb[m * a.ldxb + k]) : a.x[m * a.ldx + k];
        acc += xv * load_w(a, n, k);
      }
      a.out[m * a.ldo + n] = acc;
    }
}

void gemm_nn(const float* x, int64_t ldx, int M, int K, const float* b, int64_t ldb, int N, float* out,
             int64_t ldo) {
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int k = 0; k < K; ++k) acc += x[m * ldx + k] * b[k * ldb + n];
      out[m * ldo + n] = acc;
    }
}

float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy(float alpha, const float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void to_bf16(const float* x, uint16_t* y, int n) {
  for (int i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}

void split_bf16x3(const float* x, uint16_t* y, int n) {
  for (int i = 0; i < n; ++i) {
    const uint16_t hi = f32_to_bf16(x[i]);
    const float r1 = x[i] - bf16_to_f32(hi);
    const uint16_t mid = f32_to_bf16(r1);
    y[i] = hi;
    y[n + i] = mid;
    y[2 * n + i] = f32_to_bf16(r1 - bf16_to_f32(mid));
  }
}

float exp_sum(float* x, int n, float scale, float shift) {
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += (x[i] = std::exp(x[i] * scale - shift));
  return float(sum);
}

void silu_mul(const float* g, const float* u, float* out, int n) {
  for (int i = 0; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

}  // namespace

void split_bf16x3_scalar(const float* x, uint16_t* y, int n) {
  split_bf16x3(x, y, n);
}

const Kernels& kernels_scalar() {
  static const Kernels k{"scalar", false, gemm, gemm_nn, dot, axpy, to_bf16, split_bf16x3, exp_sum, silu_mul};
  return k;
}

bool cpu_has_avx512_bf16() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

bool cpu_has_avx2() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

const Kernels& select_kernels() {
  const char* env = std::getenv("BELUGA_CPU_KERNELS");
  if (env && std::strcmp(env, "scalar") == 0) return kernels_scalar();
  if (env && std::strcmp(env, "avx2") == 0) {
    BELUGA_CHECK(cpu_has_avx2(), "BELUGA_CPU_KERNELS=avx2 but this CPU lacks AVX2/FMA");
    return kernels_avx2();
  }
  if (env && std::strcmp(env, "avx512") == 0) {
    BELUGA_CHECK(cpu_has_avx512_bf16(), "BELUGA_CPU_KERNELS=avx512 but this CPU lacks AVX-512 BF16");
    return kernels_avx512();
  }
  if (cpu_has_avx512_bf16()) return kernels_avx512();
  if (cpu_has_avx2()) return kernels_avx2();
  return kernels_scalar();
}

}  // namespace beluga::cpu
