// Runs the web chat page's browser test (tests/tools/web_chat.mjs: Debian's headless Chromium driven
// by puppeteer-core against `beluga serve` with the demo model: streamed answers, Stop, reasoning and
// tool calls, the API-key flow). Skipped when node, chromium or the npm packages are missing
// (scripts/setup-test-tools.sh installs them).
#include <gtest/gtest.h>

#include <filesystem>

#include "../common/command.h"

namespace {

TEST(WebChat, HeadlessChromiumAgainstBelugaServe) {
  const std::string install = "bash scripts/setup-test-tools.sh";
  std::string skip = beluga::testing::node_skip_reason({"puppeteer-core"}, install);
  if (skip.empty() && !std::filesystem::exists("/usr/bin/chromium")) skip = "chromium is missing: " + install;
  if (!skip.empty()) GTEST_SKIP() << skip;
  EXPECT_EQ(beluga::testing::run_node_script("web_chat.mjs"), 0)
      << "tests/tools/web_chat.mjs failed (its output is above)";
}

}  // namespace
