// The web chat page's files as the server serves them: compiled in byte for byte from src/server/web,
// with their content types; paths that are no file of the page are no asset.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "server/web_ui.h"

namespace beluga::server {
namespace {

std::string source(const std::string& name) {
  std::ifstream f(std::string(BELUGA_SOURCE_DIR) + "/src/server/web/" + name, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(WebUi, ServesThePageFilesByteForByte) {
  for (const char* name : {"index.html", "app.js", "app.css"}) {
    auto a = web_asset(std::string("/") + name);
    ASSERT_TRUE(a) << name;
    EXPECT_EQ(a->body, source(name)) << name;
  }
  auto root = web_asset("/");
  ASSERT_TRUE(root);
  EXPECT_EQ(root->body, source("index.html"));
  EXPECT_EQ(root->content_type, "text/html; charset=utf-8");
  EXPECT_EQ(web_asset("/app.js")->content_type, "text/javascript; charset=utf-8");
  EXPECT_EQ(web_asset("/app.css")->content_type, "text/css; charset=utf-8");
}

TEST(WebUi, OtherPathsAreNoAsset) {
  for (const char* p : {"", "/index", "/embed.cmake", "/web/app.js", "/../app.js", "/app.js/", "/v1/models"})
    EXPECT_FALSE(web_asset(p)) << p;
}

}  // namespace
}  // namespace beluga::server
