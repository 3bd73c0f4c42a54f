// Runs the web chat page's browser test (tests/tools/web_chat.mjs: Debian's headless Chromium driven
// by puppeteer-core against `beluga serve` with the demo model: streamed answers, Stop, reasoning and
// tool calls, the API-key flow). Skipped when node, chromium or the npm packages are missing
// (scripts/setup-test-tools.sh installs them).
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

TEST(WebChat, HeadlessChromiumAgainstBelugaServe) {
  const std::string root = BELUGA_SOURCE_DIR;
  if (std::system("node --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "node is not installed";
  if (!exists("/usr/bin/chromium")) GTEST_SKIP() << "chromium is missing: bash scripts/setup-test-tools.sh";
  if (!exists(root + "/tests/tools/node_modules/puppeteer-core"))
    GTEST_SKIP() << "npm packages missing: bash scripts/setup-test-tools.sh";
  const std::string cmd = "node " + root + "/tests/tools/web_chat.mjs " + BELUGA_BINARY;
  int rc = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(rc)) << cmd;
  EXPECT_EQ(WEXITSTATUS(rc), 0) << cmd;
}

}  // namespace
