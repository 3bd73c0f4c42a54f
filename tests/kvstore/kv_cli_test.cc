// `beluga kv stats` and `beluga kv gc` on a directory written by the store with an injected clock:
// gc removes exactly the blocks past their class's retention as of --now, and prints the JSON shape
// the issue specifies.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "kv_test_support.h"
#include "kvstore/tiered_store.h"

namespace beluga::kv {
namespace {

using testing::kDay;
using testing::kT0;

std::string run(const std::string& args, int* rc) {
  const std::string cmd = std::string(BELUGA_BINARY) + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  *rc = WEXITSTATUS(::pclose(p));
  return out;
}

TEST(KvCli, StatsAndGcByClass) {
  const std::string dir =
      std::filesystem::temp_directory_path().string() + "/beluga_kv_cli_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  {
    StoreConfig sc;
    sc.block_bytes = 1000;
    sc.host_bytes = 8 * sc.block_bytes;
    sc.disk_dir = dir;
    sc.now = [] { return kT0; };
    TieredStore st(sc);
    int i = 0;
    for (const char* cls : {"chat", "chat", "agent", "agent", "agent"}) {
      std::byte* p = st.start_save({uint64_t(++i), 9}, cls);
      ASSERT_NE(p, nullptr);
      std::memset(p, i, sc.block_bytes);
    }
    st.step_launched();
    st.step_done(true);
    st.drain();
  }
  int rc = 0;
  auto stats = nlohmann::json::parse(run("kv stats --kv-disk-dir " + dir + " --json", &rc));
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(stats["blocks"], 5);
  EXPECT_EQ(stats["by_class"]["agent"]["blocks"], 3);
  EXPECT_EQ(stats["by_class"]["chat"]["blocks"], 2);
  EXPECT_EQ(stats["oldest_last_used"], kT0);
  // Day 4: agent (3 days) has expired, chat (7 days) has not; a dry table run first changes nothing.
  const std::string day4 = " --now " + std::to_string(kT0 + 4 * kDay);
  const auto gc = nlohmann::json::parse(run("kv gc --kv-disk-dir " + dir + day4 + " --json", &rc));
  ASSERT_EQ(rc, 0);
  EXPECT_EQ(gc, nlohmann::json::parse(
                    R"({"removed": 3, "kept": 2, "by_class": {"agent": {"removed": 3, "kept": 0},
                        "chat": {"removed": 0, "kept": 2}}, "partial_files_removed": 0})"));
  // Retention as serve takes it: chat=2d merges over the defaults.
  const std::string table = run("kv gc --kv-disk-dir " + dir + " --kv-retention chat=2d" + day4, &rc);
  ASSERT_EQ(rc, 0);
  EXPECT_NE(table.find("chat"), std::string::npos) << table;
  stats = nlohmann::json::parse(run("kv stats --kv-disk-dir " + dir + " --json", &rc));
  EXPECT_EQ(stats["blocks"], 0);
  run("kv gc --kv-disk-dir " + dir + " --kv-retention chat=7x", &rc);
  EXPECT_NE(rc, 0) << "a bad retention is an error";
  run("kv stats --kv-disk-dir " + dir + "/nope", &rc);
  EXPECT_NE(rc, 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace beluga::kv
