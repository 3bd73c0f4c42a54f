// Structured output as the APIs ask for it, before anything is compiled: the whole reply must be a JSON
// instance of a schema (OpenAI `response_format` json_schema, Responses `text.format`, Anthropic
// `output_config.format` / the beta's `output_format`, vLLM `structured_outputs.json`), any JSON object
// (`json_object`), or exactly one of a list of strings (vLLM `structured_outputs.choice`). The parsers
// here are shared by the per-API adapters; each checks the field's shape and throws ApiError(400)
// naming the field. Compiling (and refusing unenforceable schemas) is the server's job.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "recipe/json_fields.h"

namespace beluga::recipe {

struct OutputConstraint {
  enum class Kind { kNone, kJsonObject, kJsonSchema, kChoice, kRegex, kGrammar };
  Kind kind = Kind::kNone;
  nlohmann::ordered_json schema;     // kJsonSchema (key order kept: it orders large objects' keys)
  std::vector<std::string> choices;  // kChoice
  std::string text;                  // kRegex: the pattern; kGrammar: GBNF or the Lark subset
  std::string param;                 // the request field it came from (errors name it)
  std::string schema_param;          // kJsonSchema: the field holding the schema itself

  bool active() const { return kind != Kind::kNone; }
};

// OpenAI Chat / Completions `response_format`: {type: text | json_object | json_schema, json_schema:
// {name, schema, strict, description}} at `path`.
OutputConstraint openai_response_format(const Fields& f, const nlohmann::ordered_json& rf,
                                        const std::string& path);
// Responses `text.format`: {type: text | json_object | json_schema, name, schema, strict}.
OutputConstraint responses_text_format(const Fields& f, const nlohmann::ordered_json& fmt,
                                       const std::string& path);
// Anthropic `output_config.format` / `output_format`: {type: "json_schema", schema}.
OutputConstraint anthropic_output_format(const Fields& f, const nlohmann::ordered_json& fmt,
                                         const std::string& path);
// vLLM's `structured_outputs` (and its older `guided_json` / `guided_choice` spellings are not read):
// exactly one of `json` (a schema object or its JSON text), `json_object: true`, `choice` (non-empty
// array of strings), `regex` (the whole reply matches it) or `grammar` (GBNF, or the Lark subset vLLM
// takes). `structural_tag` and `whitespace_pattern` are refused by name.
OutputConstraint vllm_structured_outputs(const Fields& f, const nlohmann::ordered_json& so,
                                         const std::string& path);
// A request may ask in only one way: a second active constraint is a 400 naming both fields.
void merge_constraint(const Fields& f, OutputConstraint& into, OutputConstraint other);

}  // namespace beluga::recipe
