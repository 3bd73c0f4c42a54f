// Runs tests/router/e2e_router.mjs: the official `openai` and `@anthropic-ai/sdk` clients through
// `beluga router` in front of two `beluga serve` replicas. Skipped when node or the npm packages are
// missing (`cd tests/tools && npm ci`).
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>

namespace {

bool exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

TEST(RouterE2E, OfficialSdkClientsThroughTheRouter) {
  const std::string root = BELUGA_SOURCE_DIR;
  if (std::system("node --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "node is not installed";
  if (!exists(root + "/tests/tools/node_modules/openai") ||
      !exists(root + "/tests/tools/node_modules/@anthropic-ai/sdk"))
    GTEST_SKIP() << "npm packages missing: cd tests/tools && npm ci";
  const std::string cmd = "node " + root + "/tests/router/e2e_router.mjs " + BELUGA_BINARY;
  const int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc)) << cmd;
  EXPECT_EQ(WEXITSTATUS(rc), 0) << cmd;
}

}  // namespace
