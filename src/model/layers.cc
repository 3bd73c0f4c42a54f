#include "model/layers.h"

#include "util/error.h"

namespace beluga {

void run_mlp(Ops& ops, const MlpWeights& w, const NormedInput& in, Tensor out) {
  const Tensor& x = in.out;
  const int64_t T = x.shape[0], I = w.gate.out_features();
  Tensor gu = ops.scratch(ops.act_dtype(), {T, 2 * I});
  ops.norm_linear(gu.cols(0, I), in, w.gate);
  ops.linear(gu.cols(I, 2 * I), x, w.up);
  Tensor h = ops.scratch(ops.act_dtype(), {T, I});
  ops.silu_mul(h, gu);
  ops.linear(out, h, w.down);
}

Tensor split_heads(const Tensor& t, int64_t heads, int64_t dim) {
  BELUGA_ASSERT(t.ndim == 2 && t.shape[1] == heads * dim && t.stride[1] == 1);
  Tensor r = t;
  r.ndim = 3;
  r.shape = {t.shape[0], heads, dim, 0};
  r.stride = {t.stride[0], dim, 1, 0};
  return r;
}

Tensor head(const Tensor& t, int64_t h) {
  BELUGA_ASSERT(t.ndim == 3);
  Tensor r = t;
  r.ndim = 2;
  r.data = static_cast<char*>(t.data) + h * t.stride[1] * int64_t(dtype_size(t.dtype));
  r.shape = {t.shape[0], t.shape[2], 0, 0};
  r.stride = {t.stride[0], t.stride[2], 0, 0};
  return r;
}

Tensor merge_heads(const Tensor& t) {
  BELUGA_ASSERT(t.ndim == 3 && t.stride[2] == 1 && t.stride[1] == t.shape[2]);
  Tensor r = t;
  r.ndim = 2;
  r.shape = {t.shape[0], t.shape[1] * t.shape[2], 0, 0};
  r.stride = {t.stride[0], 1, 0, 0};
  return r;
}

AttnMeta slice_meta(Ops& ops, const AttnMeta& m, int s0, int s1) {
  BELUGA_ASSERT(0 <= s0 && s0 <= s1 && s1 <= m.num_seqs && int(m.h_query_start.size()) == m.num_seqs + 1 &&
                int(m.h_context_len.size()) == m.num_seqs);
  const int t0 = m.h_query_start[size_t(s0)], t1 = m.h_query_start[size_t(s1)];
  AttnMeta r;
  r.num_seqs = s1 - s0;
  r.num_tokens = t1 - t0;
  r.block_size = m.block_size;
  r.max_blocks = m.max_blocks;
  r.context_len = m.context_len + s0;
  r.block_table = m.block_table + int64_t(s0) * m.max_blocks;
  r.slot_mapping = m.slot_mapping + t0;
  r.positions = m.positions + t0;
  r.h_query_start.reserve(size_t(r.num_seqs) + 1);
  for (int s = s0; s <= s1; ++s) r.h_query_start.push_back(m.h_query_start[size_t(s)] - t0);
  r.h_context_len.assign(m.h_context_len.begin() + s0, m.h_context_len.begin() + s1);
  if (!m.h_block_table.empty())
    r.h_block_table.assign(m.h_block_table.begin() + int64_t(s0) * m.max_blocks,
                           m.h_block_table.begin() + int64_t(s1) * m.max_blocks);
  Tensor qs = ops.scratch(DType::kI32, {int64_t(r.h_query_start.size())});
  ops.copy_from_host(qs, r.h_query_start.data());
  r.query_start = qs.ptr<const int32_t>();
  return r;
}

}  // namespace beluga
