// Several linears over the same input as one weight, their outputs side by side (as vLLM's merged
// projections): one product then streams all of them, which is what decode steps are bound by.
#pragma once

#include <string>
#include <vector>

#include "backend/ops.h"
#include "loader/weight_source.h"

namespace beluga {

// Loads `prefixes[i]`.weight ([outs[i], in]; optional .bias, FP8 .weight_scale_inv) and stacks them
// into one weight of sum(outs) rows on `ops`; part i's outputs are columns [sum(outs[<i]), +outs[i]).
// Parts share a dtype. FP8 parts stay FP8 (scales stacked) when each starts on a bn-row scale block,
// else they are dequantized to F32 (exactly the values the FP8 product uses). A missing bias among
// biased parts is zeros. Adds the parts' parameter counts to *n_params when given.
Weight load_stacked(WeightSource& src, Ops& ops, const std::vector<std::string>& prefixes,
                    const std::vector<int64_t>& outs, int64_t in, int64_t bn, int64_t bk, int64_t* n_params);

}  // namespace beluga
