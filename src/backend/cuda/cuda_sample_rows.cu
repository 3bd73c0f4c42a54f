// CudaSampleRows: checks the shapes and launches one block per row (cuda_sample_rows.cuh).
#include "backend/cuda/cuda_sample_rows.cuh"
#include "backend/cuda/cuda_sample_rows.h"

namespace beluga {

void CudaSampleRows::sample_rows(Tensor out, const Tensor& logits, const Tensor& rows, const Tensor& masks,
                                 const SampleEdits& edits) {
  CudaOps::Prof prof_scope(&ops_, "sample_rows");
  BELUGA_CHECK(logits.dtype == DType::kF32 && logits.ndim == 2 && logits.stride[1] == 1,
               "sample_rows: logits must be F32 [R, V], got ", logits.describe());
  const int64_t R = logits.shape[0], V = logits.shape[1];
  BELUGA_CHECK(out.dtype == DType::kI32 && out.is_contiguous() && out.numel() == R * kSampleOutCols,
               "sample_rows: out must be I32 [R, ", kSampleOutCols, "], got ", out.describe());
  BELUGA_CHECK(rows.dtype == DType::kI32 && rows.is_contiguous() &&
                   rows.numel() >= R * int64_t(sizeof(DeviceSampleRow) / 4),
               "sample_rows: rows must be I32 [>= R, ", kSampleRowWords, "], got ", rows.describe());
  const bool with_edits = !edits.edits.empty();
  if (with_edits)
    BELUGA_CHECK(edits.edits.dtype == DType::kI32 && edits.edits.is_contiguous() &&
                     edits.raw.dtype == DType::kF32 && edits.raw.numel() * 4 >= edits.edits.numel() &&
                     edits.lse.dtype == DType::kF32 && edits.lse.numel() >= R,
                 "sample_rows: edits must be I32 [E, 4] with F32 raw [>= E] and lse [>= R]");
  const int64_t words = (V + 31) / 32;
  BELUGA_CHECK(
      masks.empty() || (masks.dtype == DType::kI32 && masks.is_contiguous() && masks.numel() % words == 0),
      "sample_rows: masks must be I32 [M, ceil(V / 32)], got ", masks.describe());
  if (R == 0) return;
  const auto* row_params = static_cast<const DeviceSampleRow*>(rows.data);
  const auto* e = with_edits ? static_cast<const DeviceLogitEdit*>(edits.edits.data) : nullptr;
  float* raw = with_edits ? edits.raw.ptr<float>() : nullptr;
  float* lse = with_edits ? edits.lse.ptr<float>() : nullptr;
  // Rows without edits return at once: one launch either way, so a recorded graph serves both.
  if (with_edits) {
    cuda::launch(cuda::sampling::apply_edits_kernel, dim3(unsigned(R)), dim3(cuda::sampling::kThreads), 0,
                 cuda::S(ops_.stream()), const_cast<float*>(logits.ptr<const float>()), logits.stride[0],
                 int(V), row_params, e, raw, lse);
    BELUGA_LAUNCH_CHECK();
  }
  cuda::launch(cuda::sampling::sample_rows_kernel, dim3(unsigned(R)), dim3(cuda::sampling::kThreads), 0,
               cuda::S(ops_.stream()), out.ptr<int32_t>(), logits.ptr<const float>(), logits.stride[0],
               int(V), row_params, masks.empty() ? nullptr : static_cast<const uint32_t*>(masks.data),
               int(words), e, static_cast<const float*>(raw), static_cast<const float*>(lse));
  BELUGA_LAUNCH_CHECK();
}

}  // namespace beluga
