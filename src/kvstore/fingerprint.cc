#include "kvstore/fingerprint.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t by value
#include <xxhash.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace beluga::kv {

namespace {

constexpr size_t kSampleBytes = 4096;  // of each host-resident tensor's data

BlockHash digest_of(const XXH3_state_t& st) {
  const XXH128_hash_t h = XXH3_128bits_digest(&st);
  return {h.low64, h.high64};
}

}  // namespace

struct FingerprintingSource::State {
  XXH3_state_t st;
};

FingerprintingSource::FingerprintingSource(WeightSource& inner)
    : inner_(inner), st_(std::make_unique<State>()) {
  XXH3_128bits_reset(&st_->st);
}

FingerprintingSource::~FingerprintingSource() = default;

void FingerprintingSource::record(const std::string& name, const Tensor& t) {
  XXH3_state_t& st = st_->st;
  XXH3_128bits_update(&st, name.data(), name.size() + 1);  // with its terminator: names stay apart
  if (t.empty()) return;                                   // an optional tensor that is absent
  const auto dt = uint8_t(t.dtype);
  XXH3_128bits_update(&st, &dt, 1);
  XXH3_128bits_update(&st, t.shape.data(), sizeof(int64_t) * size_t(t.ndim));
  if (t.device == Device::kCpu && t.is_contiguous())
    XXH3_128bits_update(&st, t.data, std::min(t.nbytes(), kSampleBytes));
}

Tensor FingerprintingSource::get(const std::string& name, const std::vector<int64_t>& shape, DType hint) {
  Tensor t = inner_.get(name, shape, hint);
  record(name, t);
  return t;
}

Tensor FingerprintingSource::find(const std::string& name, const std::vector<int64_t>& shape, DType hint) {
  Tensor t = inner_.find(name, shape, hint);
  record(name, t);
  return t;
}

Tensor FingerprintingSource::get_ids(const std::string& name, const std::vector<int64_t>& shape,
                                     int64_t bound) {
  Tensor t = inner_.get_ids(name, shape, bound);
  record(name, t);
  return t;
}

BlockHash FingerprintingSource::digest() const {
  return digest_of(st_->st);
}

BlockHash model_fingerprint(const std::string& config_json, const BlockHash& tensors, DType kv_dtype,
                            size_t kv_bytes_per_token, int block_size, int cache_shards) {
  const auto j = nlohmann::json::parse(config_json, nullptr, false);
  const std::string canon = j.is_discarded() ? config_json : j.dump();
  XXH3_state_t st;
  XXH3_128bits_reset(&st);
  const char kTag[] = "beluga-kv-v1";
  XXH3_128bits_update(&st, kTag, sizeof(kTag));
  XXH3_128bits_update(&st, canon.data(), canon.size());
  XXH3_128bits_update(&st, &tensors, sizeof(tensors));
  const uint64_t layout[3] = {uint64_t(kv_dtype), uint64_t(kv_bytes_per_token), uint64_t(block_size)};
  XXH3_128bits_update(&st, layout, sizeof(layout));
  if (cache_shards != 1) {  // one shard hashes as before: stored images stay valid
    const uint64_t shards = uint64_t(cache_shards);
    XXH3_128bits_update(&st, &shards, sizeof(shards));
  }
  return digest_of(st);
}

BlockHash tier_key(const BlockHash& block, const BlockHash& fingerprint) {
  const uint64_t v[4] = {block.lo, block.hi, fingerprint.lo, fingerprint.hi};
  const XXH128_hash_t h = XXH3_128bits(v, sizeof(v));
  return {h.low64, h.high64};
}

}  // namespace beluga::kv
