// What the retention tests of the host tier and of the file tier share: a TieredStore configuration
// on an injected clock (now_, which the test moves, starting at kT0) and saving a block for a traffic
// class through one engine step.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>

#include "kv_test_support.h"
#include "kvstore/tiered_store.h"

namespace beluga::kv::testing {

class ClockedStore : public ::testing::Test {
 protected:
  // Blocks of `block_bytes` for the model `fingerprint`, `host_blocks` of them in the host tier, on now_.
  StoreConfig clocked_config(size_t block_bytes, const BlockHash& fingerprint, size_t host_blocks) {
    StoreConfig sc;
    sc.block_bytes = block_bytes;
    sc.fingerprint = fingerprint;
    sc.host_bytes = host_blocks * block_bytes;
    sc.now = [this] { return now_.load(); };
    return sc;
  }
  // Saves `k` for `cls` (every byte the low byte of its hash) and waits for its file, if any, to be written.
  static void save(TieredStore& st, const BlockHash& k, const std::string& cls) {
    std::byte* p = st.start_save(k, cls);
    ASSERT_NE(p, nullptr);
    std::memset(p, int(k.lo & 0xff), st.block_bytes());
    st.step_launched();
    st.step_done(true);
    st.drain();
  }

  std::atomic<int64_t> now_{kT0};
};

}  // namespace beluga::kv::testing
