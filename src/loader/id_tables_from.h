// IdTablesFrom: a WeightSource that takes its tensors from one source and its integer tables
// (get_ids: DeepSeek-V4's token -> experts table) from another. `--load-format dummy` on CUDA makes
// tensors on the device (CudaDummyWeights); an id
// table must be valid expert ids the loader checks on the host, so it comes from the host
// DummyWeights (the same ids the CPU's dummy source gives).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loader/weight_source.h"

namespace beluga {

class IdTablesFrom : public WeightSource {
 public:
  IdTablesFrom(std::unique_ptr<WeightSource> tensors, std::unique_ptr<WeightSource> ids)
      : tensors_(std::move(tensors)), ids_(std::move(ids)) {}
  Tensor get(const std::string& name, const std::vector<int64_t>& shape, DType dtype_hint) override {
    return tensors_->get(name, shape, dtype_hint);
  }
  Tensor find(const std::string& name, const std::vector<int64_t>& shape, DType dtype_hint) override {
    return tensors_->find(name, shape, dtype_hint);
  }
  size_t total_bytes() const override { return tensors_->total_bytes() + ids_->total_bytes(); }
  Tensor get_ids(const std::string& name, const std::vector<int64_t>& shape, int64_t bound) override {
    return ids_->get_ids(name, shape, bound);
  }

 private:
  std::unique_ptr<WeightSource> tensors_, ids_;
};

}  // namespace beluga
