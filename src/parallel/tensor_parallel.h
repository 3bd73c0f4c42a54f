// Tensor parallelism's two pieces outside the model (Megatron's column- and row-parallel linears):
// which part of a dimension a rank holds, a 2-D checkpoint tensor's slice of it, and the sum of the
// ranks' partial outputs after a row-parallel product. The model decides what it splits
// (model.h: TensorParallelism).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/ops.h"
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

// x (any dtype the backend copies to F32, contiguous rows) = the sum of x over the group, the same
// bits on every rank (summed in rank order); F32 tensors in place, others through an F32 copy.
void all_reduce_sum(Ops& ops, Communicator& comm, Tensor x);

}  // namespace beluga
