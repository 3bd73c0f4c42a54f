#include "engine/kv_connector.h"

#include "model/batch.h"
#include "model/model.h"

namespace beluga {

const char* kv_tier_name(KvTier t) {
  switch (t) {
    case KvTier::kDevice:
      return "device";
    case KvTier::kHost:
      return "host";
    case KvTier::kDisk:
      return "disk";
  }
  return "?";
}

size_t kv_block_image_bytes(const Model& m, const SpecConfig& spec) {
  const bool mtp = spec.enabled() && spec.method == SpecConfig::Method::kMtp;
  const size_t shards = m.step_peers() ? size_t(m.step_peers()->cache_shards()) : 1;
  return (m.kv_bytes_per_token() + (mtp ? m.mtp_kv_bytes_per_token() : 0)) * kKvBlockSize * shards;
}

}  // namespace beluga
