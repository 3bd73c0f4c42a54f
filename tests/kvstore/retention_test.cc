// Retention classes: parsing, expiry by last use with an injected clock, a block shared by classes
// keeping the longest retention (also in its file), and eviction that takes expired blocks first.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "clocked_store.h"
#include "kvstore/block_file.h"
#include "kvstore/fingerprint.h"
#include "kvstore/retention.h"
#include "kvstore/tiered_store.h"

namespace beluga::kv {
namespace {

namespace fs = std::filesystem;
constexpr size_t kRetentionBlockBytes = 2000;
using testing::kDay;
using testing::kT0;

TEST(Retention, ParsesAndMergesOverTheDefaults) {
  const Retention d;
  EXPECT_EQ(d.of("chat"), 7 * kDay);
  EXPECT_EQ(d.of("agent"), 3 * kDay);
  const Retention r = parse_retention("agent=36h,batch=90m,probe=45s,bulk=2d");
  EXPECT_EQ(r.of("chat"), 7 * kDay);
  EXPECT_EQ(r.of("agent"), 36 * 3600);
  EXPECT_EQ(r.of("batch"), 90 * 60);
  EXPECT_EQ(r.of("probe"), 45);
  EXPECT_EQ(r.of("bulk"), 2 * kDay);
  EXPECT_EQ(r.classes().size(), 5u);
  for (const char* bad : {"chat", "chat=", "chat=7", "chat=7w", "=3d", "chat=-1d", "chat=1.5d", "a b=1d"})
    EXPECT_THROW(parse_retention(bad), std::exception) << bad;
  EXPECT_EQ(format_duration(7 * kDay), "7d");
  EXPECT_EQ(format_duration(90 * 60), "90m");
}

class RetentionStore : public testing::ClockedStore {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path().string() + "/beluga_kv_ret_" + std::to_string(::getpid());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  StoreConfig config(size_t disk_blocks = 0) {
    StoreConfig sc = clocked_config(kRetentionBlockBytes, {5, 6}, 8);
    sc.disk_dir = dir_;
    sc.disk_bytes = disk_blocks * (kRetentionBlockBytes + kBlockFileHeaderBytes);
    return sc;
  }
  bool on_disk(TieredStore& st, const BlockHash& k) { return st.disk()->contains(tier_key(k, {5, 6})); }
  std::string path(TieredStore& st, const BlockHash& k) { return st.disk()->path_of(tier_key(k, {5, 6})); }

  std::string dir_;
};

TEST_F(RetentionStore, BlocksExpireByClassSinceLastUse) {
  TieredStore st(config());
  const BlockHash a{1, 1}, b{2, 2}, c{3, 3};
  save(st, a, "agent");
  save(st, b, "chat");
  save(st, c, "agent");
  now_ = kT0 + 2 * kDay;
  st.touch(&c, 1, "agent");  // c used again on day 2
  st.drain();
  now_ = kT0 + 4 * kDay;
  EXPECT_FALSE(on_disk(st, a)) << "agent: 3 days since its last use";
  EXPECT_FALSE(fs::exists(path(st, a)));
  EXPECT_TRUE(on_disk(st, b)) << "chat keeps 7 days";
  EXPECT_TRUE(on_disk(st, c)) << "used on day 2: 2 days ago";
  now_ = kT0 + 8 * kDay;
  EXPECT_EQ(st.disk()->expire(), 2);
  EXPECT_EQ(st.stats().disk->expirations, 3);
  EXPECT_EQ(st.stats().disk->blocks, 0);
}

TEST_F(RetentionStore, ASharedBlockKeepsTheLongestRetention) {
  const BlockHash a{1, 1};
  {
    TieredStore st(config());
    save(st, a, "agent");
    st.touch(&a, 1, "chat");  // a chat request shares it
    st.drain();
    BlockFileHeader h;
    ASSERT_EQ(read_block_header(path(st, a), &h, nullptr), BlockFileStatus::kOk);
    EXPECT_EQ(h.cls, "chat") << "the file says so too (a restart keeps it)";
    st.touch(&a, 1, "agent");  // a shorter class does not shorten it
    st.drain();
    ASSERT_EQ(read_block_header(path(st, a), &h, nullptr), BlockFileStatus::kOk);
    EXPECT_EQ(h.cls, "chat");
  }
  now_ = kT0 + 5 * kDay;
  TieredStore st(config());  // restarted
  EXPECT_TRUE(on_disk(st, a));
  for (int i = 0; i < 400 && !st.disk()->scan_done(); ++i) ::usleep(5000);
  EXPECT_EQ(st.disk()->by_class()["chat"].blocks, 1);
}

TEST_F(RetentionStore, EvictionTakesExpiredBlocksFirst) {
  TieredStore st(config(3));
  const BlockHash a{1, 1}, b{2, 2}, c{3, 3}, d{4, 4};
  save(st, b, "chat");  // b: the least recently used
  now_ = kT0 + 10;
  save(st, a, "probe");  // a class the retention does not know: never expires
  save(st, c, "agent");
  now_ = kT0 + 3 * kDay + 60;  // c (agent) has expired; b (chat) is older but not expired
  save(st, d, "chat");         // the tier is full: c goes first
  EXPECT_TRUE(on_disk(st, b));
  EXPECT_TRUE(on_disk(st, d));
  EXPECT_FALSE(on_disk(st, c));
  EXPECT_GE(st.stats().disk->expirations, 1);
}

}  // namespace
}  // namespace beluga::kv
