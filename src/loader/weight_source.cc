#include "loader/weight_source.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "util/error.h"
#include "util/file.h"
#include "util/mix.h"

namespace beluga {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Checkpoint::Checkpoint(const std::string& dir) {
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (file_exists(index_path)) {
    nlohmann::json idx;
    try {
      idx = nlohmann::json::parse(read_file(index_path));
    } catch (const nlohmann::json::exception& e) {
      fail(index_path, ": invalid JSON: ", e.what());
    }
    BELUGA_CHECK(idx.contains("weight_map") && idx["weight_map"].is_object(), index_path, ": no weight_map");
    std::set<std::string> shards;
    for (auto& [name, file] : idx["weight_map"].items()) {
      BELUGA_CHECK(file.is_string(), index_path, ": weight_map entry ", name, " is not a file name");
      shards.insert(file.get<std::string>());
    }
    for (const auto& s : shards) {
      BELUGA_CHECK(s.find('/') == std::string::npos, index_path, ": shard name ", s,
                   " must be a plain file name");
      files_.push_back(std::make_unique<SafetensorsFile>(dir + "/" + s));
    }
    for (auto& [name, file] : idx["weight_map"].items()) {
      const std::string path = dir + "/" + file.get<std::string>();
      const TensorInfo* t = nullptr;
      for (const auto& f : files_)
        if (f->path() == path) t = f->find(name);
      BELUGA_CHECK(t, index_path, ": tensor ", name, " is not in its shard ", file.get<std::string>());
      index_[name] = t;
    }
  } else {
    const std::string single = dir + "/model.safetensors";
    BELUGA_CHECK(file_exists(single), "no model.safetensors or model.safetensors.index.json in ", dir);
    files_.push_back(std::make_unique<SafetensorsFile>(single));
    for (const auto& [name, info] : files_.back()->tensors()) index_[name] = &info;
  }
}

Tensor Checkpoint::find(const std::string& name, const std::vector<int64_t>& shape, DType) {
  auto it = index_.find(name);
  if (it == index_.end()) return {};
  const TensorInfo& t = *it->second;
  BELUGA_CHECK(t.shape == shape, "tensor ", name, " has shape ", shape_str(t.shape), ", expected ",
               shape_str(shape));
  return t.view();
}

Tensor Checkpoint::get(const std::string& name, const std::vector<int64_t>& shape, DType hint) {
  Tensor t = find(name, shape, hint);
  BELUGA_CHECK(!t.empty(), "checkpoint is missing tensor ", name);
  return t;
}

size_t Checkpoint::total_bytes() const {
  size_t n = 0;
  for (const auto& [name, t] : index_) n += t->nbytes;
  return n;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> r;
  for (const auto& [name, t] : index_) r.push_back(name);
  return r;
}

std::map<std::string, int64_t> Checkpoint::dtype_counts() const {
  std::map<std::string, int64_t> r;
  for (const auto& [name, t] : index_)
    r[std::string(dtype_name(t->dtype))] += int64_t(t->nbytes / dtype_size(t->dtype));
  return r;
}

Tensor DummyWeights::find(const std::string& name, const std::vector<int64_t>& shape, DType hint) {
  // A dummy checkpoint has no optional tensors except those a real one always has.
  if (ends_with(name, "weight_scale_inv") || ends_with(name, ".bias")) return {};
  return get(name, shape, hint);
}

Tensor DummyWeights::get(const std::string& name, const std::vector<int64_t>& shape, DType hint) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  const DType dt = (hint == DType::kF32) ? DType::kF32 : DType::kBF16;
  // The same tensor asked again (each thread rank loads its part of it) is the one made before:
  // its bytes are held and counted once, as a checkpoint's are.
  if (auto it = made_.find(name); it != made_.end()) {
    const Tensor& t = it->second;
    if (t.dtype == dt && t.ndim == int(shape.size()) && std::equal(shape.begin(), shape.end(), t.shape.begin()))
      return t;
  }
  auto buf = std::make_unique<unsigned char[]>(size_t(n) * dtype_size(dt));
  uint64_t h = seed_;
  for (char c : name) h = mix64(h ^ uint64_t(uint8_t(c)));
  // Norm weights are 1 and correction biases 0, as after initialisation; matrices are uniform with
  // std 1/sqrt(fan_in) so activations keep their scale through the layers.
  float lo = 0, hi = 0, center = 0;
  if (ends_with(name, "norm.weight")) {
    center = 1.0f;
  } else if (ends_with(name, "e_score_correction_bias")) {
    center = 0.0f;
  } else {
    float fan_in = shape.size() >= 2 ? float(shape.back()) : 1.0f;
    float a = std::sqrt(3.0f / fan_in);
    lo = -a;
    hi = a;
  }
  const float span = hi - lo;
#pragma omp parallel for schedule(static) if (n > (1 << 18))
  for (int64_t i = 0; i < n; ++i) {
    float v = center;
    if (span > 0) v = lo + span * float(mix64(h + uint64_t(i)) >> 40) * (1.0f / float(1 << 24));
    if (dt == DType::kF32)
      reinterpret_cast<float*>(buf.get())[i] = v;
    else
      reinterpret_cast<uint16_t*>(buf.get())[i] = f32_to_bf16(v);
  }
  Tensor t = Tensor::make(buf.get(), dt, shape.data(), int(shape.size()));
  bytes_ += t.nbytes();
  buffers_.push_back(std::move(buf));
  made_[name] = t;
  return t;
}

Tensor DummyWeights::get_ids(const std::string& name, const std::vector<int64_t>& shape, int64_t bound) {
  BELUGA_CHECK(shape.size() == 2 && bound >= shape[1], name,
               ": a dummy id table needs [rows, k] with k <= ", bound);
  const int64_t rows = shape[0], k = shape[1];
  auto buf = std::make_unique<unsigned char[]>(size_t(rows * k) * sizeof(int32_t));
  auto* ids = reinterpret_cast<int32_t*>(buf.get());
  uint64_t h = seed_;
  for (char c : name) h = mix64(h ^ uint64_t(uint8_t(c)));
  // Pseudo-random ids; one already in the row moves to the next free id.
  for (int64_t r = 0; r < rows; ++r) {
    int32_t* row = ids + r * k;
    for (int64_t i = 0; i < k; ++i) {
      int64_t e = int64_t(mix64(h + uint64_t(r * k + i)) % uint64_t(bound));
      while (std::find(row, row + i, int32_t(e)) != row + i) e = (e + 1) % bound;
      row[i] = int32_t(e);
    }
  }
  Tensor t = Tensor::make(buf.get(), DType::kI32, shape.data(), int(shape.size()));
  bytes_ += t.nbytes();
  buffers_.push_back(std::move(buf));
  return t;
}

}  // namespace beluga
