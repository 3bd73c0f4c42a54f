// libFuzzer target: the grammar compiler and matcher. The first byte picks the front end (JSON Schema,
// regex, GBNF, Lark) and a whitespace option, the rest is its text. A front end may refuse its input
// only with beluga::Error (Refused included); a grammar that compiles (under small size and time
// limits, so nothing can hang) is then walked for a few steps, choosing tokens from its mask, and
// the mask must agree with feeding each token (Matcher::allows) at every step.
#include <nlohmann/json.hpp>

#include "fuzz_support.h"
#include "grammar/compiled.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"

namespace {

using namespace beluga::grammar;

// A small vocabulary of JSON-ish and text pieces (ids 0 and 1: special tokens, 1 the EOS).
std::shared_ptr<const TokenVocab> vocab() {
  static const auto v = [] {
    std::vector<std::string> t = {"<s>", "</s>"};
    for (char c : std::string("{}[]\":,0123456789.+-eE abcnulltrfsxyz\\\n_|()*#="))
      t.push_back(std::string(1, c));
    for (const char* s : {"null", "true", "false", "\"a\"", "\":", "\",\"", "12", "-0", "1.5", "ab",
                          "::=", "\xc3", "\xa9", "\xc3\xa9", "\xe6\x97\xa5", "\\n", "\\\"", "\\u00", "  "})
      t.push_back(s);
    return std::make_shared<TokenVocab>(t, std::vector<int>{0, 1}, std::vector<int>{1});
  }();
  return v;
}

Grammar front_end(uint8_t which, std::string_view text) {
  GbnfOptions go;
  go.max_repeat = 1000;
  RegexOptions ro;
  ro.max_size = 5000;
  ro.max_repeat = 1000;
  switch (which % 4) {
    case 0: {
      auto schema = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded()) throw beluga::Error("not JSON");
      JsonSchemaOptions o;
      o.max_whitespace = (which >> 2) & 3;
      o.max_exprs = 200'000;
      o.deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
      return json_schema_grammar(schema, o);
    }
    case 1:
      return from_regex(text, ro);
    case 2:
      return from_gbnf(text, go);
    default:
      return from_lark(text, go);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view text = beluga::fuzz::as_text(data + 1, size - 1);
  std::shared_ptr<const CompiledGrammar> g;
  beluga::fuzz::expect_only<beluga::Error>([&] {
    CompileOptions co;
    co.timeout = std::chrono::milliseconds(500);
    co.limits.max_nodes = 20'000;
    g = compile(front_end(data[0], text), vocab(), co);
  });
  if (!g) return 0;
  // The matcher may refuse with beluga::Error (a grammar too ambiguous at some byte): the engine
  // fails that one sequence with the message, so here it ends the input like a compile error.
  beluga::fuzz::expect_only<beluga::Error>([&] {
    Matcher m(g);
    const TokenVocab& v = *g->vocab;
    std::vector<uint32_t> mask(v.mask_words());
    beluga::fuzz::Splitter pick(text);
    for (int step = 0; step < 8; ++step) {
      m.fill_mask(mask.data());
      std::vector<int> allowed;
      for (size_t t = 0; t < v.size(); ++t) {
        bool bit = (mask[t >> 5] >> (t & 31)) & 1;
        if (bit != m.allows(int(t)))
          beluga::fuzz::finding("mask disagrees with feeding the token", v.bytes(int(t)).c_str());
        if (bit && t != 1) allowed.push_back(int(t));
      }
      if (m.is_accepting() != bool((mask[0] >> 1) & 1))
        beluga::fuzz::finding("EOS allowed outside accepting states");
      if (allowed.empty()) break;
      int t = allowed[pick.next(allowed.size()) - 1];
      if (!m.accept_token(t)) beluga::fuzz::finding("a token in the mask was rejected");
    }
  });
  return 0;
}
