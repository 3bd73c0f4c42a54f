// The CUDA backend's device sampler (backend/sample_rows.h): the kernel of cuda_sample_rows.cuh on
// the backend's stream. Host code includes this header (no CUDA types).
#pragma once

#include "backend/cuda/cuda_ops.h"
#include "backend/sample_rows.h"

namespace beluga {

class CudaSampleRows final : public SampleRowsOp {
 public:
  explicit CudaSampleRows(CudaOps& ops) : ops_(ops) {}
  void sample_rows(Tensor out, const Tensor& logits, const Tensor& rows, const Tensor& masks,
                   const SampleEdits& edits = {}) override;

 private:
  CudaOps& ops_;
};

}  // namespace beluga
