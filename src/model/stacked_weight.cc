#include "model/stacked_weight.h"

#include <cstring>

#include "util/error.h"

namespace beluga {

Weight load_stacked(WeightSource& src, Ops& ops, const std::vector<std::string>& prefixes,
                    const std::vector<int64_t>& outs, int64_t in, int64_t bn, int64_t bk, int64_t* n_params) {
  BELUGA_CHECK(!prefixes.empty() && prefixes.size() == outs.size(), "load_stacked: one width per part");
  const int64_t kblocks = (in + bk - 1) / bk;
  std::vector<Tensor> w, sc, bias;
  int64_t total = 0;
  bool any_bias = false, aligned = true;
  for (size_t i = 0; i < prefixes.size(); ++i) {
    w.push_back(src.get(prefixes[i] + ".weight", {outs[i], in}));
    BELUGA_CHECK(w[i].dtype == w[0].dtype, prefixes[i], ".weight: stacked parts need one dtype, got ",
                 w[i].describe(), " and ", w[0].describe());
    BELUGA_CHECK(w[i].dtype == DType::kBF16 || w[i].dtype == DType::kF32 || w[i].dtype == DType::kF8E4M3,
                 prefixes[i], ".weight: unsupported dtype ", w[i].describe());
    BELUGA_CHECK(w[i].is_contiguous(), prefixes[i], ".weight must be contiguous");
    if (w[i].dtype == DType::kF8E4M3) {
      sc.push_back(
          src.get(prefixes[i] + ".weight_scale_inv", {(outs[i] + bn - 1) / bn, kblocks}, DType::kF32));
      BELUGA_CHECK(sc[i].dtype == DType::kF32 && sc[i].is_contiguous(), prefixes[i],
                   ".weight_scale_inv must be F32");
    }
    aligned = aligned && total % bn == 0;
    bias.push_back(src.find(prefixes[i] + ".bias", {outs[i]}));
    any_bias = any_bias || !bias[i].empty();
    total += outs[i];
  }
  // FP8 parts stay FP8 when each starts on a scale block; otherwise (small test models) they are
  // dequantized to F32, the values the FP8 product computes with.
  const bool fp8 = w[0].dtype == DType::kF8E4M3 && aligned;
  const DType dt = w[0].dtype == DType::kF8E4M3 && !aligned ? DType::kF32 : w[0].dtype;
  Weight r;
  r.w = ops.alloc_persistent(dt, {total, in});
  if (fp8) {
    r.scale = ops.alloc_persistent(DType::kF32, {(total + bn - 1) / bn, kblocks});
    r.block_n = int(bn);
    r.block_k = int(bk);
  }
  if (any_bias) r.bias = ops.alloc_persistent(DType::kF32, {total});
  // Assembled on the host, then copied in one piece (the backend's tensors may not be host memory).
  std::vector<unsigned char> wbytes(r.w.nbytes());
  std::vector<float> svals(fp8 ? size_t(r.scale.numel()) : 0), bvals(any_bias ? size_t(total) : 0, 0.0f);
  // A source may hand out device tensors (the GPU's dummy weights): those come over to the host first.
  auto host_bytes = [&](const Tensor& t, std::vector<unsigned char>& keep) -> const void* {
    if (t.device == Device::kCpu) return t.data;
    keep.resize(t.nbytes());
    ops.copy_to_host(t, keep.data());
    return keep.data();
  };
  std::vector<unsigned char> wtmp, stmp, btmp;
  int64_t row = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    unsigned char* dst = wbytes.data() + size_t(row * in) * dtype_size(dt);
    const void* wsrc = host_bytes(w[i], wtmp);
    const float* s = sc.empty() ? nullptr : static_cast<const float*>(host_bytes(sc[i], stmp));
    if (dt == w[i].dtype) {
      std::memcpy(dst, wsrc, w[i].nbytes());
    } else {
      const uint8_t* q = static_cast<const uint8_t*>(wsrc);
      float* f = reinterpret_cast<float*>(dst);
      for (int64_t n = 0; n < outs[i]; ++n)
        for (int64_t k = 0; k < in; ++k) f[n * in + k] = fp8_block_value(q, s, n, k, in, bn, bk);
    }
    if (fp8) std::memcpy(svals.data() + size_t(row / bn * kblocks), s, sc[i].nbytes());
    if (!bias[i].empty()) {
      const void* bsrc = host_bytes(bias[i], btmp);
      for (int64_t j = 0; j < outs[i]; ++j)
        bvals[size_t(row + j)] = bias[i].dtype == DType::kF32
                                     ? static_cast<const float*>(bsrc)[j]
                                     : bf16_to_f32(static_cast<const uint16_t*>(bsrc)[j]);
    }
    if (n_params) *n_params += outs[i] * in + (bias[i].empty() ? 0 : outs[i]);
    row += outs[i];
  }
  ops.copy_from_host(r.w, wbytes.data());
  if (fp8) ops.copy_from_host(r.scale, svals.data());
  if (any_bias) ops.copy_from_host(r.bias, bvals.data());
  return r;
}

}  // namespace beluga
