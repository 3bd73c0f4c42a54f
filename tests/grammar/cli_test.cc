// `beluga grammar check` end to end: the output lines, and the exit codes of the contract
// (0 compiled, 2 refused with the reason on stderr, 1 other errors).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

std::string dir() {
  static std::string d = [] {
    std::string p =
        std::filesystem::temp_directory_path() / ("beluga-grammar-cli-" + std::to_string(getpid()));
    std::filesystem::create_directories(p);
    return p;
  }();
  return d;
}

std::string write(const std::string& name, const std::string& text) {
  std::string p = dir() + "/" + name;
  std::ofstream(p) << text;
  return p;
}

// Runs a command; returns its exit status, stdout in *out (stderr appended when merge_stderr).
int run(const std::string& cmd, std::string* out) {
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  out->clear();
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, n);
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string check_cmd(const std::string& schema_args, const std::string& instances) {
  return std::string(BELUGA_BINARY) + " grammar check --tokenizer " + BELUGA_SOURCE_DIR +
         "/models/beluga-demo-coder-mtp " + schema_args + " --instances " + instances;
}

TEST(GrammarCli, PrintsAcceptedAndCompletePerInstance) {
  std::string schema = write("s.json", R"({"type":"object","properties":{"n":{"type":"integer","maximum":9}},
                                          "required":["n"],"additionalProperties":false})");
  std::string inst = write("i.jsonl", "\"{\\\"n\\\":7}\"\n\"{\\\"n\\\":\"\n\"{\\\"n\\\":12}\"\n\"[1]\"\n");
  std::string out;
  ASSERT_EQ(run(check_cmd("--schema " + schema, inst), &out), 0) << out;
  EXPECT_EQ(out,
            "{\"accepted\": true, \"complete\": true}\n"
            "{\"accepted\": true, \"complete\": false}\n"
            "{\"accepted\": false, \"complete\": false}\n"
            "{\"accepted\": false, \"complete\": false}\n");
}

TEST(GrammarCli, RefusalExitsTwoWithTheKeyword) {
  std::string schema = write("p.json", R"({"type":"array","uniqueItems":true})");
  std::string inst = write("e.jsonl", "\"\\\"a\\\"\"\n");
  std::string out;
  EXPECT_EQ(run(check_cmd("--schema " + schema, inst), &out), 2);
  EXPECT_NE(out.find("uniqueItems"), std::string::npos) << out;
  EXPECT_EQ(run(check_cmd("--schema " + schema + " --draft 5", inst), &out), 1) << out;
  EXPECT_EQ(run(check_cmd("--schema " + dir() + "/missing.json", inst), &out), 1) << out;
  std::string bad = write("bad.jsonl", "not json\n");
  std::string ok = write("ok.json", R"({"type":"string"})");
  EXPECT_EQ(run(check_cmd("--schema " + ok, bad), &out), 1) << out;
}

TEST(GrammarCli, RegexAndGbnfFrontEnds) {
  // The whole output must match the regex; accepted/complete as for a schema.
  std::string inst = write("r.jsonl", "\"ab-12\"\n\"ab-\"\n\"ab-123\"\n\"9\"\n");
  std::string out;
  ASSERT_EQ(run(check_cmd("--regex '[a-z]+-[0-9]{2}'", inst), &out), 0) << out;
  EXPECT_EQ(out,
            "{\"accepted\": true, \"complete\": true}\n"
            "{\"accepted\": true, \"complete\": false}\n"
            "{\"accepted\": false, \"complete\": false}\n"
            "{\"accepted\": false, \"complete\": false}\n");
  std::string gbnf = write("list.gbnf", "root ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [a-z]+\n");
  std::string li = write("l.jsonl", "\"[ab,c]\"\n\"[ab,\"\n\"[ab,,c]\"\n");
  ASSERT_EQ(run(check_cmd("--gbnf " + gbnf, li), &out), 0) << out;
  EXPECT_EQ(out,
            "{\"accepted\": true, \"complete\": true}\n"
            "{\"accepted\": true, \"complete\": false}\n"
            "{\"accepted\": false, \"complete\": false}\n");
  // Unsupported constructs are refusals (exit 2, named); malformed grammars other errors (exit 1).
  EXPECT_EQ(run(check_cmd("--regex '(a)\\1'", inst), &out), 2) << out;
  EXPECT_NE(out.find("backreferences"), std::string::npos) << out;
  EXPECT_EQ(run(check_cmd("--regex '(ab'", inst), &out), 1) << out;
  EXPECT_NE(out.find("unterminated group"), std::string::npos) << out;
  std::string bad = write("bad.gbnf", "root ::= item\nitem ::= \"a\" undefined-rule\n");
  EXPECT_EQ(run(check_cmd("--gbnf " + bad, li), &out), 1) << out;
  EXPECT_NE(out.find("line 2, column 14: undefined rule 'undefined-rule'"), std::string::npos) << out;
}

}  // namespace
