// Runs the end-to-end SDK test (tests/tools/e2e_server.mjs: the official `openai` and
// `@anthropic-ai/sdk` clients against `beluga serve` with the demo model). Skipped when node or the
// npm packages are missing (`cd tests/tools && npm ci`). Also the structured-outputs test
// (tests/tools/e2e_structured.mjs, replies validated by `ajv`).
#include <gtest/gtest.h>

#include "../common/command.h"

namespace {

TEST(E2E, OfficialSdkClientsAgainstBelugaServe) {
  const std::string skip =
      beluga::testing::node_skip_reason({"openai", "@anthropic-ai/sdk"}, "cd tests/tools && npm ci");
  if (!skip.empty()) GTEST_SKIP() << skip;
  EXPECT_EQ(beluga::testing::run_node_script("e2e_server.mjs"), 0)
      << "tests/tools/e2e_server.mjs failed (its output is above)";
}

// tests/tools/e2e_structured.mjs: structured outputs through the same SDKs, replies checked by ajv.
TEST(E2E, StructuredOutputsValidatedByAjv) {
  const std::string skip =
      beluga::testing::node_skip_reason({"openai", "@anthropic-ai/sdk", "ajv"}, "cd tests/tools && npm ci");
  if (!skip.empty()) GTEST_SKIP() << skip;
  EXPECT_EQ(beluga::testing::run_node_script("e2e_structured.mjs"), 0)
      << "tests/tools/e2e_structured.mjs failed (its output is above)";
}

}  // namespace
