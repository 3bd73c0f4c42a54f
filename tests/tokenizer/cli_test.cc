// `beluga tokenize` / `beluga detokenize` end to end, against the library.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_support.h"
#include "util/file.h"

namespace beluga::tok {
namespace {

using namespace beluga::tok::testing;

std::string beluga() {
  return shell_quote(BELUGA_BINARY);
}

TEST(Cli, TokenizeAndDetokenize) {
  const Tokenizer& tok = load(demo_coder_path());
  std::string text = "Hello <\xEF\xBD\x9CUser\xEF\xBD\x9C> \xE4\xB8\xAD\xE6\x96\x87\n  x = 12345;\n";
  std::string in = scratch_dir() + "/cli-in.txt";
  write_file(in, text);
  for (bool allow : {false, true}) {
    std::string out;
    ASSERT_EQ(run(beluga() + " tokenize --tokenizer " + shell_quote(demo_coder_path()) +
                      (allow ? " --allow-special" : "") + " < " + shell_quote(in),
                  &out),
              0)
        << out;
    auto ids = nlohmann::json::parse(out).get<std::vector<int>>();
    EXPECT_EQ(ids, tok.encode(text, allow));
    std::string ids_file = scratch_dir() + "/cli-ids.json";
    write_file(ids_file, out);
    std::string back;
    ASSERT_EQ(run(beluga() + " detokenize --tokenizer " + shell_quote(demo_coder_path()) + " < " +
                      shell_quote(ids_file),
                  &back),
              0);
    EXPECT_EQ(back, text);
  }
}

TEST(Cli, JsonlModeEncodesEachLine) {
  const Tokenizer& tok = load(demo_coder_path());
  std::vector<std::string> lines = {"first line", "second\nwith newline", "<\xEF\xBD\x9CUser\xEF\xBD\x9C>"};
  std::string in = scratch_dir() + "/cli-in.jsonl";
  write_jsonl_strings(in, lines);
  std::string out;
  ASSERT_EQ(run(beluga() + " tokenize --jsonl --tokenizer " + shell_quote(demo_coder_path()) + " < " +
                    shell_quote(in),
                &out),
            0)
      << out;
  std::vector<std::string> got;
  size_t pos = 0;
  while (pos < out.size()) {
    size_t nl = out.find('\n', pos);
    got.push_back(out.substr(pos, nl - pos));
    pos = nl + 1;
  }
  ASSERT_EQ(got.size(), lines.size());
  for (size_t i = 0; i < lines.size(); ++i)
    EXPECT_EQ(nlohmann::json::parse(got[i]).get<std::vector<int>>(), tok.encode(lines[i], false));
}

TEST(Cli, ErrorsAreReported) {
  std::string out;
  EXPECT_EQ(run(beluga() + " tokenize --tokenizer /nonexistent.json < /dev/null", &out), 1);
  EXPECT_NE(out.find("error"), std::string::npos);
  EXPECT_EQ(
      run("echo '[1, \"x\"]' | " + beluga() + " detokenize --tokenizer " + shell_quote(demo_coder_path()),
          &out),
      1);
  EXPECT_EQ(
      run(beluga() + " tokenize --tokenizer " + shell_quote(demo_coder_path()) + " --bogus 1 < /dev/null",
          &out),
      1);
}

}  // namespace
}  // namespace beluga::tok
