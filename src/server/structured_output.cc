#include "server/structured_output.h"

#include "grammar/choice.h"
#include "grammar/gbnf.h"
#include "grammar/grammar_processor.h"
#include "grammar/json_schema.h"
#include "grammar/marked_vocab.h"
#include "grammar/refused.h"
#include "grammar/regex.h"
#include "server/tool_call_grammar.h"

namespace beluga::server {

using Json = nlohmann::ordered_json;
using recipe::ApiError;
using recipe::OutputConstraint;

namespace {

[[noreturn]] void refuse(const ConstraintContext& ctx, const std::string& param, const std::string& message,
                         const std::string& code = "") {
  // Anthropic bodies have no `param`: the message names the field, as recipe::Fields does.
  if (ctx.api == recipe::Api::kMessages) throw ApiError(ctx.api, 400, param + ": " + message);
  throw ApiError(ctx.api, 400, "Invalid '" + param + "': " + message, param, code);
}

// json_object: any JSON object, as the schema {"type": "object"} (any properties, any values).
const Json& any_object_schema() {
  static const Json s = Json{{"type", "object"}};
  return s;
}

// The cached grammar under `key`; the compiler's refusals as 400s on `param`.
std::shared_ptr<const grammar::CompiledGrammar> compile_or_refuse(GrammarCache& cache, const std::string& key,
                                                                  const GrammarCache::Compile& compile,
                                                                  const ConstraintContext& ctx,
                                                                  const std::string& param,
                                                                  const char* what = "JSON Schema") {
  try {
    return cache.get(key, compile);
  } catch (const grammar::Refused& r) {
    if (r.keyword() == "compile-time")
      refuse(ctx, param,
             "compiling the grammar exceeded the time limit (" +
                 std::to_string(cache.options().timeout.count()) + " ms): simplify the schema",
             "grammar_compile_timeout");
    if (r.keyword() == "grammar-size")
      refuse(ctx, param, std::string(r.what()) + ": simplify the schema", "grammar_too_large");
    refuse(ctx, param,
           std::string(what == std::string_view("JSON Schema") ? "the schema keyword '" : "the construct '") +
               r.keyword() + "' cannot be enforced: " + r.what(),
           "unsupported_schema");
  } catch (const Error& e) {
    refuse(ctx, param, std::string("not a valid ") + what + ": " + e.what(),
           what == std::string_view("JSON Schema") ? "invalid_schema" : "invalid_grammar");
  }
}

}  // namespace

std::string constraint_key(const OutputConstraint& c) {
  switch (c.kind) {
    case OutputConstraint::Kind::kNone:
      return "";
    case OutputConstraint::Kind::kJsonObject:
      return "json_object";
    case OutputConstraint::Kind::kJsonSchema:
      return "json_schema\n" + c.schema.dump();
    case OutputConstraint::Kind::kChoice:
      return "choice\n" + Json(c.choices).dump();
    case OutputConstraint::Kind::kRegex:
      return "regex\n" + c.text;
    case OutputConstraint::Kind::kGrammar:
      return "grammar\n" + c.text;
  }
  return "";
}

LogitsProcessorFactory structured_output_processor(const OutputConstraint& c, GrammarCache* cache,
                                                   const ConstraintContext& ctx) {
  if (!c.active()) return {};
  if (!cache) refuse(ctx, c.param, "structured outputs are not available on this server");
  if (ctx.parser && ctx.parser->start_in_reasoning)
    refuse(ctx, c.param,
           "structured outputs cannot be combined with thinking (the reply starts with reasoning); "
           "disable thinking for this request");
  if (ctx.parser && ctx.parser->start_in_tool_calls)
    refuse(ctx, c.param, "structured outputs cannot be combined with a tool_choice that forces a tool call");
  if (ctx.continues_prefix)
    refuse(ctx, c.param,
           "structured outputs cannot continue an assistant prefix (the constraint covers the whole reply)");
  if (ctx.sampling && ctx.sampling->ignore_eos)
    refuse(ctx, c.param,
           "structured outputs cannot be combined with ignore_eos (the reply ends where the grammar does)");
  if (ctx.sampling && ctx.sampling->min_tokens > 0)
    refuse(ctx, c.param,
           "structured outputs cannot be combined with min_tokens (a complete reply may be shorter)");

  const std::shared_ptr<const grammar::TokenVocab>& vocab = cache->vocab();
  GrammarCache::Compile compile = [&](GrammarCache::Deadline deadline) {
    grammar::Grammar g;
    if (c.kind == OutputConstraint::Kind::kChoice) {
      g = grammar::choice_grammar(c.choices);
    } else if (c.kind == OutputConstraint::Kind::kRegex) {
      g = grammar::from_regex(c.text);
    } else if (c.kind == OutputConstraint::Kind::kGrammar) {
      g = grammar::from_ebnf(c.text);
    } else {
      grammar::JsonSchemaOptions opt;
      opt.deadline = deadline;
      g = grammar::json_schema_grammar(
          c.kind == OutputConstraint::Kind::kJsonObject ? any_object_schema() : c.schema, opt);
    }
    return grammar::compile_until(g, vocab, deadline, grammar::CompileLimits{});
  };
  const std::string& schema_param = c.schema_param.empty() ? c.param : c.schema_param;
  const char* what = c.kind == OutputConstraint::Kind::kRegex     ? "regex"
                     : c.kind == OutputConstraint::Kind::kGrammar ? "grammar"
                                                                  : "JSON Schema";
  return grammar::processor_factory(
      compile_or_refuse(*cache, constraint_key(c), compile, ctx, schema_param, what));
}

LogitsProcessorFactory tool_call_processor(const recipe::Conversation& conv, const tok::Tokenizer& tokenizer,
                                           GrammarCache* cache, const ConstraintContext& ctx) {
  if (!cache || !ctx.parser || ctx.parser->start_in_reasoning || ctx.continues_prefix) return {};
  const recipe::ToolSyntax syntax = ctx.parser->tools;
  if (!tool_call_enforced(conv, syntax)) return {};
  if (ctx.sampling && (ctx.sampling->ignore_eos || ctx.sampling->min_tokens > 0))
    refuse(ctx, "tool_choice", "a forced tool call cannot be combined with ignore_eos or min_tokens");
  GrammarCache::Compile compile = [&](GrammarCache::Deadline deadline) {
    ToolCallGrammar t = tool_call_grammar(conv, syntax, tokenizer, deadline);
    return grammar::compile_until(t.grammar, grammar::marked_vocab(*cache->vocab(), t.markers), deadline,
                                  grammar::CompileLimits{});
  };
  return grammar::processor_factory(
      compile_or_refuse(*cache, tool_call_key(conv, syntax), compile, ctx, "tools"));
}

}  // namespace beluga::server
