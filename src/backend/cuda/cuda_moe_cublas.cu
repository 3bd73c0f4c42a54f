// Prefill experts through cuBLAS, with the plan's row counts on the host: one GEMM per expert and
// projection spread over side streams (long prefills), or grouped GEMMs, all experts' gate and up
// products in one call and all down products in another (fewer rows per expert, where one call per
// expert is host-bound).
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

namespace {

// The plan's first row per expert, on the host (waits for the stream).
std::vector<int> plan_starts(void* stream, const int* start_dev, int ne) {
  std::vector<int> start(size_t(ne) + 1);
  BELUGA_CUDA_CHECK(cudaMemcpyAsync(start.data(), start_dev, start.size() * sizeof(int),
                                    cudaMemcpyDeviceToHost, S(stream)));
  BELUGA_CUDA_CHECK(cudaStreamSynchronize(S(stream)));
  return start;
}

// out = silu(min(gate, limit)) * clamp(up, -limit, limit) from gu = [gate (I) | up (I)] rows
// (DeepSeek-V4's swiglu_limit; the same SiLU as silu_mul_kernel).
__global__ void clamped_swiglu_kernel(bf16* out, int64_t ldo, const bf16* gu, int64_t ldg, int R, int I,
                                      float limit) {
  pdl_entry();
  const int64_t n = int64_t(R) * I;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / I, c = i % I;
    out[r * ldo + c] = __float2bfloat16(swiglu(to_f(gu[r * ldg + c]), to_f(gu[r * ldg + I + c]), limit));
  }
}

}  // namespace

void CudaOps::run_expert_gemms(const Tensor& x, Tensor H, Tensor Y, std::span<const ExpertWeights> experts,
                               const ExpertWeights* shared, const int* start_dev, const int* row_token, int R,
                               float swiglu_limit) {
  const int E = int(experts.size()), ne = E + (shared ? 1 : 0), D = int(x.shape[1]);
  const int i_max = int(H.shape[1]);
  const std::vector<int> start = plan_starts(stream_, start_dev, ne);
  // BF16 weights first: a conversion runs on the main stream, which the side streams do not wait for.
  std::vector<Tensor> wg(static_cast<size_t>(ne)), wu(static_cast<size_t>(ne)), wd(static_cast<size_t>(ne));
  for (int e = 0; e < ne; ++e) {
    const ExpertWeights& w = e < E ? experts[size_t(e)] : *shared;
    wg[size_t(e)] = bf16_weight(w.gate.w, w.gate.scale, w.gate.block_n, w.gate.block_k);
    wu[size_t(e)] = bf16_weight(w.up.w, w.up.scale, w.up.block_n, w.up.block_k);
    wd[size_t(e)] = bf16_weight(w.down.w, w.down.scale, w.down.block_n, w.down.block_k);
  }
  // Token rows grouped by expert, then per expert: [gate | up] = A W^T into one [R, 2 * i_max] buffer,
  // H = silu(gate) * up, Y = H W_down^T (in Y's type, F32 or BF16, as the grouped kernels leave it).
  Tensor A = scratch(DType::kBF16, {R, D});
  gather_rows(A, x, Tensor::make(const_cast<int*>(row_token), DType::kI32, {R}, Device::kCuda));
  Tensor GU = scratch(DType::kBF16, {R, 2 * int64_t(i_max)});
  fork_side_streams();
  for (int e = 0, n = 0; e < ne; ++e) {
    const int r0 = start[size_t(e)], r1 = start[size_t(e) + 1];
    if (r1 == r0) continue;
    void* h = side_[size_t(n++ % kSideStreams)].cublas;
    const int64_t I = wg[size_t(e)].shape[0];
    const Tensor a = A.rows(r0, r1);
    gemm_bf16(GU.rows(r0, r1).cols(0, I), a, wg[size_t(e)], h);
    gemm_bf16(GU.rows(r0, r1).cols(i_max, i_max + I), a, wu[size_t(e)], h);
  }
  join_side_streams();
  // Columns past an expert's width hold garbage that its down GEMM never reads.
  if (swiglu_limit > 0) {
    check_bf16_rows(H, "swiglu output");
    const int I = int(H.shape[1]);
    launch(clamped_swiglu_kernel, grid_for(int64_t(R) * I), 256, 0, S(stream_), H.ptr<bf16>(), H.stride[0],
           GU.ptr<const bf16>(), GU.stride[0], R, I, swiglu_limit);
    BELUGA_LAUNCH_CHECK();
  } else {
    silu_mul(H, GU);
  }
  fork_side_streams();
  for (int e = 0, n = 0; e < ne; ++e) {
    const int r0 = start[size_t(e)], r1 = start[size_t(e) + 1];
    if (r1 == r0) continue;
    void* h = side_[size_t(n++ % kSideStreams)].cublas;
    gemm_bf16(Y.rows(r0, r1), H.rows(r0, r1).cols(0, wd[size_t(e)].shape[1]), wd[size_t(e)], h);
  }
  join_side_streams();
}

bool CudaOps::run_expert_gemms_grouped(const Tensor& x, Tensor H, Tensor Y,
                                       std::span<const ExpertWeights> experts, const ExpertWeights* shared,
                                       const int* start_dev, const int* row_token, int R) {
  const int E = int(experts.size()), ne = E + (shared ? 1 : 0), D = int(x.shape[1]);
  const int i_max = int(H.shape[1]);
  const std::vector<int> start = plan_starts(stream_, start_dev, ne);
  Tensor A = scratch(DType::kBF16, {R, D});
  gather_rows(A, x, Tensor::make(const_cast<int*>(row_token), DType::kI32, {R}, Device::kCuda));
  Tensor GU = scratch(DType::kBF16, {R, 2 * int64_t(i_max)});

  // Column-major view as in gemm_bf16: out^T [N, M] = W [K, N]^T x^T [K, M]. Group g: one expert's
  // problems (gate and up share their sizes); pointers live on the device, sizes on the host.
  std::vector<cublasOperation_t> ta, tb;
  std::vector<int> m, n, k, lda, ldb, ldc, gsize;
  std::vector<float> alpha, beta;
  std::vector<const void*> pa, pb;
  std::vector<void*> pc;
  auto add_group = [&](int rows, int N, int K, int ldx, int ldo, int count) {
    ta.push_back(CUBLAS_OP_T);
    tb.push_back(CUBLAS_OP_N);
    m.push_back(N);
    n.push_back(rows);
    k.push_back(K);
    lda.push_back(K);
    ldb.push_back(ldx);
    ldc.push_back(ldo);
    alpha.push_back(1.0f);
    beta.push_back(0.0f);
    gsize.push_back(count);
  };
  auto weight = [&](const Weight& w) { return bf16_weight(w.w, w.scale, w.block_n, w.block_k).data; };
  auto run = [&](cudaDataType_t ctype) {
    const size_t np = pa.size();
    Tensor ptrs = scratch(DType::kI64, {int64_t(3 * np)});
    std::vector<const void*> all(3 * np);
    for (size_t i = 0; i < np; ++i) {
      all[i] = pa[i];
      all[np + i] = pb[i];
      all[2 * np + i] = pc[i];
    }
    copy_from_host(ptrs, all.data());
    const void* const* d = ptrs.ptr<const void* const>();
    const cublasStatus_t s =
        cublasGemmGroupedBatchedEx(static_cast<cublasHandle_t>(cublas_), ta.data(), tb.data(), m.data(),
                                   n.data(), k.data(), alpha.data(), d, CUDA_R_16BF, lda.data(), d + np,
                                   CUDA_R_16BF, ldb.data(), beta.data(), const_cast<void* const*>(d + 2 * np),
                                   ctype, ldc.data(), int(gsize.size()), gsize.data(), CUBLAS_COMPUTE_32F);
    return s;
  };
  auto clear = [&] {
    ta.clear(), tb.clear(), m.clear(), n.clear(), k.clear(), lda.clear(), ldb.clear(), ldc.clear();
    gsize.clear(), alpha.clear(), beta.clear(), pa.clear(), pb.clear(), pc.clear();
  };
  for (int e = 0; e < ne; ++e) {
    const int r0 = start[size_t(e)], r1 = start[size_t(e) + 1];
    if (r1 == r0) continue;
    const ExpertWeights& w = e < E ? experts[size_t(e)] : *shared;
    const int I = int(w.gate.out_features());
    add_group(r1 - r0, I, D, int(A.stride[0]), int(GU.stride[0]), 2);
    pa.push_back(weight(w.gate));
    pa.push_back(weight(w.up));
    pb.push_back(A.at(r0));
    pb.push_back(A.at(r0));
    pc.push_back(GU.at(r0, 0));
    pc.push_back(GU.at(r0, i_max));
  }
  if (gsize.empty()) return true;
  cublasStatus_t s = run(CUDA_R_16BF);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED) return false;
  BELUGA_CUBLAS_CHECK(s);
  silu_mul(H, GU);  // columns past an expert's width hold garbage that its down GEMM never reads
  clear();
  for (int e = 0; e < ne; ++e) {
    const int r0 = start[size_t(e)], r1 = start[size_t(e) + 1];
    if (r1 == r0) continue;
    const ExpertWeights& w = e < E ? experts[size_t(e)] : *shared;
    add_group(r1 - r0, D, int(w.down.in_features()), int(H.stride[0]), int(Y.stride[0]), 1);
    pa.push_back(weight(w.down));
    pb.push_back(H.at(r0));
    pc.push_back(Y.at(r0));
  }
  s = run(Y.dtype == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF);
  if (s != CUBLAS_STATUS_NOT_SUPPORTED) {
    BELUGA_CUBLAS_CHECK(s);
    return true;
  }
  // Not offered grouped (F32 outputs from BF16 inputs may not be): one call per expert.
  for (int e = 0; e < ne; ++e) {
    const int r0 = start[size_t(e)], r1 = start[size_t(e) + 1];
    if (r1 == r0) continue;
    const ExpertWeights& w = e < E ? experts[size_t(e)] : *shared;
    gemm_bf16(Y.rows(r0, r1), H.rows(r0, r1).cols(0, w.down.in_features()),
              bf16_weight(w.down.w, w.down.scale, w.down.block_n, w.down.block_k));
  }
  return true;
}

void CudaOps::shared_expert_gemms(const Tensor& x, Tensor Y, const ExpertWeights& w, int side) {
  // Gate and up into one [T, 2 I] buffer as two GEMMs (the weights are separate matrices), SiLU-and-mul,
  // down.
  const Tensor wg = bf16_weight(w.gate.w, w.gate.scale, w.gate.block_n, w.gate.block_k);
  const Tensor wu = bf16_weight(w.up.w, w.up.scale, w.up.block_n, w.up.block_k);
  const Tensor wd = bf16_weight(w.down.w, w.down.scale, w.down.block_n, w.down.block_k);
  const int64_t I = wg.shape[0];
  void* cublas = side < 0 ? cublas_ : side_[size_t(side)].cublas;
  Tensor GU = scratch(DType::kBF16, {x.shape[0], 2 * I});
  Tensor H = scratch(DType::kBF16, {x.shape[0], I});
  gemm_bf16(GU.cols(0, I), x, wg, cublas);
  gemm_bf16(GU.cols(I, 2 * I), x, wu, cublas);
  silu_mul_on(H, GU, side < 0 ? stream_ : side_[size_t(side)].stream);
  gemm_bf16(Y, H, wd, cublas);
}

}  // namespace beluga
