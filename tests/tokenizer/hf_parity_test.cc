// Token ids must equal Hugging Face `tokenizers` (npm, the Rust library's Node binding) on a corpus of
// more than 5 MB assembled from this machine's files and generated hard cases
// (tests/tools/tokenizer-corpus.js), for DeepSeek-V3, Llama-3, Qwen3, the demo model, and synthetic
// variants that exercise the other supported pre-tokenizers, normalizers and added-token flags.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "test_support.h"
#include "tokenizer/utf8.h"
#include "util/file.h"

namespace beluga::tok {
namespace {

using namespace beluga::tok::testing;

class HfParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!have_node_tools()) return;
    corpus_path_ = scratch_dir() + "/corpus.jsonl";
    std::string out;
    int rc = run("node " + shell_quote(source_path("tests/tools/tokenizer-corpus.js")) + " --out " +
                     shell_quote(corpus_path_),
                 &out);
    if (rc != 0) {
      corpus_error_ = "tokenizer-corpus.js failed: " + out;
      return;
    }
    corpus_info_ = out;
    docs_ = read_jsonl_strings(corpus_path_);
  }

  void SetUp() override {
    ASSERT_TRUE(have_node_tools()) << kNodeToolsHint;
    ASSERT_TRUE(corpus_error_.empty()) << corpus_error_;
  }

  // Encodes docs with HF (through hf-encode.js) and with Beluga; expects identical ids for each doc.
  static void expect_same_ids(const std::string& tokenizer, const std::string& docs_path,
                              const std::vector<std::string>& docs, bool allow_special,
                              bool check_roundtrip) {
    std::string ids_path = scratch_dir() + "/hf-ids.jsonl";
    std::string cmd = "node " + shell_quote(source_path("tests/tools/hf-encode.js")) + " --tokenizer " +
                      shell_quote(tokenizer) + " --input " + shell_quote(docs_path) + " --output " +
                      shell_quote(ids_path) + " --cache-dir " + shell_quote(cache_dir()) +
                      (allow_special ? "" : " --strip-added");
    std::string out;
    ASSERT_EQ(run(cmd, &out), 0) << cmd << "\n" << out;
    auto expected = read_jsonl_ids(ids_path);
    ASSERT_EQ(expected.size(), docs.size());

    const Tokenizer& tok = load(tokenizer);
    size_t mismatches = 0, tokens = 0, bytes = 0;
    std::ostringstream report;
    auto t0 = std::chrono::steady_clock::now();
    std::vector<int> ids;
    for (size_t d = 0; d < docs.size(); ++d) {
      ids.clear();
      tok.encode_into(docs[d], allow_special, ids);
      tokens += ids.size();
      bytes += docs[d].size();
      if (ids != expected[d]) {
        if (++mismatches <= 5) {
          size_t i = 0;
          while (i < ids.size() && i < expected[d].size() && ids[i] == expected[d][i]) ++i;
          auto window = [&](const std::vector<int>& v) {
            std::ostringstream os;
            for (size_t k = i >= 3 ? i - 3 : 0; k < std::min(v.size(), i + 5); ++k)
              os << v[k] << "'" << tok.token_text(v[k]) << "' ";
            return os.str();
          };
          report << "doc " << d << " (" << docs[d].size() << " bytes) differs at token " << i
                 << "\n  ours: " << window(ids) << "\n  hf:   " << window(expected[d]) << "\n";
        }
      }
      if (check_roundtrip) {
        ASSERT_EQ(tok.decode(ids), docs[d]) << "decode(encode(doc " << d << ")) is not the doc";
      }
    }
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("  %s%s: %zu docs, %.2f MB, %zu tokens, beluga %.1f MB/s\n", tokenizer.c_str(),
                allow_special ? "" : " (allow_special=false)", docs.size(), bytes / 1e6, tokens,
                bytes / 1e6 / s);
    EXPECT_EQ(mismatches, 0u) << mismatches << " of " << docs.size() << " docs differ\n" << report.str();
  }

  // A slice of the corpus (every 9th document and all generated ones: 1.5 MB) for the secondary
  // configurations, to keep the suite fast when HF's results are not cached yet.
  static const std::vector<std::string>& slice() {
    static std::vector<std::string> docs = [] {
      std::vector<std::string> out;
      for (size_t i = 0; i < docs_.size(); ++i)
        if (i % 9 == 0 || i + 60 >= docs_.size()) out.push_back(docs_[i]);
      write_jsonl_strings(scratch_dir() + "/slice.jsonl", out);
      return out;
    }();
    return docs;
  }
  static std::string slice_path() { return scratch_dir() + "/slice.jsonl"; }

  static std::string corpus_path_, corpus_error_, corpus_info_;
  static std::vector<std::string> docs_;
};

std::string HfParity::corpus_path_, HfParity::corpus_error_, HfParity::corpus_info_;
std::vector<std::string> HfParity::docs_;

TEST_F(HfParity, CorpusIsLargeAndVaried) {
  size_t bytes = 0, cjk = 0, invalid = 0;
  for (const auto& d : docs_) {
    bytes += d.size();
    invalid += utf8_first_invalid(d) != d.size();
    if (d.find("\xE7\x9A\x84") != std::string::npos) ++cjk;  // 的
  }
  EXPECT_GE(bytes, 5u << 20) << corpus_info_;
  EXPECT_GE(cjk, 20u) << "CJK man pages missing (install manpages-zh, manpages-ja)\n" << corpus_info_;
  EXPECT_EQ(invalid, 0u);
}

TEST_F(HfParity, DeepSeekV3) {
  expect_same_ids(deepseek_v3_path(), corpus_path_, docs_, true, true);
}
TEST_F(HfParity, DeepSeekV3SpecialsOff) {
  expect_same_ids(deepseek_v3_path(), corpus_path_, docs_, false, true);
}
TEST_F(HfParity, DemoCoder) {
  expect_same_ids(demo_coder_path(), corpus_path_, docs_, true, true);
}
TEST_F(HfParity, Llama3) {
  expect_same_ids(llama3_path(), corpus_path_, docs_, true, true);
}
// Qwen normalizes to NFC, so decode(encode(x)) is NFC(x), not x: no round-trip check.
TEST_F(HfParity, Qwen3) {
  expect_same_ids(qwen3_path(), corpus_path_, docs_, true, false);
}
TEST_F(HfParity, Qwen3SpecialsOff) {
  expect_same_ids(qwen3_path(), corpus_path_, docs_, false, false);
}

// Variants of the demo tokenizer with other pipeline pieces, judged by HF on a slice of the corpus.
// Extra added tokens take the ids HF gives them (the next free ids), with contents not in the vocab.
class HfParityVariants : public HfParity {
 protected:
  void check_variant(const std::string& name, const nlohmann::json& normalizer, const nlohmann::json& pre,
                     const nlohmann::json& extra_added) {
    auto j = nlohmann::json::parse(read_file(demo_coder_path()));
    j["normalizer"] = normalizer;
    j["pre_tokenizer"] = pre;
    for (const auto& a : extra_added) j["added_tokens"].push_back(a);
    std::string path = scratch_dir() + "/variant-" + name + ".json";
    write_file(path, j.dump());

    std::vector<std::string> docs = slice();
    for (const char* s : {"a <mask> b  <mask>x [SEP]  y", "\xEF\xAC\x81qz fiqz \xEF\xAC\x81re",
                          "qzw qzws sqzw qzw", "_qzw qzw_ (qzw) \xC3\xA9qzw \xC3\xA9 qzw-",
                          "  <mask>\t[SEP]\n\n", "1234 5678 x9y8z7", "A\xCC\x8A \xE2\x84\xAB"})
      docs.push_back(s);
    std::string docs_path = scratch_dir() + "/variant-docs.jsonl";
    write_jsonl_strings(docs_path, docs);
    expect_same_ids(path, docs_path, docs, true, false);
  }
};

nlohmann::json added(int id, const char* content, bool special, bool lstrip, bool rstrip, bool single_word,
                     bool normalized) {
  return {{"id", id},         {"content", content},         {"special", special},      {"lstrip", lstrip},
          {"rstrip", rstrip}, {"single_word", single_word}, {"normalized", normalized}};
}

TEST_F(HfParityVariants, Gpt2StyleNfkcAndAddedTokenFlags) {
  check_variant(
      "gpt2", {{"type", "NFKC"}},
      {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}},
      nlohmann::json::array({added(8192, "<mask>", true, true, false, false, false),
                             added(8193, "[SEP]", true, false, true, false, false),
                             added(8194, "\xEF\xAC\x81qz", false, false, false, false, true),
                             added(8195, "qzw", false, false, false, true, false)}));
}

TEST_F(HfParityVariants, DigitsAndMergedBehaviours) {
  nlohmann::json pre = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Digits"}, {"individual_digits", true}},
        {{"type", "Split"},
         {"pattern", {{"String", " "}}},
         {"behavior", "MergedWithNext"},
         {"invert", false}},
        {{"type", "Split"},
         {"pattern", {{"Regex", "[aeiou]"}}},
         {"behavior", "MergedWithPrevious"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  check_variant("merged", {{"type", "Sequence"}, {"normalizers", {{{"type", "NFD"}}}}}, pre,
                nlohmann::json::array());
}

TEST_F(HfParityVariants, ContiguousRemovedInvertAndNfkdNfc) {
  nlohmann::json pre = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", "\\p{P}"}}},
         {"behavior", "Contiguous"},
         {"invert", false}},
        {{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Removed"}, {"invert", false}},
        {{"type", "Digits"}, {"individual_digits", false}},
        {{"type", "Split"}, {"pattern", {{"Regex", "[a-z]+"}}}, {"behavior", "Isolated"}, {"invert", true}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}}}};
  check_variant("contiguous",
                {{"type", "Sequence"}, {"normalizers", {{{"type", "NFKD"}}, {{"type", "NFC"}}}}}, pre,
                nlohmann::json::array({added(8192, "<mask>", true, false, false, false, true)}));
}

}  // namespace
}  // namespace beluga::tok
