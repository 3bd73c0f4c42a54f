// Tensor parallelism's two pieces outside the model (Megatron's column- and row-parallel linears):
// which part of a dimension a rank holds, a 2-D checkpoint tensor's slice of it, and the sum of the
// ranks' partial outputs after a row-parallel product. The model decides what it splits
// (model.h: TensorParallelism).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "backend/ops.h"
#include "loader/weight_source.h"
#include "parallel/communicator.h"

namespace beluga {

// [begin, end) of part `part` of `n` split into `parts` equal parts (n % parts == 0: checked).
struct SliceRange {
  int64_t begin = 0, end = 0;
};
SliceRange tensor_part(int64_t n, int part, int parts);

// Part `part` of a 2-D host tensor along `dim` (0: its rows, a view of `t`; 1: its columns, copied
// into `buf`, which the result points into), the dimension split in `parts` equal parts. `granule`:
// the part must start (and end, or reach the end) on a multiple of it (an FP8 weight's scale block);
// the same part of its scale tensor is then `scale_slice`.
Tensor host_slice(const Tensor& t, int dim, int part, int parts, std::vector<std::byte>& buf,
                  int64_t granule = 1);
// The slice of a block-scale tensor ([ceil(out / bn), ceil(in / bk)]) covering part `part` of the
// weight's dimension `dim` of `full` elements, blocks of `block` elements.
Tensor scale_slice(const Tensor& scale, int dim, int64_t full, int part, int parts, int64_t block,
                   std::vector<std::byte>& buf);

// A WeightSource that hands out part `part` of `parts` of one linear's rows (`prefix`.weight, its FP8
// .weight_scale_inv and .bias, asked for with the part's shape) and every other tensor as `inner`
// has it: so a loader that stacks several linears (stacked_weight.h) can stack a rank's part of one.
// The parts are views of `inner`'s tensors.
class RowPartSource : public WeightSource {
 public:
  RowPartSource(WeightSource& inner, std::string prefix, int64_t rows, int part, int parts,
                int64_t scale_block)
      : inner_(inner),
        prefix_(std::move(prefix)),
        rows_(rows),
        part_(part),
        parts_(parts),
        block_(scale_block) {}
  Tensor get(const std::string& name, const std::vector<int64_t>& shape, DType hint = DType::kBF16) override;
  Tensor find(const std::string& name, const std::vector<int64_t>& shape, DType hint = DType::kBF16) override;
  size_t total_bytes() const override { return inner_.total_bytes(); }

 private:
  // The part of `name` when it is one of the split linear's tensors; none otherwise.
  Tensor part_of(const std::string& name, const std::vector<int64_t>& shape, DType hint, bool required);
  WeightSource& inner_;
  std::string prefix_;
  int64_t rows_;
  int part_, parts_;
  int64_t block_;
  std::vector<std::byte> unused_;  // host_slice's buffer (row parts never copy)
};

// x (any dtype the backend copies to F32, contiguous rows) = the sum of x over the group, the same
// bits on every rank (summed in rank order); F32 tensors in place, others through an F32 copy.
void all_reduce_sum(Ops& ops, Communicator& comm, Tensor x);

}  // namespace beluga
