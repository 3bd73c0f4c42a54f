#include "grammar/check.h"

#include <vector>

#include "grammar/gbnf.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace beluga::grammar {

CheckResult check_text(std::shared_ptr<const CompiledGrammar> grammar, const tok::Tokenizer& tokenizer,
                       std::string_view text, const MaskObserver& on_mask) {
  Matcher m(std::move(grammar));
  std::vector<int> ids = tokenizer.encode(text, /*allow_special=*/false);
  std::vector<uint32_t> mask(m.vocab().mask_words());
  CheckResult r;
  for (int id : ids) {
    m.fill_mask(mask.data());
    if (on_mask) on_mask(m, mask.data());
    if (!((mask[id >> 5] >> (id & 31)) & 1)) return r;
    BELUGA_CHECK(m.accept_token(id), "internal error: token ", id,
                 " is in the mask but the matcher rejects it");
  }
  r.accepted = true;
  r.complete = m.is_accepting();
  if (on_mask) {
    m.fill_mask(mask.data());
    on_mask(m, mask.data());
  }
  return r;
}

std::shared_ptr<const CompiledGrammar> compile_json_schema(const nlohmann::ordered_json& schema,
                                                           std::shared_ptr<const TokenVocab> vocab,
                                                           JsonSchemaOptions options,
                                                           std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  options.deadline = deadline;
  Grammar g = json_schema_grammar(schema, options);
  return compile_until(g, std::move(vocab), deadline, CompileLimits{});
}

std::shared_ptr<const CompiledGrammar> compile_regex(std::string_view pattern,
                                                     std::shared_ptr<const TokenVocab> vocab,
                                                     std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  return compile_until(from_regex(pattern), std::move(vocab), deadline, CompileLimits{});
}

std::shared_ptr<const CompiledGrammar> compile_gbnf(std::string_view text,
                                                    std::shared_ptr<const TokenVocab> vocab,
                                                    std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  return compile_until(from_ebnf(text), std::move(vocab), deadline, CompileLimits{});
}

}  // namespace beluga::grammar
