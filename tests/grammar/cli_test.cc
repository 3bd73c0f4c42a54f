// `beluga grammar check` end to end: the output lines, and the exit codes of the contract
// (0 compiled, 2 refused with the reason on stderr, 1 other errors).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

// The directory goes when the process's tests end (ctest runs each test in a process of its own).
class RemoveDir : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir(), ec);
  }
};
[[maybe_unused]] ::testing::Environment* const remove_dir =
    ::testing::AddGlobalTestEnvironment(new RemoveDir);

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

// The ids `beluga tokenize` gives each text (one JSON string per line in, one id list per line out).
std::vector<std::vector<int>> token_ids(const std::vector<std::string>& texts) {
  std::string in;
  for (const auto& t : texts) in += nlohmann::json(t).dump() + "\n";
  std::string out;
  EXPECT_EQ(run(std::string(BELUGA_BINARY) + " tokenize --tokenizer " + BELUGA_SOURCE_DIR +
                    "/models/beluga-demo-coder-mtp/tokenizer.json --jsonl < " + write("t.jsonl", in),
                &out),
            0)
      << out;
  std::vector<std::vector<int>> ids;
  std::istringstream lines(out);
  for (std::string l; std::getline(lines, l);)
    ids.push_back(nlohmann::json::parse(l).get<std::vector<int>>());
  return ids;
}

bool bit(const std::string& hex, int id) {
  int byte = std::stoi(hex.substr(size_t(id / 8) * 2, 2), nullptr, 16);
  return (byte >> (id % 8)) & 1;
}

TEST(GrammarCli, DumpMasksWritesEveryStepsMask) {
  // "ab-12" is complete; "ab-123" is rejected at the token that brings the third digit.
  std::string inst = write("d.jsonl", "\"ab-12\"\n\n\"ab-123\"\n");
  std::string dump = dir() + "/masks.jsonl", out;
  ASSERT_EQ(run(check_cmd("--regex '[a-z]+-[0-9]{2}' --dump-masks " + dump, inst), &out), 0) << out;
  auto ids = token_ids({"ab-12", "ab-123", "a", "1"});
  ASSERT_EQ(ids.size(), 4u);
  std::vector<std::vector<nlohmann::json>> steps(2);
  std::ifstream in(dump);
  for (std::string l; std::getline(in, l);) {
    auto j = nlohmann::json::parse(l);
    size_t i = j.at("instance").get<size_t>();
    ASSERT_LT(i, 2u) << l.substr(0, 80);  // the blank line is not an instance
    EXPECT_EQ(j.at("step").get<size_t>(), steps[i].size());
    const std::string hex = j.at("mask").get<std::string>();
    size_t allowed = 0;
    for (char c : hex)
      allowed += size_t(__builtin_popcount(unsigned(std::stoi(std::string(1, c), nullptr, 16))));
    EXPECT_EQ(j.at("allowed").get<size_t>(), allowed);
    steps[i].push_back(j);
  }
  // The complete instance: one mask per token, each allowing that token, and one after the last, the
  // only accepting one.
  ASSERT_EQ(steps[0].size(), ids[0].size() + 1);
  for (size_t k = 0; k < steps[0].size(); ++k) {
    const std::string hex = steps[0][k].at("mask");
    EXPECT_EQ(hex.size(), steps[0][0].at("mask").get<std::string>().size());
    if (k < ids[0].size()) {
      EXPECT_TRUE(bit(hex, ids[0][k])) << k;
    }
    EXPECT_EQ(steps[0][k].at("accepting").get<bool>(), k == ids[0].size()) << k;
  }
  // The first mask allows a letter and not a digit.
  ASSERT_EQ(ids[2].size(), 1u);
  ASSERT_EQ(ids[3].size(), 1u);
  EXPECT_TRUE(bit(steps[0][0].at("mask"), ids[2][0]));
  EXPECT_FALSE(bit(steps[0][0].at("mask"), ids[3][0]));
  // The rejected instance stops at the mask that lacks its token.
  ASSERT_FALSE(steps[1].empty());
  ASSERT_LT(steps[1].size(), ids[1].size() + 1);
  for (size_t k = 0; k < steps[1].size(); ++k)
    EXPECT_EQ(bit(steps[1][k].at("mask"), ids[1][k]), k + 1 < steps[1].size()) << k;
}

}  // namespace

// bench grammar --batch: one timing per step for each worker count, over the same steps.
TEST(GrammarCli, BenchBatchTimesEveryStepForEachWorkerCount) {
  const std::string d = dir() + "/bench-batch";
  std::filesystem::create_directories(d);
  std::ofstream(d + "/point.json")
      << R"({"type":"object","properties":{"x":{"type":"integer"},"tag":{"type":"string","maxLength":8}},"required":["x"]})";
  std::ofstream(d + "/point.instances.jsonl") << "{\"x\":12,\"tag\":\"abc\"}\n{\"x\":-3}\n";
  const std::string out_json = d + "/out.json";
  std::string out;
  const int rc = run(std::string(BELUGA_BINARY) + " bench grammar --tokenizer " + BELUGA_SOURCE_DIR +
                         "/models/beluga-demo-coder-mtp --schemas " + d +
                         " --repeat 1 --batch 8 --batch-threads 0,2 --out " + out_json,
                     &out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("masks of a batch-8 step (us, 2 workers + the caller)"), std::string::npos) << out;
  std::ifstream f(out_json);
  auto j = nlohmann::json::parse(f);
  ASSERT_EQ(j["batch"]["size"], 8);
  ASSERT_EQ(j["batch"]["steps"].size(), 2u);
  EXPECT_EQ(j["batch"]["steps"][0]["workers"], 0);
  EXPECT_EQ(j["batch"]["steps"][1]["workers"], 2);
  // Steps: the longest instance's tokens plus the final state, the same count for both.
  const auto n = j["batch"]["steps"][0]["step_us"]["n"].get<size_t>();
  EXPECT_GT(n, 4u);
  EXPECT_EQ(j["batch"]["steps"][1]["step_us"]["n"].get<size_t>(), n);
  EXPECT_EQ(j["schemas"][0]["batch_masks"].size(), 2u);
}
