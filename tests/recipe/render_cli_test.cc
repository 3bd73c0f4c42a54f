// `beluga render` end to end (needs the beluga binary; skipped when only test_recipe was built).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>

#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace beluga::recipe {
namespace {

struct CliRun {
  int rc;
  std::string out;
};

CliRun run_render(const std::string& args, const std::string& request) {
  char name[] = "/tmp/beluga-render-XXXXXX";
  int fd = mkstemp(name);
  EXPECT_GE(fd, 0);
  ::close(fd);
  write_file(name, request);
  std::string cmd = std::string(BELUGA_BINARY) + " render --model " +
                    test::source_path("models/beluga-demo-coder-mtp") + " --request " + name + " " + args +
                    " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = pclose(p);
  std::remove(name);
  return {rc, out};
}

TEST(RenderCli, PrintsPromptAndIds) {
  if (!file_exists(BELUGA_BINARY)) GTEST_SKIP() << "beluga binary not built";
  CliRun r = run_render(
      "--api messages",
      R"({"model": "m", "max_tokens": 10, "system": "Sys", "messages": [{"role": "user", "content": "Hi <｜User｜>"}]})");
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  const std::string prompt = "<｜begin▁of▁sentence｜>Sys<｜User｜>Hi <｜User｜><｜Assistant｜>";
  EXPECT_EQ(j.at("prompt"), prompt);
  auto tok = tok::Tokenizer::from_file(test::source_path("models/beluga-demo-coder-mtp/tokenizer.json"));
  std::vector<int> expected{tok.token_id("<｜begin▁of▁sentence｜>")};
  for (int id : tok.encode("Sys", false)) expected.push_back(id);
  expected.push_back(tok.token_id("<｜User｜>"));
  for (int id : tok.encode("Hi <｜User｜>", false)) expected.push_back(id);
  expected.push_back(tok.token_id("<｜Assistant｜>"));
  EXPECT_EQ(j.at("ids").get<std::vector<int>>(), expected);
}

TEST(RenderCli, InvalidRequestPrintsTheApiError) {
  if (!file_exists(BELUGA_BINARY)) GTEST_SKIP() << "beluga binary not built";
  CliRun r = run_render("--api chat", R"({"messages": []})");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find(R"("param":"messages")"), std::string::npos) << r.out;
  CliRun bad_format = run_render("--chat-format nope", R"({"messages": [{"role": "user", "content": "x"}]})");
  EXPECT_NE(bad_format.rc, 0);
  EXPECT_NE(bad_format.out.find("unknown --chat-format"), std::string::npos) << bad_format.out;
}

}  // namespace
}  // namespace beluga::recipe
