// The official JSON Schema test suite (Debian package json-schema-test-suite, scripts/setup.sh),
// drafts 4, 6 and 7, required tests only (not optional/): for every schema the compiler accepts, each
// instance written as compact JSON (keys in the file's order) must be `complete` exactly when the suite
// says it is valid, fed token by token through the full-vocabulary mask of the demo model's tokenizer.
// Refusing a schema is allowed (the count is printed per draft); a wrong answer fails the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "grammar/check.h"
#include "grammar/refused.h"
#include "tokenizer/tokenizer.h"

namespace beluga::grammar {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

const char* kSuite = "/usr/share/json-schema-test-suite/tests";

struct Tally {
  int schemas = 0, refused = 0, instances = 0;
  std::map<std::string, int> refused_by_keyword;
};

void run_draft(const std::string& dir, Draft draft) {
  static const tok::Tokenizer tokenizer = tok::Tokenizer::from_file(
      std::string(BELUGA_SOURCE_DIR) + "/models/beluga-demo-coder-mtp/tokenizer.json");
  static const auto vocab = std::make_shared<TokenVocab>(tokenizer, std::vector<int>{1});
  fs::path path = fs::path(kSuite) / dir;
  ASSERT_TRUE(fs::is_directory(path))
      << path << " is missing: install json-schema-test-suite (scripts/setup.sh)";
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(path))
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  Tally t;
  for (const auto& f : files) {
    std::ifstream in(f);
    Json groups = Json::parse(in);
    for (const auto& group : groups) {
      ++t.schemas;
      std::shared_ptr<const CompiledGrammar> g;
      JsonSchemaOptions opt;
      opt.draft = draft;
      try {
        g = compile_json_schema(group["schema"], vocab, opt, std::chrono::milliseconds(10'000));
      } catch (const Refused& r) {
        ++t.refused;
        ++t.refused_by_keyword[r.keyword()];
        continue;
      }
      for (const auto& test : group["tests"]) {
        ++t.instances;
        std::string text = test["data"].dump();
        CheckResult r = check_text(g, tokenizer, text);
        EXPECT_EQ(r.complete, test["valid"].get<bool>())
            << f.filename().string() << ": " << group["description"].get<std::string>() << " / "
            << test["description"].get<std::string>() << "\n  schema: " << group["schema"].dump()
            << "\n  instance: " << text;
      }
    }
  }
  std::string by;
  for (auto& [k, n] : t.refused_by_keyword) by += " " + k + "=" + std::to_string(n);
  std::printf("%s: %d schemas, %d compiled, %d refused (%s ), %d instances checked\n", dir.c_str(), t.schemas,
              t.schemas - t.refused, t.refused, by.c_str(), t.instances);
  EXPECT_GT(t.schemas - t.refused, t.schemas / 2) << "most of the suite's schemas should compile";
}

TEST(JsonSchemaSuite, Draft4) {
  run_draft("draft4", Draft::k4);
}
TEST(JsonSchemaSuite, Draft6) {
  run_draft("draft6", Draft::k6);
}
TEST(JsonSchemaSuite, Draft7) {
  run_draft("draft7", Draft::k7);
}

}  // namespace
}  // namespace beluga::grammar
