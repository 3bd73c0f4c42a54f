#include "parallel/tensor_parallel.h"

#include <cstring>

#include "util/error.h"

namespace beluga {

SliceRange tensor_part(int64_t n, int part, int parts) {
  BELUGA_CHECK(parts >= 1 && part >= 0 && part < parts && n % parts == 0, "tensor parallel: ", n,
               " does not split into ", parts, " equal parts");
  return {n / parts * part, n / parts * (part + 1)};
}

namespace {

// Columns [c0, c1) of a contiguous 2-D tensor into buf.
Tensor copy_cols(const Tensor& t, int64_t c0, int64_t c1, std::vector<std::byte>& buf) {
  BELUGA_CHECK(t.ndim == 2 && t.is_contiguous(), "tensor parallel: a 2-D contiguous tensor expected, got ",
               t.describe());
  const size_t es = dtype_size(t.dtype), row = size_t(c1 - c0) * es;
  buf.resize(size_t(t.shape[0]) * row);
  for (int64_t r = 0; r < t.shape[0]; ++r)
    std::memcpy(buf.data() + size_t(r) * row, static_cast<const std::byte*>(t.at(r, c0)), row);
  return Tensor::make(buf.data(), t.dtype, {t.shape[0], c1 - c0});
}

}  // namespace

Tensor host_slice(const Tensor& t, int dim, int part, int parts, std::vector<std::byte>& buf,
                  int64_t granule) {
  BELUGA_CHECK(t.ndim == 2 && (dim == 0 || dim == 1), "tensor parallel: a 2-D tensor expected, got ",
               t.describe());
  const SliceRange s = tensor_part(t.shape[dim], part, parts);
  BELUGA_CHECK(s.begin % granule == 0 && (s.end % granule == 0 || s.end == t.shape[dim]),
               "tensor parallel: ", parts, " parts of ", t.shape[dim], " do not fall on the weight's ",
               granule, "-wide scale blocks");
  return dim == 0 ? t.rows(s.begin, s.end) : copy_cols(t, s.begin, s.end, buf);
}

Tensor scale_slice(const Tensor& scale, int dim, int64_t full, int part, int parts, int64_t block,
                   std::vector<std::byte>& buf) {
  const SliceRange s = tensor_part(full, part, parts);
  const int64_t b0 = s.begin / block, b1 = (s.end + block - 1) / block;
  return dim == 0 ? scale.rows(b0, b1) : copy_cols(scale, b0, b1, buf);
}

Tensor RowPartSource::part_of(const std::string& name, const std::vector<int64_t>& shape, DType hint,
                              bool required) {
  auto get = [&](const std::string& n, const std::vector<int64_t>& full, DType h) {
    return required ? inner_.get(n, full, h) : inner_.find(n, full, h);
  };
  if (name == prefix_ + ".weight") {
    BELUGA_CHECK(shape.size() == 2, name, ": a 2-D part expected");
    Tensor full = get(name, {rows_, shape[1]}, hint);
    if (full.empty()) return full;
    return host_slice(full, 0, part_, parts_, unused_, full.dtype == DType::kF8E4M3 ? block_ : 1);
  }
  if (name == prefix_ + ".weight_scale_inv") {
    BELUGA_CHECK(shape.size() == 2, name, ": a 2-D part expected");
    Tensor full = get(name, {(rows_ + block_ - 1) / block_, shape[1]}, hint);
    if (full.empty()) return full;
    return scale_slice(full, 0, rows_, part_, parts_, block_, unused_);
  }
  if (name == prefix_ + ".bias") {
    Tensor full = get(name, {rows_}, hint);
    if (full.empty()) return full;
    const SliceRange r = tensor_part(rows_, part_, parts_);
    return full.rows(r.begin, r.end);
  }
  return required ? inner_.get(name, shape, hint) : inner_.find(name, shape, hint);
}

Tensor RowPartSource::get(const std::string& name, const std::vector<int64_t>& shape, DType hint) {
  return part_of(name, shape, hint, true);
}

Tensor RowPartSource::find(const std::string& name, const std::vector<int64_t>& shape, DType hint) {
  return part_of(name, shape, hint, false);
}

void all_reduce_sum(Ops& ops, Communicator& comm, Tensor x) {
  BELUGA_CHECK(x.ndim == 2 && x.stride[1] == 1 && x.stride[0] == x.shape[1],
               "tensor parallel: a contiguous [rows, width] tensor to sum, got ", x.describe());
  if (comm.size() == 1 || x.numel() == 0) return;
  if (x.dtype == DType::kF32) {
    comm.all_reduce_sum(x.ptr<float>(), size_t(x.numel()));
    return;
  }
  Tensor f = ops.scratch(DType::kF32, {x.shape[0], x.shape[1]});
  ops.copy(f, x);
  comm.all_reduce_sum(f.ptr<float>(), size_t(f.numel()));
  ops.copy(x, f);
}

}  // namespace beluga
