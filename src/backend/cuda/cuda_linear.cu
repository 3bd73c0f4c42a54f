// CudaOps' dense products: weights converted to BF16 once (F32, FP8 with block scales), cuBLAS GEMMs,
// our GEMV kernel for the few-row products of decode (dense and per head), and the bias epilogue.
#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemm_invariant.h"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_norm.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

namespace {

template <typename OutT, int kLanes>
__global__ void __launch_bounds__(kGemvThreads)
    gemv_kernel(OutT* out, int64_t ldo, const bf16* x, int64_t ldx, const bf16* w, int64_t ldw, int M, int N,
                int K8, HeadStrides hs) {
  pdl_entry();
  gemv_block<OutT, kLanes>(out, ldo, x, ldx, w, ldw, M, N, K8, hs, blockIdx.x, blockIdx.y);
}

// norm_linear for M <= kGemvRows rows: every block normalizes the input rows into shared memory
// (block_rmsnorm_rows; block 0 also stores them), then the GEMV.
template <typename OutT, int kRows>
__global__ void __launch_bounds__(kGemvThreads, 4)
    norm_gemv_kernel(OutT* out, int64_t ldo, const bf16* w, int64_t ldw, int M, int N, NormArgs n) {
  const GemvSums<kRows> y = smem_gemv<kRows>(w, ldw, M, N, n.D, [&](bf16* xs) {
    block_rmsnorm_rows<kRows>(n, 0, M, xs, n.D, xs, n.D, blockIdx.x == 0);
  });
  store_gemv_sums(out, ldo, y, M, N);
}

// The device view of an MtpInput whose fused kernel applies (BF16 table and rows in 16-byte pieces).
struct MtpInputArgs {
  const bf16* table;
  int64_t ldt;
  const int32_t* ids;
  const bf16* hidden;
  int64_t ldh;
  const int32_t* rows;  // null: row t
  bool ids_by_row;
  VecRef enorm, hnorm;
  float eps;
  int D;
};

// mtp_input for M <= kGemvRows rows: every block gathers and normalizes each row's embedding and
// hidden row into its [M, 2D] shared rows (block_rmsnorm_rows, as rmsnorm alone), then the eh_proj
// GEMV: one kernel where the composition launches six.
template <int kRows>
__global__ void __launch_bounds__(kGemvThreads, 4)
    mtp_input_kernel(bf16* out, int64_t ldo, const bf16* w, int64_t ldw, int M, int N, MtpInputArgs a) {
  const int K = 2 * a.D;
  const GemvSums<kRows> y = smem_gemv<kRows>(w, ldw, M, N, K, [&](bf16* xs) {
    for (int r = 0; r < M; ++r) {
      const int h = a.rows ? a.rows[r] : r;
      const int id = a.ids[a.ids_by_row ? h : r];
      const NormArgs e{
          a.table + int64_t(id) * a.ldt, 0, nullptr, 0, nullptr, 0, a.enorm, a.eps, nullptr, 0, a.D};
      block_rmsnorm_rows<1>(e, 0, 1, nullptr, 0, xs + r * K, K, false);
      const NormArgs hn{
          a.hidden + int64_t(h) * a.ldh, 0, nullptr, 0, nullptr, 0, a.hnorm, a.eps, nullptr, 0, a.D};
      block_rmsnorm_rows<1>(hn, 0, 1, nullptr, 0, xs + r * K + a.D, K, false);
    }
  });
  store_gemv_sums(out, ldo, y, M, N);
}

// Launches the GEMV with the narrowest lane group that still covers a row in one pass.
template <typename OutT>
void launch_gemv(OutT* out, int64_t ldo, const bf16* x, int64_t ldx, const bf16* w, int64_t ldw, int M, int N,
                 int K8, HeadStrides hs, int heads, cudaStream_t st) {
  auto go = [&](auto kernel, int lanes) {
    const dim3 grid(unsigned(ceil_div(int64_t(N) * lanes, kGemvThreads)), unsigned(heads));
    launch(kernel, grid, kGemvThreads, 0, st, out, ldo, x, ldx, w, ldw, M, N, K8, hs);
  };
  const int lanes = gemv_lanes(K8);
  if (lanes == 8)
    go(gemv_kernel<OutT, 8>, 8);
  else if (lanes == 16)
    go(gemv_kernel<OutT, 16>, 16);
  else
    go(gemv_kernel<OutT, 32>, 32);
  BELUGA_LAUNCH_CHECK();
}

template <typename T>
__global__ void bias_kernel(T* out, int64_t ldo, VecRef b, int M, int N) {
  pdl_entry();
  const int64_t n = int64_t(M) * N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / N, c = i % N;
    out[r * ldo + c] = from_f<T>(to_f(out[r * ldo + c]) + b[c]);
  }
}

// FP8 E4M3 (block scales) or F32 -> BF16, row-major [N, K].
__global__ void to_bf16_kernel(bf16* out, const void* w, bool fp8, const float* scale, int64_t lds, int bn,
                               int bk, int64_t N, int64_t K) {
  pdl_entry();
  const int64_t n = N * K;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / K, c = i % K;
    float v;
    if (fp8) {
      const uint8_t b = static_cast<const uint8_t*>(w)[i];
      if ((b & 0x7f) == 0x7f) {
        v = __int_as_float(0x7fc00000);
      } else {
        v = __uint_as_float(uint32_t(b & 0x7f) << 20) * 0x1p120f;
        if (b & 0x80) v = -v;
      }
      v *= scale[(r / bn) * lds + c / bk];
    } else {
      v = static_cast<const float*>(w)[i];
    }
    out[i] = __float2bfloat16(v);
  }
}

}  // namespace

Tensor CudaOps::bf16_weight(const Tensor& w, const Tensor& scale, int block_n, int block_k) {
  if (w.dtype == DType::kBF16) return w;
  auto it = converted_.find(w.data);
  if (it != converted_.end()) return it->second;
  BELUGA_CHECK(w.dtype == DType::kF32 || w.dtype == DType::kF8E4M3, "weight dtype ", w.describe(),
               " unsupported");
  BELUGA_CHECK(w.is_contiguous(), "weight must be contiguous, got ", w.describe());
  const bool fp8 = w.dtype == DType::kF8E4M3;
  BELUGA_CHECK(!fp8 || (!scale.empty() && scale.dtype == DType::kF32), "FP8 weight without F32 block scales");
  int64_t shape[4] = {w.shape[0], w.shape[1], w.shape[2], w.shape[3]};
  const int64_t K = w.shape[w.ndim - 1], N = w.numel() / K;
  void* p = nullptr;
  BELUGA_CUDA_CHECK(cudaMalloc(&p, size_t(N * K) * 2));
  persistent_.push_back(p);
  persistent_bytes_ += size_t(N * K) * 2;
  launch(to_bf16_kernel, grid_for(N * K), 256, 0, S(stream_), static_cast<bf16*>(p), w.data, fp8,
         fp8 ? scale.ptr<const float>() : nullptr, fp8 ? scale.stride[0] : 0, block_n, block_k, N, K);
  BELUGA_LAUNCH_CHECK();
  Tensor t = Tensor::make(p, DType::kBF16, shape, w.ndim, Device::kCuda);
  return converted_.emplace(w.data, t).first->second;
}

void CudaOps::invariant_product(Tensor out, const Tensor& x, const Tensor& w, void* stream) {
  const bool heads = x.ndim == 3;  // x [T, H, K], w [H, N, K], out [T, H, N]; else x [M, K], w [N, K]
  InvariantGemm g;
  g.M = int(x.shape[0]), g.K = int(x.shape[x.ndim - 1]), g.N = int(w.shape[w.ndim - 2]);
  g.batch = heads ? int(x.shape[1]) : 1;
  g.out = out.data;
  g.out_f32 = out.dtype == DType::kF32;
  g.ldo = out.stride[0];
  g.out_z = heads ? out.stride[1] : 0;
  g.w = w.data;
  g.ldw = w.stride[w.ndim - 2];
  g.w_z = heads ? w.stride[0] : 0;
  g.x = x.data;
  g.ldx = x.stride[0];
  g.x_z = heads ? x.stride[1] : 0;
  if (!invariant_gemm_ok(g)) {  // a view whose rows are not 16-byte pieces: its values, copied
    const Tensor x16 = heads ? scratch(DType::kBF16, {x.shape[0], x.shape[1], g.K})
                             : scratch(DType::kBF16, {x.shape[0], g.K});
    copy(x16, x);
    g.x = x16.data;
    g.ldx = x16.stride[0];
    g.x_z = heads ? x16.stride[1] : 0;
  }
  BELUGA_CHECK(invariant_gemm_ok(g), "--deterministic on CUDA needs weights in rows of 8 elements (K ", g.K,
               ", row stride ", g.ldw, ")");
  invariant_gemm(g, stream);
}

void CudaOps::gemm_bf16(Tensor out, const Tensor& x, const Tensor& w, void* cublas) {
  const int M = int(x.shape[0]), K = int(x.shape[1]), N = int(w.shape[0]);
  if (deterministic_) {
    cudaStream_t st = S(stream_);
    if (cublas) BELUGA_CUBLAS_CHECK(cublasGetStream(static_cast<cublasHandle_t>(cublas), &st));
    invariant_product(out, x, w, st);
    return;
  }
  if (!cublas && M <= kGemvRows && gemv_shape(N, K) && K % 8 == 0 && x.stride[0] % 8 == 0 &&
      w.stride[0] % 8 == 0 && aligned16(x.data) && aligned16(w.data)) {
    if (out.dtype == DType::kF32)
      launch_gemv(out.ptr<float>(), out.stride[0], x.ptr<const bf16>(), x.stride[0], w.ptr<const bf16>(),
                  w.stride[0], M, N, K / 8, HeadStrides{}, 1, S(stream_));
    else
      launch_gemv(out.ptr<bf16>(), out.stride[0], x.ptr<const bf16>(), x.stride[0], w.ptr<const bf16>(),
                  w.stride[0], M, N, K / 8, HeadStrides{}, 1, S(stream_));
    return;
  }
  const float one = 1.0f, zero = 0.0f;
  const cudaDataType_t ct = out.dtype == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  // Column-major view: out^T [N, M] = W [K, N]^T * x^T [K, M].
  BELUGA_CUBLAS_CHECK(cublasGemmEx(static_cast<cublasHandle_t>(cublas ? cublas : cublas_), CUBLAS_OP_T,
                                   CUBLAS_OP_N, N, M, K, &one, w.data, CUDA_R_16BF, int(w.stride[0]), x.data,
                                   CUDA_R_16BF, int(x.stride[0]), &zero, out.data, ct, int(out.stride[0]),
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void CudaOps::linear(Tensor out, const Tensor& x, const Weight& w) {
  Prof prof_scope(this, "linear");
  check_bf16_rows(x, "linear input");
  BELUGA_CHECK((out.dtype == DType::kBF16 || out.dtype == DType::kF32) && out.ndim == 2 && out.stride[1] == 1,
               "linear output must be a BF16 or F32 matrix, got ", out.describe());
  const int M = int(x.shape[0]), K = int(x.shape[1]), N = int(w.out_features());
  BELUGA_CHECK(w.in_features() == K && out.shape[1] == N && out.shape[0] == M, "linear: shapes ",
               x.describe(), " x ", w.w.describe(), " -> ", out.describe());
  if (M == 0) return;
  const Tensor& wb = bf16_weight(w.w, w.scale, w.block_n, w.block_k);
  BELUGA_CHECK(wb.stride[1] == 1, "linear: weight must have unit column stride");
  gemm_bf16(out, x, wb);
  if (!w.bias.empty()) {
    if (out.dtype == DType::kF32)
      launch(bias_kernel<float>, grid_for(int64_t(M) * N), 256, 0, S(stream_), out.ptr<float>(),
             out.stride[0], vec(w.bias), M, N);
    else
      launch(bias_kernel<bf16>, grid_for(int64_t(M) * N), 256, 0, S(stream_), out.ptr<bf16>(), out.stride[0],
             vec(w.bias), M, N);
    BELUGA_LAUNCH_CHECK();
  }
}

Tensor CudaOps::smem_gemv_weight(const Weight& w, int M, int N, int K) {
  if (deterministic_ || M < 1 || M > kGemvRows || int64_t(M) * K * 2 > (48 << 10) || K % 8 != 0 ||
      K / 8 <= 16 || !gemv_shape(N, K) || !w.bias.empty() || w.in_features() != K || w.out_features() != N)
    return {};
  Tensor wb = bf16_weight(w.w, w.scale, w.block_n, w.block_k);
  return wb.stride[1] == 1 && wb.stride[0] % 8 == 0 && aligned16(wb.data) ? wb : Tensor{};
}

void CudaOps::norm_linear(Tensor out, const NormedInput& in, const Weight& w) {
  const int M = int(in.out.shape[0]), D = int(in.out.shape[1]), N = int(w.out_features());
  NormArgs na{};
  // The demo model's q_a + kv_a (N 208, D 256) in one kernel of 5.3-5.5 us where an rmsnorm and a
  // cuBLAS GEMM took 3.2 + 3.9 (H100 runs 353, 355).
  const bool shaped = out.ndim == 2 && out.stride[1] == 1 && out.shape[0] == M && out.shape[1] == N &&
                      (out.dtype == DType::kBF16 || out.dtype == DType::kF32) && norm_args(in, &na);
  const Tensor wb = shaped ? smem_gemv_weight(w, M, N, D) : Tensor{};
  if (wb.empty()) {
    Ops::norm_linear(out, in, w);
    return;
  }
  Prof prof_scope(this, "norm_linear");
  const int grid = int(ceil_div(int64_t(N) * 32, kGemvThreads));
  const size_t smem = size_t(M) * D * 2;
  auto go = [&](auto* o, auto kernel1, auto kernel4) {
    launch(M == 1 ? kernel1 : kernel4, grid, kGemvThreads, smem, S(stream_), o, out.stride[0],
           wb.ptr<const bf16>(), wb.stride[0], M, N, na);
  };
  if (out.dtype == DType::kF32)
    go(out.ptr<float>(), norm_gemv_kernel<float, 1>, norm_gemv_kernel<float, kGemvRows>);
  else
    go(out.ptr<bf16>(), norm_gemv_kernel<bf16, 1>, norm_gemv_kernel<bf16, kGemvRows>);
  BELUGA_LAUNCH_CHECK();
}

void CudaOps::mtp_input(Tensor out, const MtpInput& in, const Weight& eh_proj) {
  const int M = int(out.shape[0]), D = int(out.shape[1]), K = 2 * D;
  auto rows16 = [](const Tensor& t) {
    return t.dtype == DType::kBF16 && t.ndim == 2 && t.stride[1] == 1 && t.stride[0] % 8 == 0 &&
           aligned16(t.data);
  };
  auto vec16 = [](const Tensor& t, int64_t n) {
    return (t.dtype == DType::kF32 || t.dtype == DType::kBF16) && t.numel() == n && aligned16(t.data);
  };
  auto i32 = [](const Tensor& t) { return t.dtype == DType::kI32 && t.is_contiguous(); };
  const bool shaped = D % 8 == 0 && rows16(out) && out.shape[0] == M && rows16(in.table) &&
                      in.table.shape[1] == D && rows16(in.hidden) && in.hidden.shape[1] == D &&
                      vec16(in.enorm, D) && vec16(in.hnorm, D) && i32(in.ids) &&
                      (in.rows.empty() ? !in.ids_by_row : i32(in.rows) && in.rows.numel() == M) &&
                      (in.ids_by_row || in.ids.numel() == M);
  const Tensor wb = shaped ? smem_gemv_weight(eh_proj, M, D, K) : Tensor{};
  if (wb.empty()) {
    Ops::mtp_input(out, in, eh_proj);
    return;
  }
  Prof prof_scope(this, "mtp_input");
  const MtpInputArgs a{in.table.ptr<const bf16>(),
                       in.table.stride[0],
                       in.ids.ptr<const int32_t>(),
                       in.hidden.ptr<const bf16>(),
                       in.hidden.stride[0],
                       in.rows.empty() ? nullptr : in.rows.ptr<const int32_t>(),
                       in.ids_by_row,
                       vec(in.enorm),
                       vec(in.hnorm),
                       in.eps,
                       D};
  const int grid = int(ceil_div(int64_t(D) * 32, kGemvThreads));
  launch(M == 1 ? mtp_input_kernel<1> : mtp_input_kernel<kGemvRows>, grid, kGemvThreads, size_t(M) * K * 2,
         S(stream_), out.ptr<bf16>(), out.stride[0], wb.ptr<const bf16>(), wb.stride[0], M, D, a);
  BELUGA_LAUNCH_CHECK();
}

void CudaOps::linear_heads(Tensor out, const Tensor& x, const Tensor& w_in) {
  Prof prof_scope(this, "linear_heads");
  const int64_t T = x.shape[0], H = x.shape[1], K = x.shape[2], N = w_in.shape[1];
  BELUGA_CHECK(w_in.ndim == 3 && w_in.shape[0] == H && w_in.shape[2] == K && w_in.stride[2] == 1 &&
                   out.shape[2] == N && x.stride[2] == 1 && out.stride[2] == 1 && x.dtype == DType::kBF16 &&
                   out.dtype == DType::kBF16,
               "linear_heads: shapes ", x.describe(), " x ", w_in.describe(), " -> ", out.describe());
  if (T == 0) return;
  const Tensor& w = bf16_weight(w_in, Tensor{}, 128, 128);
  if (deterministic_) {
    invariant_product(out, x, w, stream_);
    return;
  }
  if (heads_gemv_ok(x, w)) {
    launch_gemv(out.ptr<bf16>(), out.stride[0], x.ptr<const bf16>(), x.stride[0], w.ptr<const bf16>(),
                w.stride[1], int(T), int(N), int(K / 8), HeadStrides{x.stride[1], w.stride[0], out.stride[1]},
                int(H), S(stream_));
    return;
  }
  const float one = 1.0f, zero = 0.0f;
  BELUGA_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      static_cast<cublasHandle_t>(cublas_), CUBLAS_OP_T, CUBLAS_OP_N, int(N), int(T), int(K), &one, w.data,
      CUDA_R_16BF, int(w.stride[1]), w.stride[0], x.data, CUDA_R_16BF, int(x.stride[0]), x.stride[1], &zero,
      out.data, CUDA_R_16BF, int(out.stride[0]), out.stride[1], int(H), CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

}  // namespace beluga
