// Streaming output parser: model text -> reasoning / content / tool-call events and a finish reason,
// for the DeepSeek formats (V3/R1 and V3.1 `<｜tool▁calls▁begin｜>` families, V4/V4.1 DSML), with JSON
// mode and stop sequences. A byte-level state machine after deepseek-recipe's: bytes that may still
// start a marker are held until the next feed, so any split of the same text yields the same
// events once adjacent deltas of one kind are joined; deltas are always whole UTF-8 characters.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "recipe/chat_format.h"
#include "recipe/conversation.h"

namespace beluga::recipe {

enum class ToolSyntax { kNone, kV3, kV31, kDsml };

struct ParserOptions {
  ToolSyntax tools = ToolSyntax::kNone;  // kNone: tool-call markup is ordinary text
  bool start_in_reasoning = false;       // the prompt ended with `<think>`
  bool start_in_tool_calls = false;      // the prompt prefilled the DSML tool-call opener
  bool json_mode = false;                // text outside the JSON value becomes spaces
  std::vector<std::string> stop;         // stop sequences (empty strings ignored)
};

// What the parser must know about a request encoded in `format`.
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
  bool reasoning_tools_ = false;
  std::string matched_stop_;
};

}  // namespace beluga::recipe
