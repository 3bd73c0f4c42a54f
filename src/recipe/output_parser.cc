#include "recipe/output_parser.h"

#include <algorithm>

#include "recipe/deepseek_tokens.h"
#include "recipe/py_json.h"

namespace beluga::recipe {

namespace {

enum Action {
  kThinkEnd,
  kCallsBegin,
  kStrayThinkEnd,
  kJsonFence,
  kJsonBrace,
  kJsonEnd,
  kCallBegin,
  kCallsEnd,
  kToolSep,
  kNameEnd,
  kArgsOpen,
  kArgsCloseFence,
  kCallEnd,
  kDsmlInvoke,
  kDsmlParam,
  kDsmlCallEnd,
  kDsmlParamNameEnd,
  kDsmlString,
  kDsmlRaw,
  kDsmlValueEnd,
  kJsonCallEnd,
  kStop0 = 100,  // kStop0 + i: stop sequence i
};

const std::string kDsmlOpen = std::string("<") + ds::kDsml;
const std::string kDsmlClose = std::string("</") + ds::kDsml;
constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kPythonTag = "<|python_tag|>";  // Llama 3.x: the reply is code / a call

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// The DeepSeek syntaxes, whose models may also call tools from inside their reasoning.
bool deepseek_tools(ToolSyntax ts) {
  return ts == ToolSyntax::kV3 || ts == ToolSyntax::kV31 || ts == ToolSyntax::kDsml;
}

// Length of an incomplete UTF-8 sequence at the end of `s` (0 if it ends on a character boundary).
size_t incomplete_utf8_tail(std::string_view s) {
  size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    unsigned char c = s[n - back];
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

// Length of the valid UTF-8 character at s[i], 0 if that byte is not the start of one.
size_t utf8_char_at(std::string_view s, size_t i) {
  unsigned char c = s[i];
  size_t need = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (need == 0 || i + need > s.size()) return 0;
  for (size_t k = 1; k < need; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 0;
  return need;
}

// Replaces bytes that are not valid UTF-8 with U+FFFD, so every delta is valid JSON string text.
std::string valid_utf8(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (size_t n = utf8_char_at(s, i)) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

// JSON mode's stand-in for text outside the JSON value: one space per character of valid_utf8(s).
// Counting the characters valid_utf8 would give (each invalid byte one U+FFFD), not the lead bytes,
// makes raw bytes and the same bytes replayed after a rejected JSON call (already made valid) pad
// alike, so the padding does not depend on where the input was split.
std::string json_mode_padding(std::string_view s) {
  size_t chars = 0;
  for (size_t i = 0; i < s.size(); ++chars) i += std::max<size_t>(utf8_char_at(s, i), 1);
  return std::string(chars, ' ');
}

}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kToolCalls:
      return "tool_calls";
  }
  return "stop";
}

namespace {

// A continued assistant message resumes where it stopped (mid-reasoning when it has no answer yet).
void continue_prefix(const Conversation& conv, ParserOptions& o) {
  if (conv.messages.empty() || !conv.messages.back().prefix) return;
  const Message& m = conv.messages.back();
  o.start_in_reasoning = o.start_in_reasoning && !m.reasoning.empty() && m.text().empty();
  o.start_in_tool_calls = false;
  o.think_tags = false;  // the reply is under way: it no longer opens
}

}  // namespace

ParserOptions parser_options(const ChatEncoder& encoder, const Conversation& conv,
                             const std::vector<std::string>& stop) {
  if (encoder.format() != ChatFormat::kTemplate) return parser_options(encoder.format(), conv, stop);
  const OutputSyntax& syn = encoder.output_syntax();
  ParserOptions o;
  o.stop = stop;
  o.json_mode = conv.json_mode;
  o.tools = conv.tools_enabled() ? syn.tools : ToolSyntax::kNone;
  o.think_tags = syn.think_tags;
  o.start_in_reasoning = syn.prompt_opens_reasoning[conv.thinking ? 1 : 0];
  continue_prefix(conv, o);
  return o;
}

ParserOptions parser_options(ChatFormat format, const Conversation& conv,
                             const std::vector<std::string>& stop) {
  ParserOptions o;
  o.stop = stop;
  o.json_mode = conv.json_mode;
  const bool tools = conv.tools_enabled();
  switch (format) {
    case ChatFormat::kDeepSeekV3:
      o.tools = tools ? ToolSyntax::kV3 : ToolSyntax::kNone;
      break;
    case ChatFormat::kDeepSeekR1:
      o.tools = tools ? ToolSyntax::kV3 : ToolSyntax::kNone;
      o.start_in_reasoning = true;
      break;
    case ChatFormat::kDeepSeekV31:
      o.tools = tools ? ToolSyntax::kV31 : ToolSyntax::kNone;
      o.start_in_reasoning = conv.thinking;
      break;
    case ChatFormat::kDeepSeekV4:
    case ChatFormat::kDeepSeekV41:
      o.tools = tools ? ToolSyntax::kDsml : ToolSyntax::kNone;
      o.start_in_reasoning = conv.thinking;
      o.start_in_tool_calls = tools && conv.tool_choice.mode == ToolChoice::Mode::kRequired;
      break;
    case ChatFormat::kTemplate:
      break;  // the template's markup is unknown here: all content
  }
  continue_prefix(conv, o);
  return o;
}

OutputParser::OutputParser(ParserOptions options) : opt_(std::move(options)) {
  std::erase_if(opt_.stop, [](const std::string& s) { return s.empty(); });
  state_ = opt_.start_in_tool_calls                                   ? State::kToolCalls
           : opt_.start_in_reasoning                                  ? State::kReasoning
           : opt_.think_tags || opt_.tools == ToolSyntax::kLlama3Json ? State::kStart
                                                                      : State::kContent;
  think_open_ = opt_.think_tags && !opt_.start_in_reasoning;
}

std::vector<OutputParser::Branch> OutputParser::branches() const {
  std::vector<Branch> b;
  const ToolSyntax ts = opt_.tools;
  // The marker that opens tool calls anywhere in the text (Llama calls only open the reply: kStart).
  const std::string calls_open = ts == ToolSyntax::kDsml     ? kDsmlOpen
                                 : ts == ToolSyntax::kHermes ? std::string(kHermesOpen)
                                 : deepseek_tools(ts)        ? std::string(ds::kCallsBegin)
                                                             : std::string();
  switch (state_) {
    case State::kStart:
      break;  // start() decides
    case State::kReasoning:
      // Qwen closes its reasoning before calling tools, and thinks aloud about `<tool_call>`.
      if (deepseek_tools(ts)) b.push_back({calls_open, true, kCallsBegin});
      b.push_back({ds::kThinkEnd, true, kThinkEnd});
      break;
    case State::kContent:
      if (opt_.json_mode) {
        b.push_back({"```json\n", false, kJsonFence});
        b.push_back({"```\n", false, kJsonFence});
        b.push_back({"{", false, kJsonBrace});
        b.push_back({"[", false, kJsonBrace});
      } else {
        for (size_t i = 0; i < opt_.stop.size(); ++i) b.push_back({opt_.stop[i], false, kStop0 + int(i)});
      }
      if (!calls_open.empty()) b.push_back({calls_open, true, kCallsBegin});
      b.push_back({ds::kThinkEnd, false, kStrayThinkEnd});
      break;
    case State::kJson:
      for (size_t i = 0; i < opt_.stop.size(); ++i) b.push_back({opt_.stop[i], false, kStop0 + int(i)});
      b.push_back({"\n```", false, kJsonEnd});
      break;
    case State::kMatchedJson:
      if (!calls_open.empty()) b.push_back({calls_open, true, kCallsBegin});
      break;
    case State::kToolCalls:
      if (ts == ToolSyntax::kDsml) {
        b.push_back({"invoke name=\"", false, kDsmlInvoke});
        b.push_back({kDsmlClose + "tool_calls>", false, kCallsEnd});
        b.push_back({kDsmlClose + " calls>", false, kCallsEnd});
      } else {
        b.push_back({ds::kCallBegin, false, kCallBegin});
        b.push_back({ds::kCallsEnd, false, kCallsEnd});
      }
      break;
    case State::kToolType:
      b.push_back({ds::kToolSep, false, kToolSep});
      break;
    case State::kToolName:
      b.push_back({ts == ToolSyntax::kDsml ? "\""
                   : ts == ToolSyntax::kV3 ? "\n"
                                           : ds::kToolSep,
                   false, kNameEnd});
      break;
    case State::kArgsOpen:
      b.push_back({"```json\n", false, kArgsOpen});
      b.push_back({"```\n", false, kArgsOpen});
      b.push_back({ds::kCallEnd, false, kCallEnd});
      break;
    case State::kArgs:
      if (ts == ToolSyntax::kV3) b.push_back({"\n```", false, kArgsCloseFence});
      b.push_back({ds::kCallEnd, false, kCallEnd});
      break;
    case State::kArgsClosed:
      b.push_back({ds::kCallEnd, false, kCallEnd});
      break;
    case State::kDsmlArgs:
      b.push_back({"parameter name=\"", false, kDsmlParam});
      b.push_back({kDsmlClose, false, kDsmlCallEnd});
      break;
    case State::kDsmlParamName:
      b.push_back({"\"", false, kDsmlParamNameEnd});
      break;
    case State::kDsmlParamType:
      b.push_back({"true\">", false, kDsmlString});
      b.push_back({"false\">", false, kDsmlRaw});
      break;
    case State::kDsmlParamValue:
      b.push_back({kDsmlClose, false, kDsmlValueEnd});
      break;
    case State::kJsonCall:
      if (ts == ToolSyntax::kHermes) {
        b.push_back({std::string(kHermesClose), false, kJsonCallEnd});
        // A model that forgets `</tool_call>` between calls opens the next one directly.
        if (call_.status() == JsonToolCallReader::Status::kDone)
          b.push_back({std::string(kHermesOpen), true, kCallsBegin});
      }
      break;  // a Llama call ends with its object
    case State::kJsonCallsNext:
    case State::kFinished:
      break;
  }
  return b;
}

void OutputParser::delta(ParserEvent::Kind kind, std::string text, std::vector<ParserEvent>& events) {
  if (text.empty()) return;
  int index = kind == ParserEvent::Kind::kToolCallArgs ? calls_ - 1 : -1;
  if (kind == ParserEvent::Kind::kToolCallArgs) args_emitted_ = true;
  events.push_back({kind, std::move(text), index});
}

void OutputParser::begin_call(std::vector<ParserEvent>& events) {
  events.push_back({ParserEvent::Kind::kToolCallBegin, valid_utf8(name_), calls_});
  ++calls_;
  name_.clear();
  in_call_ = true;
  args_emitted_ = false;
  first_param_ = true;
}

void OutputParser::end_call(std::vector<ParserEvent>& events) {
  if (!in_call_) return;
  if (!args_emitted_) delta(ParserEvent::Kind::kToolCallArgs, "{}", events);
  events.push_back({ParserEvent::Kind::kToolCallEnd, "", calls_ - 1});
  in_call_ = false;
  ++completed_calls_;
}

// Bytes no branch matched, in the current state.
void OutputParser::emit(std::string_view bytes, std::vector<ParserEvent>& events) {
  if (bytes.empty()) return;
  using K = ParserEvent::Kind;
  switch (state_) {
    case State::kReasoning:
    case State::kContent: {
      if (lead_) {
        size_t k = 0;
        while (k < bytes.size() && bytes[k] == '\n') ++k;
        bytes.remove_prefix(k);
        if (bytes.empty()) return;
        lead_ = false;
      }
      if (state_ == State::kContent && opt_.json_mode) {
        delta(K::kContent, json_mode_padding(bytes), events);
      } else {
        delta(state_ == State::kReasoning ? K::kReasoning : K::kContent, valid_utf8(bytes), events);
      }
      break;
    }
    case State::kJson:
      delta(K::kContent, valid_utf8(bytes), events);
      break;
    case State::kMatchedJson:
      delta(K::kContent, json_mode_padding(bytes), events);
      break;
    case State::kToolName:
      name_ += bytes;
      break;
    case State::kArgs:
      delta(K::kToolCallArgs, valid_utf8(bytes), events);
      break;
    case State::kDsmlParamName: {
      std::string key;
      json_escape_append(key, valid_utf8(bytes));
      delta(K::kToolCallArgs, key, events);
      break;
    }
    case State::kDsmlParamValue: {
      if (string_value_) {
        std::string v;
        json_escape_append(v, valid_utf8(bytes));
        delta(K::kToolCallArgs, v, events);
      } else {
        delta(K::kToolCallArgs, valid_utf8(bytes), events);
      }
      break;
    }
    case State::kJsonCall:
      read_json_call(bytes, events);
      break;
    case State::kJsonCallsNext: {
      size_t i = 0;
      while (i < bytes.size() && is_space(bytes[i])) ++i;
      if (i == bytes.size()) break;
      if (bytes[i] == ';') {
        open_json_call(State::kContent, "");
        replay_ = bytes.substr(i + 1);
        replaying_ = true;
      } else {
        state_ = State::kFinished;  // text after the calls (an end-of-message tag) is not part of them
      }
      break;
    }
    default:
      break;  // markup between tool-call parts, and anything after the end: dropped
  }
}

void OutputParser::open_json_call(State resume, std::string opener) {
  call_ = JsonToolCallReader();
  resume_ = resume;
  opener_ = std::move(opener);
  state_ = State::kJsonCall;
}

void OutputParser::read_json_call(std::string_view bytes, std::vector<ParserEvent>& events) {
  if (call_.status() != JsonToolCallReader::Status::kReading) return;  // the rest of a Hermes block
  const std::string text = valid_utf8(bytes);
  JsonToolCallReader::Output out;
  const size_t n = call_.feed(text, out);
  if (out.begin) {
    name_ = out.name;
    begin_call(events);
  }
  delta(ParserEvent::Kind::kToolCallArgs, std::move(out.args), events);
  const std::string_view rest = std::string_view(text).substr(n);
  switch (call_.status()) {
    case JsonToolCallReader::Status::kReading:
      break;
    case JsonToolCallReader::Status::kDone:
      end_call(events);
      // Llama: `;` and another call may follow. Hermes: the rest of the block is dropped up to
      // `</tool_call>`, or a next `<tool_call>`. Either way the markers to look for have changed, so
      // the bytes after the object are parsed again.
      if (opt_.tools == ToolSyntax::kLlama3Json) state_ = State::kJsonCallsNext;
      replay_ = rest;
      replaying_ = true;
      break;
    case JsonToolCallReader::Status::kFailed:
      reject_json_call(rest, events);
      break;
  }
}

// Not a tool call after all: its opener is text of the state it interrupted, and the bytes read as
// the call are parsed again there.
void OutputParser::reject_json_call(std::string_view rest, std::vector<ParserEvent>& events) {
  state_ = resume_;
  const std::string opener = std::move(opener_);
  opener_.clear();
  emit(opener, events);
  replay_ = call_.raw();
  replay_ += rest;
  replaying_ = true;
}

// Puts the bytes of a rejected call (or those after a Llama call) back in front of the unparsed
// buffer, of which `consumed` bytes were used.
bool OutputParser::take_replay(size_t consumed) {
  if (!replaying_) return false;
  buf_ = replay_ + buf_.substr(consumed);
  replay_.clear();
  replaying_ = false;
  return true;
}

// Decides how the reply opens, once its first non-space bytes are in; false: wait for more.
bool OutputParser::start(bool final) {
  size_t i = 0;
  while (i < buf_.size() && is_space(buf_[i])) ++i;
  const std::string_view rest = std::string_view(buf_).substr(i);
  bool undecided = rest.empty();
  auto opens = [&](std::string_view opener) {
    if (rest.starts_with(opener)) return true;
    if (opener.starts_with(rest)) undecided = true;
    return false;
  };
  if (think_open_ && opens(kThinkOpen)) {
    buf_.erase(0, i + kThinkOpen.size());
    state_ = State::kReasoning;
    think_open_ = false;
    lead_ = true;
    return true;
  }
  if (opt_.tools == ToolSyntax::kLlama3Json) {
    if (opens(kPythonTag)) {
      open_json_call(State::kContent, buf_.substr(0, i + kPythonTag.size()));
      buf_.erase(0, i + kPythonTag.size());
      return true;
    }
    if (opens("{")) {
      open_json_call(State::kContent, buf_.substr(0, i));
      buf_.erase(0, i);
      return true;
    }
  }
  if (undecided && !final) return false;
  state_ = State::kContent;
  return true;
}

void OutputParser::on_match(int action, std::vector<ParserEvent>& events) {
  using K = ParserEvent::Kind;
  if (action >= kStop0) {
    matched_stop_ = opt_.stop[action - kStop0];
    state_ = State::kFinished;
    return;
  }
  switch (action) {
    case kThinkEnd:
      // A Llama reply may still open with a call after its reasoning.
      state_ = opt_.tools == ToolSyntax::kLlama3Json ? State::kStart : State::kContent;
      think_open_ = false;
      lead_ = true;
      break;
    case kCallsBegin:
      if (opt_.tools != ToolSyntax::kHermes) {
        state_ = State::kToolCalls;
      } else if (state_ == State::kJsonCall) {  // the previous block was left open
        end_call(events);
        open_json_call(State::kContent, matched_);
      } else {
        open_json_call(state_, matched_);
      }
      break;
    case kJsonCallEnd:
      call_.close();
      if (call_.status() == JsonToolCallReader::Status::kFailed) {
        reject_json_call(kHermesClose, events);
      } else {
        end_call(events);
        state_ = State::kContent;
        lead_ = true;
      }
      break;
    case kStrayThinkEnd:
      break;
    case kJsonFence:
      state_ = State::kJson;
      break;
    case kJsonBrace:
      state_ = State::kJson;
      break;  // the brace itself is emitted by process()
    case kJsonEnd:
      state_ = State::kMatchedJson;
      break;
    case kCallBegin:
      state_ = opt_.tools == ToolSyntax::kV3 ? State::kToolType : State::kToolName;
      break;
    case kCallsEnd:
      end_call(events);
      state_ = State::kFinished;
      break;
    case kToolSep:
      state_ = State::kToolName;
      break;
    case kNameEnd:
      begin_call(events);
      state_ = opt_.tools == ToolSyntax::kV3    ? State::kArgsOpen
               : opt_.tools == ToolSyntax::kV31 ? State::kArgs
                                                : State::kDsmlArgs;
      break;
    case kArgsOpen:
      state_ = State::kArgs;
      break;
    case kArgsCloseFence:
      state_ = State::kArgsClosed;
      break;
    case kCallEnd:
      end_call(events);
      state_ = State::kToolCalls;
      break;
    case kDsmlInvoke:
      state_ = State::kToolName;
      break;
    case kDsmlParam:
      delta(K::kToolCallArgs, first_param_ ? "{\"" : ", \"", events);
      first_param_ = false;
      state_ = State::kDsmlParamName;
      break;
    case kDsmlCallEnd:
      if (!first_param_) delta(K::kToolCallArgs, "}", events);
      end_call(events);
      state_ = State::kToolCalls;
      break;
    case kDsmlParamNameEnd:
      delta(K::kToolCallArgs, "\": ", events);
      state_ = State::kDsmlParamType;
      break;
    case kDsmlString:
      delta(K::kToolCallArgs, "\"", events);
      string_value_ = true;
      state_ = State::kDsmlParamValue;
      break;
    case kDsmlRaw:
      string_value_ = false;
      state_ = State::kDsmlParamValue;
      break;
    case kDsmlValueEnd:
      if (string_value_) delta(K::kToolCallArgs, "\"", events);
      state_ = State::kDsmlArgs;
      break;
  }
}

void OutputParser::process(bool final, std::vector<ParserEvent>& events) {
  while (!buf_.empty()) {
    if (state_ == State::kFinished) {
      buf_.clear();
      return;
    }
    if (state_ == State::kStart) {
      if (!start(final)) return;
      continue;
    }
    const std::vector<Branch> bs = branches();
    // The match that completes first wins; ties go to the earlier branch.
    size_t best_end = std::string::npos, best_start = 0;
    int best_action = -1;
    std::string_view best_pattern;
    for (const Branch& b : bs) {
      size_t p = buf_.find(b.pattern);
      if (p == std::string::npos) continue;
      size_t end = p + b.pattern.size();
      if (end < best_end) {
        size_t start = p;
        if (b.newlines_before)
          while (start > 0 && buf_[start - 1] == '\n') --start;
        best_end = end;
        best_start = start;
        best_action = b.action;
        best_pattern = b.pattern;
      }
    }
    if (best_action >= 0) {
      emit(std::string_view(buf_).substr(0, best_start), events);
      if (take_replay(best_start)) continue;  // a call was rejected before the marker: parse again
      std::string pattern(best_pattern);
      matched_ = buf_.substr(best_start, best_end - best_start);
      buf_.erase(0, best_end);
      on_match(best_action, events);
      if (best_action == kJsonBrace) delta(ParserEvent::Kind::kContent, pattern, events);
      take_replay(0);
      continue;
    }
    if (final) {
      emit(buf_, events);
      if (take_replay(buf_.size())) continue;
      buf_.clear();
      return;
    }
    // Hold every byte that may begin a match, and an unfinished UTF-8 character.
    size_t hold = buf_.size() - incomplete_utf8_tail(buf_);
    for (const Branch& b : bs) {
      size_t h = buf_.size();
      for (size_t k = std::min(b.pattern.size() - 1, buf_.size()); k >= 1; --k) {
        if (buf_.compare(buf_.size() - k, k, b.pattern, 0, k) == 0) {
          h = buf_.size() - k;
          break;
        }
      }
      if (b.newlines_before)  // newlines right before a possible match belong to it
        while (h > 0 && buf_[h - 1] == '\n') --h;
      hold = std::min(hold, h);
    }
    emit(std::string_view(buf_).substr(0, hold), events);
    if (take_replay(hold)) continue;
    buf_.erase(0, hold);
    return;
  }
}

void OutputParser::feed(std::string_view chunk, std::vector<ParserEvent>& events) {
  if (state_ == State::kFinished) return;
  buf_.append(chunk);
  process(false, events);
}

FinishReason OutputParser::finish(bool engine_length, std::vector<ParserEvent>& events) {
  process(true, events);
  // The output ended inside a JSON call: a committed one is closed below, an uncommitted one is text
  // (which may hold another call).
  while (state_ == State::kJsonCall && call_.status() == JsonToolCallReader::Status::kReading) {
    call_.close();
    if (call_.status() == JsonToolCallReader::Status::kFailed) {
      reject_json_call("", events);
      take_replay(0);
      process(true, events);
    }
  }
  if (!matched_stop_.empty()) return FinishReason::kStop;
  if (engine_length) return FinishReason::kLength;
  if (in_call_) end_call(events);  // the model ended inside a call: close it so clients see it
  return completed_calls_ > 0 ? FinishReason::kToolCalls : FinishReason::kStop;
}

}  // namespace beluga::recipe
