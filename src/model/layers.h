// Building blocks shared by the architectures: gated MLP, views of activation tensors.
#pragma once

#include "backend/ops.h"

namespace beluga {

struct MlpWeights {
  Weight gate, up, down;
  bool empty() const { return gate.w.empty(); }
};

// down(silu(gate x) * up x) with x = the normalized input (in.out), in scratch memory.
void run_mlp(Ops& ops, const MlpWeights& w, const NormedInput& in, Tensor out);  // out [T, D]

// A 2-D [T, H*d] tensor (rows may be strided) seen as [T, H, d].
Tensor split_heads(const Tensor& t, int64_t heads, int64_t dim);
// Head h of a [T, H, d] tensor as a 2-D [T, d] view.
Tensor head(const Tensor& t, int64_t h);
// A [T, H, d] tensor with contiguous heads seen as [T, H*d].
Tensor merge_heads(const Tensor& t);

// Sequences [s0, s1) of a step's attention metadata, for ops run on their token rows alone
// (rows query_start[s0] .. query_start[s1] of each token-wise tensor): the device arrays are views
// into `m`'s, except the query starts, rebased to 0 and uploaded to scratch. Needs m's host copies.
AttnMeta slice_meta(Ops& ops, const AttnMeta& m, int s0, int s1);

}  // namespace beluga
