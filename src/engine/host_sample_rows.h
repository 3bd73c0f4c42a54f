// HostSampleRows: the device sampler's contract (backend/sample_rows.h) on host memory, for the CPU
// backend, with the host sampler's arithmetic (sampler.h): the same tokens, logprobs and ranks as
// sample() for the same row. Set on a CPU model (Model::set_sampler), sampled rows are drawn on the
// model runner's thread at the end of the forward, so the step comes back as ids and the engine can
// launch the next step before this one's tokens are applied (the early launch covers sampled
// requests, not only greedy ones; speculative verification takes the drawn ids as on CUDA).
// Rows run one after another on the calling thread; buffers are reused, not allocated per step.
#pragma once

#include <vector>

#include "backend/sample_rows.h"

namespace beluga {

class HostSampleRows final : public SampleRowsOp {
 public:
  void sample_rows(Tensor out, const Tensor& logits, const Tensor& rows, const Tensor& masks,
                   const SampleEdits& edits) override;

 private:
  std::vector<float> row_, scratch_;
  std::vector<int> index_;
};

}  // namespace beluga
