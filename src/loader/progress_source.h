// A WeightSource that passes every request on to `inner` (not owned) and advances a Progress by the
// bytes of each tensor it hands out: loading walks the tensors in order and converts or uploads each
// as it gets it, so the bar follows the load. A tensor asked for twice (a module sharing another's
// embedding) counts once, so the count never passes the checkpoint's total.
#pragma once

#include <string>
#include <unordered_set>

#include "loader/weight_source.h"
#include "util/progress.h"

namespace beluga {

class ProgressSource : public WeightSource {
 public:
  ProgressSource(WeightSource& inner, Progress& progress) : inner_(inner), progress_(progress) {}
  Tensor get(const std::string& name, const std::vector<int64_t>& shape, DType dtype_hint) override {
    return counted(name, inner_.get(name, shape, dtype_hint));
  }
  Tensor find(const std::string& name, const std::vector<int64_t>& shape, DType dtype_hint) override {
    return counted(name, inner_.find(name, shape, dtype_hint));
  }
  Tensor get_ids(const std::string& name, const std::vector<int64_t>& shape, int64_t bound) override {
    return counted(name, inner_.get_ids(name, shape, bound));
  }
  size_t total_bytes() const override { return inner_.total_bytes(); }

 private:
  Tensor counted(const std::string& name, Tensor t) {
    if (!t.empty() && seen_.insert(name).second) progress_.advance(t.nbytes());
    return t;
  }
  WeightSource& inner_;
  Progress& progress_;
  std::unordered_set<std::string> seen_;
};

}  // namespace beluga
