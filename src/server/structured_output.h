// A request's structured-output constraint (recipe/output_constraint.h) -> the engine's per-sequence
// processor factory (EngineRequest::logits_processor), compiled through the model's GrammarCache on
// the calling (build-pool) thread. What cannot be enforced is a 400 in the API's shape: a schema
// keyword the compiler refuses (named), an invalid schema, a compile over the size or time limit,
// no grammar support on this server, or a combination the grammar would break (a reply that opens
// inside reasoning or a prefilled tool call, a continued assistant prefix, ignore_eos).
#pragma once

#include <string>

#include "engine/logits_processor.h"
#include "engine/request.h"
#include "recipe/api_error.h"
#include "recipe/output_constraint.h"
#include "recipe/output_parser.h"
#include "server/grammar_cache.h"
#include "tokenizer/tokenizer.h"

namespace beluga::server {

// The cache key of a constraint: its kind and canonical text.
std::string constraint_key(const recipe::OutputConstraint& c);

struct ConstraintContext {
  recipe::Api api = recipe::Api::kChat;  // the error shape
  const SamplingParams* sampling = nullptr;
  const recipe::ParserOptions* parser = nullptr;  // chat-like APIs: where the reply starts
  bool continues_prefix = false;                  // the last assistant message is continued
};

// Null when `c` asks for nothing. `cache` null: structured outputs are unavailable (a 400).
LogitsProcessorFactory structured_output_processor(const recipe::OutputConstraint& c, GrammarCache* cache,
                                                   const ConstraintContext& ctx);

// tool_choice "required" / a named function in a markup server/tool_call_grammar.h covers: the
// reply constrained to tool calls whose arguments fit the tools' schemas. Null (enforced by the
// prompt alone, as before) when nothing is forced, the syntax is not covered, the reply opens in
// reasoning or continues a prefix, or `cache` is null. A tool schema that cannot be enforced is a 400
// with param `tools`.
LogitsProcessorFactory tool_call_processor(const recipe::Conversation& conv, const tok::Tokenizer& tokenizer,
                                           GrammarCache* cache, const ConstraintContext& ctx);

}  // namespace beluga::server
