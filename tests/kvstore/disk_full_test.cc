// A full disk under a real `beluga serve`: the file tier sits on an 8 MiB tmpfs nearly filled by
// another file, while the tier believes it has 1 GiB (--kv-disk-gb 1). Writes fail with ENOSPC and
// are dropped cleanly (no temporary file left, no error to any request), every reply equals a
// server's without tiers, /metrics counts the failures (no_space, write errors), the tier lowers
// its capacity to what the file system can hold and goes on storing by eviction, and a second pass
// still hits. Without the right to mount (not root), the child's RLIMIT_FSIZE stands in for the full
// disk: each block write fails with EFBIG, counted as a write error.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "kv_serve.h"
#include "kvstore/block_file.h"

namespace beluga::kv {
namespace {

namespace fs = std::filesystem;
using testing::complete;
using testing::sample;
using testing::serve;

TEST(KvDiskFull, ServeKeepsServingAndCountsTheFailures) {
  const std::string dir = fs::temp_directory_path().string() + "/beluga_kvfull_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const bool mounted = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=8m") == 0;
  std::printf("[figures] full disk: %s\n", mounted ? "8 MiB tmpfs" : "RLIMIT_FSIZE (cannot mount here)");
  if (mounted) {  // ballast: leaves about 1 MiB, a few of the demo model's blocks
    std::ofstream f(dir + "/ballast", std::ios::binary);
    const std::string mib(size_t(1) << 20, 'x');
    for (int i = 0; i < 7; ++i) f << mib;
  }
  std::mt19937 g(77);
  std::vector<std::vector<int>> prompts(12, std::vector<int>(6 * 64 + 5, 0));
  for (auto& p : prompts)
    for (int& t : p) t = 10 + int(g() % 8000u);
  std::vector<std::string> want;
  {
    auto ref = serve({});
    ASSERT_GT(ref.port(), 0) << ref.log();
    for (const auto& p : prompts) want.push_back(complete(ref.port(), p, 6)["choices"][0]["text"]);
  }
  {
    auto s = serve({"--kv-disk-dir", dir, "--kv-disk-gb", "1", "--kv-host-gb", "0.004"},
                   mounted ? 0 : rlim_t(16) << 10);
    ASSERT_GT(s.port(), 0) << s.log();
    for (int pass = 0; pass < 2; ++pass)
      for (size_t i = 0; i < prompts.size(); ++i) {
        const auto j = complete(s.port(), prompts[i], 6);
        ASSERT_TRUE(j.is_object()) << "pass " << pass << " prompt " << i << "\n" << s.log();
        EXPECT_EQ(j["choices"][0]["text"], want[i]) << "pass " << pass << " prompt " << i;
        if (pass == 1) {
          EXPECT_GT(j["usage"]["prompt_cache_hit_tokens"].get<int>(), 0) << "prompt " << i;
        }
      }
    EXPECT_EQ(server::testing::http_get(s.port(), "/health").status, 200);
    // The writes run on I/O threads: give the last ones a moment to land in the counters.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const std::string m = server::testing::http_get(s.port(), "/metrics").body;
    const std::vector<std::string> disk = {"tier=\"disk\""};
    const double write_errors = sample(m, "beluga_kv_tier_write_errors_total", disk);
    const double no_space = sample(m, "beluga_kv_tier_no_space_total", disk);
    const double written = sample(m, "beluga_kv_tier_written_bytes_total", disk);
    const double capacity = sample(m, "beluga_kv_tier_capacity_bytes", disk);
    std::printf("[figures] full disk: %.0f write errors (%.0f no space), %.0f bytes written, capacity %.0f\n",
                write_errors, no_space, written, capacity);
    EXPECT_GT(write_errors, 0) << m;
    EXPECT_EQ(sample(m, "beluga_kv_tier_errors_total", disk), write_errors) << "no read failed";
    if (mounted) {
      EXPECT_EQ(no_space, write_errors);
      EXPECT_GT(written, 0) << "the first blocks fit";
      EXPECT_LT(capacity, double(size_t(8) << 20)) << "the capacity follows what the file system holds";
      // After lowering its capacity the tier goes on storing: it evicted to make room.
      EXPECT_GT(sample(m, "beluga_kv_tier_evictions_total", disk), 0) << m;
    }
    for (auto& e : fs::recursive_directory_iterator(dir))
      EXPECT_FALSE(is_block_temp_name(e.path().filename().string())) << "left behind: " << e.path();
  }
  if (mounted) {
    EXPECT_EQ(::umount(dir.c_str()), 0);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace beluga::kv
