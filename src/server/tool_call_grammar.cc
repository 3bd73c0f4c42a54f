#include "server/tool_call_grammar.h"

#include "grammar/compose.h"
#include "grammar/json_schema.h"
#include "grammar/marked_vocab.h"
#include "grammar/refused.h"
#include "recipe/deepseek_tokens.h"
#include "util/error.h"

namespace beluga::server {

using recipe::ToolChoice;
using recipe::ToolSyntax;
namespace ds = recipe::ds;

namespace {

bool covered(ToolSyntax s) {
  return s == ToolSyntax::kV3 || s == ToolSyntax::kV31;
}

// The markup's special tokens, in marker order.
const std::vector<const char*>& marker_names() {
  static const std::vector<const char*> names = {ds::kCallsBegin, ds::kCallsEnd, ds::kCallBegin, ds::kCallEnd,
                                                 ds::kToolSep};
  return names;
}
enum Marker { kCallsBegin, kCallsEnd, kCallBegin, kCallEnd, kToolSep };

}  // namespace

bool tool_call_enforced(const recipe::Conversation& conv, ToolSyntax syntax) {
  const auto mode = conv.tool_choice.mode;
  return conv.tools_enabled() &&
         (mode == ToolChoice::Mode::kRequired || mode == ToolChoice::Mode::kFunction) && covered(syntax);
}

std::string tool_call_key(const recipe::Conversation& conv, ToolSyntax syntax) {
  nlohmann::ordered_json k = {
      {"syntax", int(syntax)}, {"mode", int(conv.tool_choice.mode)}, {"function", conv.tool_choice.function}};
  for (const auto& t : conv.tools) k["tools"].push_back({t.name, t.parameters});
  return "tools\n" + k.dump();
}

ToolCallGrammar tool_call_grammar(const recipe::Conversation& conv, ToolSyntax syntax,
                                  const tok::Tokenizer& tokenizer,
                                  std::chrono::steady_clock::time_point deadline) {
  BELUGA_CHECK(tool_call_enforced(conv, syntax), "tool_call_grammar: nothing to enforce");
  ToolCallGrammar out;
  for (const char* name : marker_names()) {
    const int id = tokenizer.token_id(name);
    BELUGA_CHECK(id >= 0 && tokenizer.is_special(id), "the tokenizer has no special token ", name,
                 " for the tool-call markup");
    out.markers.push_back(id);
  }
  grammar::Grammar& g = out.grammar;
  g.root = g.add_rule("root");
  auto marker = [&](Marker m) { return g.literal(grammar::marker_bytes(size_t(m))); };
  std::vector<int> calls;  // one alternative per callable tool
  for (const auto& tool : conv.tools) {
    if (conv.tool_choice.mode == ToolChoice::Mode::kFunction && tool.name != conv.tool_choice.function)
      continue;
    grammar::JsonSchemaOptions opt;
    opt.deadline = deadline;
    // Arguments are an object: a tool without parameters takes any object.
    const bool open = tool.parameters.is_object() && tool.parameters.empty();
    grammar::Grammar args;
    try {
      args = grammar::json_schema_grammar(open ? nlohmann::ordered_json{{"type", "object"}} : tool.parameters,
                                          opt);
    } catch (const grammar::Refused& r) {
      throw grammar::Refused(r.keyword(), "tool '" + tool.name + "': " + r.what());
    } catch (const Error& e) {
      throw Error("tool '" + tool.name + "': " + e.what());
    }
    const int args_rule = grammar::embed(g, args, tool.name + ".");
    if (syntax == ToolSyntax::kV3)  // <call>function<sep>NAME\n```json\nARGS\n```<call end>
      calls.push_back(g.seq({marker(kCallBegin), g.literal("function"), marker(kToolSep),
                             g.literal(tool.name + "\n```json\n"), g.ref(args_rule), g.literal("\n```"),
                             marker(kCallEnd)}));
    else  // V3.1: <call>NAME<sep>ARGS<call end>
      calls.push_back(g.seq(
          {marker(kCallBegin), g.literal(tool.name), marker(kToolSep), g.ref(args_rule), marker(kCallEnd)}));
  }
  BELUGA_CHECK(!calls.empty(), "tool_choice names no offered tool");
  const int one = g.choice(std::move(calls));
  int body = one;
  if (conv.tool_choice.mode == ToolChoice::Mode::kRequired) {
    // More calls may follow; V3 writes a newline between calls.
    const int more = syntax == ToolSyntax::kV3 ? g.seq({g.literal("\n"), one}) : one;
    body = g.seq({one, g.repeat(more, 0, -1)});
  }
  g.define(g.root, g.seq({marker(kCallsBegin), body, marker(kCallsEnd)}));
  return out;
}

}  // namespace beluga::server
