#include "recipe/json_tool_call.h"

#include <nlohmann/json.hpp>

#include "recipe/json_depth.h"

namespace beluga::recipe {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// Both spellings models use: Hermes/Qwen write "arguments", Llama 3.x "parameters".
bool is_args_key(const std::string& key) {
  return key == "arguments" || key == "parameters";
}

}  // namespace

void JsonToolCallReader::ValueEnd::start(char c) {
  *this = ValueEnd{};
  if (c == '{' || c == '[')
    depth = 1;
  else if (c == '"')
    in_string = true;
  else
    scalar = true;
}

JsonToolCallReader::ValueEnd::Step JsonToolCallReader::ValueEnd::next(char c) {
  if (in_string) {
    if (escape)
      escape = false;
    else if (c == '\\')
      escape = true;
    else if (c == '"') {
      in_string = false;
      if (depth == 0) return kLast;
    }
    return kInside;
  }
  if (scalar) return (c == ',' || c == '}' || c == ']' || is_space(c)) ? kPast : kInside;
  if (c == '"') {
    in_string = true;
  } else if (c == '{' || c == '[') {
    ++depth;
  } else if (c == '}' || c == ']') {
    if (--depth == 0) return kLast;
  }
  return kInside;
}

size_t JsonToolCallReader::feed(std::string_view bytes, Output& out) {
  size_t n = 0;
  while (n < bytes.size() && status_ == Status::kReading && step(bytes[n], out)) ++n;
  return n;
}

void JsonToolCallReader::close() {
  if (status_ == Status::kReading) status_ = committed_ ? Status::kDone : Status::kFailed;
}

bool JsonToolCallReader::stop() {
  status_ = committed_ ? Status::kDone : Status::kFailed;
  return false;
}

bool JsonToolCallReader::step(char c, Output& out) {
  switch (state_) {
    case State::kObject:
      if (is_space(c)) break;
      if (c != '{') return stop();
      state_ = State::kKey;
      break;
    case State::kKey:
      if (is_space(c)) break;
      if (c == '}') {
        raw_ += c;
        end_object(out);
        return true;
      }
      if (c != '"') return stop();
      key_.clear();
      key_escape_ = false;
      state_ = State::kKeyText;
      break;
    case State::kKeyText:
      if (c == '"' && !key_escape_) {
        state_ = State::kColon;
        break;
      }
      key_escape_ = !key_escape_ && c == '\\';
      key_ += c;
      break;
    case State::kColon:
      if (is_space(c)) break;
      if (c != ':') return stop();
      state_ = State::kValue;
      break;
    case State::kValue:
      if (is_space(c)) break;
      if (key_ == "name" && c == '"' && !have_name_ && !committed_) {
        name_raw_.assign(1, '"');  // (assigning "\"" trips a GCC 12 -Wrestrict false positive)
        value_.start(c);
        state_ = State::kName;
        break;
      }
      value_.start(c);
      if (is_args_key(key_) && have_name_ && !name_.empty() && !committed_ && c == '{') {
        // The common order (name, then object arguments): stream from here on.
        committed_ = true;
        out.begin = true;
        out.name = name_;
        out.args += c;
        state_ = State::kArgs;
        break;
      }
      // Anything else is passed over; arguments seen here are taken from the whole object later.
      state_ = State::kSkip;
      break;
    case State::kName:
      name_raw_ += c;
      if (value_.next(c) == ValueEnd::kLast) {
        auto j = nlohmann::json::parse(name_raw_, nullptr, /*allow_exceptions=*/false);
        if (!j.is_string()) return stop();  // an invalid escape
        name_ = j.get<std::string>();
        have_name_ = true;
        state_ = State::kAfterValue;
      }
      break;
    case State::kArgs:
    case State::kSkip: {
      const ValueEnd::Step s = value_.next(c);
      if (s == ValueEnd::kPast) {  // a scalar ended before this byte: it belongs to the object
        state_ = State::kAfterValue;
        return step(c, out);
      }
      if (state_ == State::kArgs) out.args += c;
      if (s == ValueEnd::kLast) state_ = State::kAfterValue;
      break;
    }
    case State::kAfterValue:
      if (is_space(c)) break;
      if (c == ',') {
        state_ = State::kKey;
        break;
      }
      if (c != '}') return stop();
      raw_ += c;
      end_object(out);
      return true;
  }
  raw_ += c;
  return true;
}

void JsonToolCallReader::end_object(Output& out) {
  status_ = Status::kDone;
  if (committed_) return;
  // Not streamed: decide on the whole object (arguments before the name, or not an object).
  // Bounded: the arguments are dumped below, and a model can write any nesting.
  const auto j = parse_json_bounded(raw_);
  const char* args_key = nullptr;
  if (j.is_object())
    args_key = j.contains("arguments") ? "arguments" : j.contains("parameters") ? "parameters" : nullptr;
  if (!args_key || !j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty()) {
    status_ = Status::kFailed;
    return;
  }
  const auto& a = j[args_key];
  committed_ = true;
  out.begin = true;
  out.name = j["name"].get<std::string>();
  out.args += a.is_string() ? a.get<std::string>() : a.is_null() ? "{}" : a.dump();
}

}  // namespace beluga::recipe
