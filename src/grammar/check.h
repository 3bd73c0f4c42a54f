// What `beluga grammar check` does for one candidate output, shared with the test-suite harness: the
// text is tokenized with the model's tokenizer (special tokens off) and fed token by token, each token
// tested against the full-vocabulary mask first. accepted: every token was in the mask (feeding stops
// at the first that is not); complete: accepted and the matcher accepts at the end.
// `on_mask`, when given, sees every mask the check computes: the one before each fed token and, when
// every token was accepted, the one after the last (the matcher's is_accepting() says whether end of
// sequence would be allowed there). `beluga grammar check --dump-masks` writes them out.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include <nlohmann/json.hpp>

#include "grammar/compiled.h"
#include "grammar/json_schema.h"

namespace beluga::tok {
class Tokenizer;
}

namespace beluga::grammar {

struct CheckResult {
  bool accepted = false, complete = false;
};

class Matcher;
using MaskObserver = std::function<void(const Matcher& matcher, const uint32_t* mask)>;

CheckResult check_text(std::shared_ptr<const CompiledGrammar> grammar, const tok::Tokenizer& tokenizer,
                       std::string_view text, const MaskObserver& on_mask = nullptr);

// JSON Schema -> compiled grammar within `timeout` (front end and mask precompute together).
std::shared_ptr<const CompiledGrammar> compile_json_schema(const nlohmann::ordered_json& schema,
                                                           std::shared_ptr<const TokenVocab> vocab,
                                                           JsonSchemaOptions options,
                                                           std::chrono::milliseconds timeout);

// A regex (the whole output matches it, regex.h) -> compiled grammar within `timeout`.
std::shared_ptr<const CompiledGrammar> compile_regex(std::string_view pattern,
                                                     std::shared_ptr<const TokenVocab> vocab,
                                                     std::chrono::milliseconds timeout);

// GBNF or the Lark subset (gbnf.h's from_ebnf) -> compiled grammar within `timeout`.
std::shared_ptr<const CompiledGrammar> compile_gbnf(std::string_view text,
                                                    std::shared_ptr<const TokenVocab> vocab,
                                                    std::chrono::milliseconds timeout);

}  // namespace beluga::grammar
