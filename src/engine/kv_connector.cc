#include "engine/kv_connector.h"

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

}  // namespace beluga
