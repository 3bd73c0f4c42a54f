// Streaming output parser: model text -> reasoning / content / tool-call events and a finish reason,
// for the DeepSeek formats (V3/R1 and V3.1 `<｜tool▁calls▁begin｜>` families, V4/V4.1 DSML) and for
// chat-template models (Hermes `<tool_call>` JSON blocks as Qwen writes them, Llama 3.x JSON calls,
// Qwen3 `<think>` reasoning), with JSON mode and stop sequences. A byte-level state machine after
// deepseek-recipe's: bytes that may still start a marker are held until the next feed, so any split of
// the same text yields the same events once adjacent deltas of one kind are joined; deltas are always
// whole UTF-8 characters; text before a tool call is content.
//
// JSON tool calls (kHermes, kLlama3Json) stream as soon as the name and the start of the arguments are
// seen (JsonToolCallReader has the rules). A block that turns out not to be a call (not JSON, no name
// or arguments) is passed on as the text it was, in the state it interrupted, rather than dropped
// (vLLM's non-streaming hermes / llama3_json parsers return the whole reply as content when a call
// fails to parse; its streaming ones skip what they cannot parse).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "recipe/chat_format.h"
#include "recipe/conversation.h"
#include "recipe/json_tool_call.h"
#include "recipe/output_syntax.h"

namespace beluga::recipe {

struct ParserOptions {
  ToolSyntax tools = ToolSyntax::kNone;  // kNone: tool-call markup is ordinary text
  bool start_in_reasoning = false;       // the prompt ended with `<think>`
  bool start_in_tool_calls = false;      // the prompt prefilled the DSML tool-call opener
  // The reply may open with `<think>` (after whitespace): reasoning until `</think>` (Qwen3 hybrid
  // models write it themselves when thinking is on). Elsewhere `<think>` is text.
  bool think_tags = false;
  bool json_mode = false;         // text outside the JSON value becomes spaces
  std::vector<std::string> stop;  // stop sequences (empty strings ignored)
};

// What the parser must know about a request encoded by `encoder`: the DeepSeek formats' markup, or
// what a chat template declares (ChatEncoder::output_syntax()).
ParserOptions parser_options(const ChatEncoder& encoder, const Conversation& conv,
                             const std::vector<std::string>& stop);
// The same from the format alone: for kTemplate that knows no markup (all content).
ParserOptions parser_options(ChatFormat format, const Conversation& conv,
                             const std::vector<std::string>& stop);

struct ParserEvent {
  enum class Kind { kReasoning, kContent, kToolCallBegin, kToolCallArgs, kToolCallEnd };
  Kind kind;
  std::string text;     // delta text; the tool's name for kToolCallBegin
  int tool_index = -1;  // tool-call events: 0, 1, ... in order of appearance
  bool operator==(const ParserEvent&) const = default;
};

enum class FinishReason { kStop, kLength, kToolCalls };
const char* finish_reason_name(FinishReason r);  // "stop" | "length" | "tool_calls"

class OutputParser {
 public:
  explicit OutputParser(ParserOptions options);

  // Parses one chunk of model output (any byte split), appending events.
  void feed(std::string_view chunk, std::vector<ParserEvent>& events);
  // End of generation: flushes held bytes. `engine_length` = the engine stopped at max_tokens.
  FinishReason finish(bool engine_length, std::vector<ParserEvent>& events);

  // A stop sequence matched or the tool-call block closed: further output is discarded, so the
  // engine may stop generating.
  bool done() const { return state_ == State::kFinished; }
  // The stop sequence that matched, if any.
  const std::string& matched_stop() const { return matched_stop_; }

 private:
  enum class State {
    kStart,  // nothing but whitespace yet: `<think>` or a Llama JSON call may open the reply
    kReasoning,
    kContent,
    kJson,
    kMatchedJson,
    kToolCalls,
    kToolType,
    kToolName,
    kArgsOpen,
    kArgs,
    kArgsClosed,
    kDsmlArgs,
    kDsmlParamName,
    kDsmlParamType,
    kDsmlParamValue,
    kJsonCall,       // inside a JSON tool call (a Hermes block, or a Llama call)
    kJsonCallsNext,  // Llama: after a call, `;` and the next one, or the end of the reply
    kFinished
  };
  struct Branch {
    std::string pattern;
    bool newlines_before;  // a run of '\n' right before the pattern belongs to the match
    int action;
  };

  std::vector<Branch> branches() const;
  void on_match(int action, std::vector<ParserEvent>& events);
  void emit(std::string_view bytes, std::vector<ParserEvent>& events);
  void delta(ParserEvent::Kind kind, std::string text, std::vector<ParserEvent>& events);
  void begin_call(std::vector<ParserEvent>& events);
  void end_call(std::vector<ParserEvent>& events);
  void process(bool final, std::vector<ParserEvent>& events);
  bool start(bool final);
  void open_json_call(State resume, std::string opener);
  void read_json_call(std::string_view bytes, std::vector<ParserEvent>& events);
  void reject_json_call(std::string_view rest, std::vector<ParserEvent>& events);
  bool take_replay(size_t consumed);

  ParserOptions opt_;
  State state_;
  bool lead_ = true;  // leading newlines of reasoning / content are dropped
  std::string buf_;
  std::string name_;
  int calls_ = 0;  // tool calls begun
  int completed_calls_ = 0;
  bool in_call_ = false;
  bool args_emitted_ = false;
  bool first_param_ = true;
  bool string_value_ = false;
  std::string matched_stop_;
  bool think_open_ = true;  // kStart may still take `<think>`
  std::string matched_;     // the text of the last marker matched (with the newlines it took)
  // The JSON call being read, the state it interrupted (where it goes back as text if it is not a
  // call) and the text that opened it.
  JsonToolCallReader call_;
  State resume_ = State::kContent;
  std::string opener_;
  // Bytes to parse again, in front of the buffer: those of a rejected call, or those after a finished
  // call (the markers to look for changed with it).
  std::string replay_;
  bool replaying_ = false;
};

}  // namespace beluga::recipe
