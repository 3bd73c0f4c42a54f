// The model fingerprint that extends every block key of the KV tiers, so that blocks of another model,
// another KV layout or another KV dtype never match, while replicas of one model share keys:
// a hash of the config, every tensor the model loaded (name, dtype, shape and a sample of its first
// bytes, so that two fine-tunes of one architecture differ), the KV dtype, the KV bytes per token and
// the block size.
#pragma once

#include <memory>
#include <string>

#include "engine/block_manager.h"
#include "loader/weight_source.h"

namespace beluga::kv {

// A WeightSource that passes every request on to `inner` (not owned) and hashes what it returned, in
// order: load a model through it, then take digest().
class FingerprintingSource : public WeightSource {
 public:
  explicit FingerprintingSource(WeightSource& inner);
  ~FingerprintingSource() override;
  Tensor get(const std::string& name, const std::vector<int64_t>& shape, DType dtype_hint) override;
  Tensor find(const std::string& name, const std::vector<int64_t>& shape, DType dtype_hint) override;
  Tensor get_ids(const std::string& name, const std::vector<int64_t>& shape, int64_t bound) override;
  size_t total_bytes() const override { return inner_.total_bytes(); }
  BlockHash digest() const;  // of the tensors handed out so far

 private:
  void record(const std::string& name, const Tensor& t);
  WeightSource& inner_;
  struct State;
  std::unique_ptr<State> st_;
};

// `config_json`: the model's config.json (parsed and dumped again, so formatting does not matter).
// `cache_shards`: the ranks whose slices a block's image holds in rank order (tensor parallel: its
// ranks; StepPeers::cache_shards), so images of different splits never mix.
BlockHash model_fingerprint(const std::string& config_json, const BlockHash& tensors, DType kv_dtype,
                            size_t kv_bytes_per_token, int block_size, int cache_shards = 1);

// The key of a block in the tiers: the engine's chained block hash extended with the fingerprint.
BlockHash tier_key(const BlockHash& block, const BlockHash& fingerprint);

}  // namespace beluga::kv
