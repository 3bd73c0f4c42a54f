// `beluga grammar check --tokenizer DIR|FILE (--schema FILE | --regex RE | --gbnf FILE)
//                       [--draft 4|6|7|2020-12] [--max-whitespace N] [--compile-timeout-ms MS]
//                       [--dump-masks FILE] --instances FILE.jsonl`
// --schema: a JSON Schema file; --regex: the pattern itself (the whole output must match it);
// --gbnf: a grammar file in llama.cpp's GBNF or the Lark subset (grammar/gbnf.h).
// Reads one JSON string per line (a candidate output text), feeds its tokens through the matcher and
// prints {"accepted": bool, "complete": bool} per line (grammar/check.h says what they mean).
// --dump-masks writes every mask the check computes as one JSON line, so another implementation's masks
// can be compared step by step (bench/xgrammar_peer.mjs): {"instance": line index among the non-blank
// lines, from 0, "step": tokens fed before it, "allowed": ids set, "accepting": end of sequence allowed
// here, "mask": hex of ceil(V/8) bytes, byte j bit b = id 8j+b allowed}.
// Exit 0 when the grammar compiled, 2 when it is refused (the reason on stderr), 1 on other errors.
#include <bit>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/flag_table.h"
#include "grammar/check.h"
#include "grammar/matcher.h"
#include "grammar/refused.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/file.h"

namespace beluga::cli {

namespace {

std::string tokenizer_path(const std::string& p) {
  return std::filesystem::is_directory(p) ? p + "/tokenizer.json" : p;
}

// One --dump-masks line (the format is in the header comment).
void dump_mask(std::ofstream& out, size_t instance, const grammar::Matcher& m, const uint32_t* mask) {
  static const char* hex = "0123456789abcdef";
  const size_t n_bytes = (m.vocab().size() + 7) / 8;
  std::string h(2 * n_bytes, '0');
  size_t allowed = 0;
  for (size_t j = 0; j < n_bytes; ++j) {
    unsigned byte = (mask[j / 4] >> (8 * (j % 4))) & 0xff;
    h[2 * j] = hex[byte >> 4];
    h[2 * j + 1] = hex[byte & 15];
    allowed += size_t(std::popcount(byte));
  }
  out << "{\"instance\": " << instance << ", \"step\": " << m.num_tokens() << ", \"allowed\": " << allowed
      << ", \"accepting\": " << (m.is_accepting() ? "true" : "false") << ", \"mask\": \"" << h << "\"}\n";
}

int grammar_check(int argc, char** argv) {
  Args args = Args::for_command(argc, argv, "grammar check");
  const std::string tokenizer_file = tokenizer_path(args.require("tokenizer"));
  auto schema_file = args.get("schema");
  auto regex = args.get("regex");
  auto gbnf = args.get("gbnf");
  std::string instances = args.require("instances");
  auto dump_file = args.get("dump-masks");
  grammar::JsonSchemaOptions opt;
  if (auto d = args.get("draft")) {
    opt.draft = grammar::parse_draft(*d);
    BELUGA_CHECK(opt.draft, "--draft must be 4, 6, 7 or 2020-12 (got '", *d, "')");
  }
  opt.max_whitespace = int(args.get_int("max-whitespace", 0));
  BELUGA_CHECK(opt.max_whitespace >= 0 && opt.max_whitespace <= 16, "--max-whitespace must be 0..16");
  long timeout_ms = args.get_int("compile-timeout-ms", 10'000);
  BELUGA_CHECK(timeout_ms > 0, "--compile-timeout-ms must be positive");
  args.check_all_used();
  BELUGA_CHECK(int(bool(schema_file)) + int(bool(regex)) + int(bool(gbnf)) == 1,
               "give exactly one of --schema, --regex, --gbnf");
  auto tokenizer = tok::Tokenizer::from_file(tokenizer_file);

  std::shared_ptr<const grammar::CompiledGrammar> g;
  try {
    auto vocab = std::make_shared<grammar::TokenVocab>(tokenizer, std::vector<int>{});
    auto timeout = std::chrono::milliseconds(timeout_ms);
    if (regex) {
      g = grammar::compile_regex(*regex, vocab, timeout);
    } else if (gbnf) {
      g = grammar::compile_gbnf(read_file(*gbnf), vocab, timeout);
    } else {
      nlohmann::ordered_json schema;
      try {
        schema = nlohmann::ordered_json::parse(read_file(*schema_file));
      } catch (const nlohmann::json::exception& e) {
        fail(*schema_file, ": not JSON: ", e.what());
      }
      g = grammar::compile_json_schema(schema, vocab, opt, timeout);
    }
  } catch (const grammar::Refused& r) {
    std::fprintf(stderr, "beluga grammar check: refused (%s): %s\n", r.keyword().c_str(), r.what());
    return 2;
  }

  std::ifstream in(instances);
  BELUGA_CHECK(in, "cannot open ", instances);
  std::ofstream dump;
  if (dump_file) {
    dump.open(*dump_file);
    BELUGA_CHECK(dump, "cannot write ", *dump_file);
  }
  size_t instance = 0;
  std::string line;
  size_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail(instances, " line ", lineno, ": not JSON: ", e.what());
    }
    BELUGA_CHECK(j.is_string(), instances, " line ", lineno, ": expected a JSON string (a candidate output)");
    grammar::MaskObserver on_mask;
    if (dump_file)
      on_mask = [&](const grammar::Matcher& m, const uint32_t* mask) { dump_mask(dump, instance, m, mask); };
    grammar::CheckResult r = grammar::check_text(g, tokenizer, j.get_ref<const std::string&>(), on_mask);
    ++instance;
    std::printf("{\"accepted\": %s, \"complete\": %s}\n", r.accepted ? "true" : "false",
                r.complete ? "true" : "false");
  }
  if (dump_file) {
    dump.close();
    BELUGA_CHECK(dump, "cannot write ", *dump_file);
  }
  return 0;
}

}  // namespace

int cmd_grammar(int argc, char** argv) {
  BELUGA_CHECK(argc >= 1, usage_text(usage_of("grammar")));
  std::string what = argv[0];
  if (what == "check") return grammar_check(argc - 1, argv + 1);
  fail("unknown grammar command '", what, "' (check)");
}

}  // namespace beluga::cli
