// WeightSource: where a model's tensors come from, by Hugging Face tensor name.
// Checkpoint reads safetensors (one file or a sharded index); DummyWeights makes deterministic random
// tensors of the requested shape (`--load-format dummy`, for benchmarking shapes we cannot download).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loader/safetensors.h"
#include "tensor/tensor.h"

namespace beluga {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The tensor `name` with exactly `shape`; throws naming the tensor when absent or misshapen.
  // `dtype_hint` is the dtype a dummy source produces (a real checkpoint returns what it stores).
  virtual Tensor get(const std::string& name, const std::vector<int64_t>& shape,
                     DType dtype_hint = DType::kBF16) = 0;
  // Like get, but an absent tensor returns an empty Tensor (optional weights: biases, FP8 scales).
  virtual Tensor find(const std::string& name, const std::vector<int64_t>& shape,
                      DType dtype_hint = DType::kBF16) = 0;
  virtual size_t total_bytes() const = 0;
  // An integer table (I32 or I64 as stored) whose values the caller expects in [0, bound), as
  // DeepSeek-V4's token -> experts table; the caller checks the values. A dummy source makes each
  // row's values distinct and spread over [0, bound) (hash routing needs distinct experts).
  virtual Tensor get_ids(const std::string& name, const std::vector<int64_t>& shape, int64_t /*bound*/) {
    return get(name, shape, DType::kI64);
  }
};

class Checkpoint : public WeightSource {
 public:
  // `dir` holds model.safetensors, or model.safetensors.index.json and its shards.
  explicit Checkpoint(const std::string& dir);
  Tensor get(const std::string& name, const std::vector<int64_t>& shape, DType dtype_hint) override;
  Tensor find(const std::string& name, const std::vector<int64_t>& shape, DType dtype_hint) override;
  size_t total_bytes() const override;
  std::vector<std::string> names() const;
  std::map<std::string, int64_t> dtype_counts() const;  // elements stored per dtype name

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> index_;
};

class DummyWeights : public WeightSource {
 public:
  explicit DummyWeights(uint64_t seed = 0) : seed_(seed) {}
  Tensor get(const std::string& name, const std::vector<int64_t>& shape, DType dtype_hint) override;
  Tensor find(const std::string& name, const std::vector<int64_t>& shape, DType dtype_hint) override;
  Tensor get_ids(const std::string& name, const std::vector<int64_t>& shape, int64_t bound) override;
  size_t total_bytes() const override { return bytes_; }

 private:
  uint64_t seed_;
  size_t bytes_ = 0;
  std::vector<std::unique_ptr<unsigned char[]>> buffers_;
  std::map<std::string, Tensor> made_;  // by name: the tensor get() made last
};

}  // namespace beluga
