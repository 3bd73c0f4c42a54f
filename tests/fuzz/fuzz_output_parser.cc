// libFuzzer target: the streaming output parser. The first two bytes pick the options (tool syntax,
// reasoning start, think tags, JSON mode, a stop sequence), the rest is model output. It is parsed in
// one feed and again fed at split points taken from the input, and the two event streams must agree
// once adjacent deltas of one kind are joined (output_parser.h's contract), as must the finish
// reasons. Nothing may throw.
#include "fuzz_support.h"
#include "recipe/output_parser.h"

namespace {

using beluga::recipe::ParserEvent;

// Adjacent deltas of one kind (and one tool call) joined.
std::vector<ParserEvent> joined(const std::vector<ParserEvent>& events) {
  std::vector<ParserEvent> out;
  for (const auto& e : events) {
    const bool delta = e.kind == ParserEvent::Kind::kReasoning || e.kind == ParserEvent::Kind::kContent ||
                       e.kind == ParserEvent::Kind::kToolCallArgs;
    if (delta && e.text.empty()) continue;
    if (delta && !out.empty() && out.back().kind == e.kind && out.back().tool_index == e.tool_index)
      out.back().text += e.text;
    else
      out.push_back(e);
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace beluga::recipe;
  if (size < 2) return 0;
  const uint8_t a = data[0], b = data[1];
  ParserOptions o;
  static const ToolSyntax kSyntaxes[] = {ToolSyntax::kNone, ToolSyntax::kV3,     ToolSyntax::kV31,
                                         ToolSyntax::kDsml, ToolSyntax::kHermes, ToolSyntax::kLlama3Json};
  o.tools = kSyntaxes[a % 6];
  o.start_in_reasoning = a & 8;
  o.start_in_tool_calls = (a & 16) && o.tools == ToolSyntax::kDsml;
  o.think_tags = a & 32;
  o.json_mode = a & 64;
  static const char* kStops[] = {"", "\n\n", "</", "<｜end▁of▁sentence｜>", "}", "ab"};
  if (b % 6) o.stop.push_back(kStops[b % 6]);
  const bool engine_length = b & 128;
  const std::string_view text = beluga::fuzz::as_text(data + 2, size - 2);

  std::vector<ParserEvent> whole, split;
  OutputParser p1(o);
  p1.feed(text, whole);
  const FinishReason f1 = p1.finish(engine_length, whole);

  OutputParser p2(o);
  beluga::fuzz::Splitter s(text);
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = std::min(text.size() - pos, s.next(8));
    p2.feed(text.substr(pos, n), split);
    pos += n;
  }
  const FinishReason f2 = p2.finish(engine_length, split);
  if (f1 != f2) beluga::fuzz::finding("finish reason depends on the split");
  if (joined(whole) != joined(split)) beluga::fuzz::finding("events depend on the split");
  return 0;
}
