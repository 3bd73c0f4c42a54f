// The markup a model writes besides plain text: how its tool calls look and whether it reasons inside
// `<think>…</think>`. The DeepSeek chat formats fix it; for a model served through its Jinja chat
// template (ChatFormat::kTemplate) it is read from the template, since the template is where a model
// declares the markup it was trained on (it renders past tool calls and reasoning with it).
#pragma once

namespace beluga::recipe {

class ChatTemplate;

enum class ToolSyntax {
  kNone,       // tool-call markup is ordinary text
  kV3,         // DeepSeek V3/R1 `<｜tool▁calls▁begin｜>` with fenced JSON arguments
  kV31,        // DeepSeek V3.1 `<｜tool▁calls▁begin｜>` with raw JSON arguments
  kDsml,       // DeepSeek V4 DSML
  kHermes,     // `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` blocks (Qwen2.5, Qwen3)
  kLlama3Json  // the whole reply is `{"name": ..., "parameters": {...}}` (`;`-separated), Llama 3.x
};

struct OutputSyntax {
  ToolSyntax tools = ToolSyntax::kNone;  // the tool-call markup, when a request offers tools
  bool think_tags = false;               // the reply may open with `<think>` (reasoning until `</think>`)
  // The generation prompt itself ends inside `<think>` (Qwen3 thinking-only models, DeepSeek-R1
  // distills), so the reply starts as reasoning; indexed by Conversation::thinking.
  bool prompt_opens_reasoning[2] = {false, false};
};

// What a chat template says. From its text: `<tool_call>` → kHermes; `<|python_tag|>` or Llama-3
// header tokens → kLlama3Json; `<think>` → think_tags. The prompt flags come from rendering it for a
// one-message conversation with thinking off and on (a template that fails to render that leaves them
// false).
OutputSyntax template_output_syntax(const ChatTemplate& tmpl);

}  // namespace beluga::recipe
