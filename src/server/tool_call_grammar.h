// tool_choice "required" (Anthropic "any") and a named function, enforced: the reply must be tool
// calls in the model's own tool-call markup, each call's arguments an instance of that tool's
// parameter schema (a named function: exactly one call of it; required: one or more calls of the
// offered tools). The markup's special tokens are generated as themselves (grammar/marked_vocab.h).
// Covered: the DeepSeek V3/R1 and V3.1 markup; other syntaxes (V4 DSML, which the prompt prefills,
// Hermes, Llama 3 JSON) are left to the prompt, as before.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "recipe/conversation.h"
#include "recipe/output_syntax.h"
#include "tokenizer/tokenizer.h"

namespace beluga::server {

struct ToolCallGrammar {
  grammar::Grammar grammar;  // marker k is grammar::marker_bytes(k)
  std::vector<int> markers;  // token ids of the markup's special tokens
};

// Whether `conv` forces a tool call in a syntax tool_call_grammar covers.
bool tool_call_enforced(const recipe::Conversation& conv, recipe::ToolSyntax syntax);

// The cache key: the syntax, the mode and the tools' names and schemas.
std::string tool_call_key(const recipe::Conversation& conv, recipe::ToolSyntax syntax);

// Requires tool_call_enforced(). Throws grammar::Refused (the message names the tool) for a
// parameter schema that cannot be enforced, beluga::Error when the tokenizer lacks a marker.
ToolCallGrammar tool_call_grammar(const recipe::Conversation& conv, recipe::ToolSyntax syntax,
                                  const tok::Tokenizer& tokenizer,
                                  std::chrono::steady_clock::time_point deadline);

}  // namespace beluga::server
