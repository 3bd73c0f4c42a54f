// Retention per traffic class in the host tier (no file tier), with an injected clock: a block
// expires when its class's retention has passed since its last use (a miss, then gone), a block
// used by several classes keeps the longest retention, eviction takes expired blocks before the
// least recently used, and the hit tokens per tier and class that /metrics reports.
#include <gtest/gtest.h>

#include "clocked_store.h"
#include "kvstore/host_pool.h"
#include "kvstore/metrics_text.h"
#include "kvstore/tiered_store.h"
#include "model/batch.h"

namespace beluga::kv {
namespace {

using testing::kDay;
using testing::kT0;

class HostRetention : public testing::ClockedStore {
 protected:
  StoreConfig config(int host_blocks) { return clocked_config(1000, {8, 9}, size_t(host_blocks)); }
  static bool in_host(TieredStore& st, const BlockHash& k) { return st.lookup(&k, 1, nullptr) == 1; }
  // Loads `k` for class `cls`; true when it came from the host tier.
  static bool load(TieredStore& st, const BlockHash& k, const std::string& cls) {
    const int block = 0;
    const auto id = st.start_load(&k, &block, 1, cls);
    EXPECT_TRUE(st.load_ready(id));
    std::vector<KvCopy> copies;
    KvTier tier = KvTier::kDevice;
    const int got = st.finish_load(id, copies, &tier);
    st.step_launched();
    st.step_done(true);
    return got == 1 && tier == KvTier::kHost;
  }
};

TEST_F(HostRetention, BlocksExpireByClassSinceLastUse) {
  TieredStore st(config(8));
  const BlockHash a{1, 1}, b{2, 2}, c{3, 3};
  save(st, a, "agent");
  save(st, b, "chat");
  save(st, c, "agent");
  now_ = kT0 + 2 * kDay;
  EXPECT_TRUE(load(st, c, "agent"));  // c used again on day 2
  now_ = kT0 + 4 * kDay;
  EXPECT_FALSE(in_host(st, a)) << "agent: 3 days since its last use";
  EXPECT_TRUE(in_host(st, b)) << "chat keeps 7 days";
  EXPECT_TRUE(in_host(st, c)) << "used on day 2: 2 days ago";
  EXPECT_EQ(st.stats().host.expirations, 1);
  EXPECT_EQ(st.stats().host_class_blocks, (std::map<std::string, int64_t>{{"agent", 1}, {"chat", 1}}));
  // Without any lookup, a step's end sweeps what has expired.
  now_ = kT0 + 8 * kDay;
  st.step_launched();
  st.step_done(true);
  EXPECT_EQ(st.stats().host.expirations, 3);
  EXPECT_EQ(st.stats().host.blocks, 0);
  EXPECT_FALSE(in_host(st, b));
}

TEST_F(HostRetention, ASharedBlockKeepsTheLongestRetention) {
  TieredStore st(config(8));
  const BlockHash a{1, 1}, b{2, 2};
  save(st, a, "agent");
  save(st, b, "agent");
  st.touch(&a, 1, "chat");  // a chat request found a in the device pool: its host copy is chat's now
  EXPECT_TRUE(load(st, b, "agent"));
  st.touch(&a, 1, "agent");  // a shorter class does not shorten it
  now_ = kT0 + 5 * kDay;
  EXPECT_TRUE(in_host(st, a)) << "chat keeps 7 days";
  EXPECT_FALSE(in_host(st, b)) << "agent keeps 3";
}

TEST_F(HostRetention, EvictionTakesExpiredBlocksFirst) {
  TieredStore st(config(3));
  const BlockHash a{1, 1}, b{2, 2}, c{3, 3}, d{4, 4};
  save(st, b, "chat");  // b: the least recently used
  now_ = kT0 + 10;
  save(st, a, "probe");  // a class the retention does not know: never expires
  save(st, c, "agent");
  now_ = kT0 + 3 * kDay + 60;  // c (agent) has expired; b (chat) is older but has not
  save(st, d, "chat");         // the tier is full: c goes, not b
  EXPECT_TRUE(in_host(st, b));
  EXPECT_TRUE(in_host(st, a));
  EXPECT_TRUE(in_host(st, d));
  EXPECT_FALSE(in_host(st, c));
  EXPECT_EQ(st.stats().host.expirations, 1);
  EXPECT_EQ(st.stats().host.evictions, 0);
  // Nothing expired now: the least recently used goes (b).
  const BlockHash e{5, 5};
  save(st, e, "chat");
  EXPECT_FALSE(in_host(st, b));
  EXPECT_EQ(st.stats().host.evictions, 1);
}

TEST_F(HostRetention, HitTokensByTierAndClassOnMetrics) {
  TieredStore st(config(8));
  const BlockHash a{1, 1}, b{2, 2};
  save(st, a, "chat");
  save(st, b, "chat");
  EXPECT_TRUE(load(st, a, "agent"));
  EXPECT_TRUE(load(st, b, "agent"));
  EXPECT_TRUE(load(st, a, "chat"));
  const BlockHash dev[3] = {{7, 7}, {8, 8}, {9, 9}};
  st.touch(dev, 3, "chat");  // three blocks served from the device pool
  const auto hits = st.stats().hit_tokens;
  EXPECT_EQ(hits.at("agent").host, 2 * kKvBlockSize);
  EXPECT_EQ(hits.at("chat").host, kKvBlockSize);
  EXPECT_EQ(hits.at("chat").device, 3 * kKvBlockSize);
  EXPECT_EQ(hits.at("agent").device, 0);
  const std::string m = render_metrics(st, EngineStats{}, "m");
  EXPECT_NE(m.find("beluga_kv_hit_tokens_total{model_name=\"m\",tier=\"host\",traffic_class=\"agent\"} " +
                   std::to_string(2 * kKvBlockSize) + "\n"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("beluga_kv_hit_tokens_total{model_name=\"m\",tier=\"device\",traffic_class=\"chat\"} " +
                   std::to_string(3 * kKvBlockSize) + "\n"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("beluga_kv_tier_class_blocks{model_name=\"m\",tier=\"host\",class=\"chat\"} 2\n"),
            std::string::npos)
      << m;
}

}  // namespace
}  // namespace beluga::kv
