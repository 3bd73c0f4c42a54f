// Incremental reader of one tool call written as a JSON object: `{"name": "f", "arguments": {...}}`
// (Hermes / Qwen2.5 / Qwen3 inside `<tool_call>`) or `{"name": "f", "parameters": {...}}` (Llama 3.x).
// It reports the call as early as it safely can, so clients see the name and the arguments stream
// while the model writes them.
//
// Contract:
// - feed() consumes bytes up to and including the object's closing brace and returns how many it
//   consumed; it consumes nothing once the status is no longer kReading.
// - The call is committed (Output::begin) when its name is known and the `{` of its arguments
//   arrives. From then on the arguments' bytes are passed on verbatim as they come (not validated:
//   OpenAI clients must validate tool arguments anyway, since models do write invalid JSON), and
//   anything unexpected after them ends the call (kDone, the odd byte left unconsumed).
// - Before the commit nothing is reported. A byte that cannot continue a call object, or an object
//   that closes without a string name and arguments, fails the read (kFailed, the offending byte
//   left unconsumed): raw() then holds every byte consumed, so the caller can pass them on as text.
// - Keys other than the name and the arguments (Llama 3.2 writes `"type": "function"` first) are
//   skipped. An object whose arguments come before its name, or whose arguments are not an object,
//   is decided when it closes, by parsing it whole; a string value is taken as the arguments' text.
// - Byte-level and deterministic: any split of the same input yields the same output once joined.
#pragma once

#include <string>
#include <string_view>

namespace beluga::recipe {

class JsonToolCallReader {
 public:
  enum class Status { kReading, kDone, kFailed };
  struct Output {
    bool begin = false;  // the call starts here; `name` is its name
    std::string name;
    std::string args;  // arguments text to append to the call's
  };

  size_t feed(std::string_view bytes, Output& out);
  // The input ended inside the object (the block closed or the output stopped): a committed call is
  // done, an uncommitted one failed.
  void close();

  Status status() const { return status_; }
  bool committed() const { return committed_; }
  const std::string& raw() const { return raw_; }

 private:
  enum class State { kObject, kKey, kKeyText, kColon, kValue, kName, kArgs, kSkip, kAfterValue };
  // Where a JSON value ends, fed one byte at a time from its first byte.
  struct ValueEnd {
    enum Step { kInside, kLast, kPast };  // kLast: this byte ends it; kPast: the value ended before it
    int depth = 0;
    bool in_string = false, escape = false, scalar = false;
    void start(char c);
    Step next(char c);
  };

  bool step(char c, Output& out);  // false: `c` is not consumed (the read ended before it)
  void end_object(Output& out);
  bool stop();  // an unexpected byte: ends a committed call, fails an uncommitted one

  State state_ = State::kObject;
  Status status_ = Status::kReading;
  bool committed_ = false;
  std::string raw_;
  std::string key_;  // the current key, as written (escapes kept)
  bool key_escape_ = false;
  std::string name_raw_;  // the name's JSON string literal, while it is read
  bool have_name_ = false;
  std::string name_;
  ValueEnd value_;
};

}  // namespace beluga::recipe
