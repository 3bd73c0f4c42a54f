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

}  // namespace beluga
