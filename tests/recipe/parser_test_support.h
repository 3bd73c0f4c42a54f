// Output-parser test helpers: parse a text whole, byte by byte and split in two at every position,
// and check that all ways agree (the parser's split-independence contract); read the folded events.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "recipe/output_parser.h"
#include "test_support.h"

namespace beluga::recipe::test {

using K = ParserEvent::Kind;

struct Result {
  std::vector<ParserEvent> events;  // folded
  FinishReason finish;
  std::string stop;
};

inline bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!n || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

inline Result run(const ParserOptions& o, const std::vector<std::string>& chunks, bool length = false) {
  OutputParser p(o);
  std::vector<ParserEvent> ev;
  for (const auto& c : chunks) p.feed(c, ev);
  FinishReason f = p.finish(length, ev);
  for (const auto& e : ev) EXPECT_TRUE(valid_utf8(e.text)) << "delta splits a UTF-8 character";
  return {fold(ev), f, p.matched_stop()};
}

// Parses `text` whole, byte by byte and split in two at every position; all must agree.
inline Result parse_all_ways(const ParserOptions& o, const std::string& text, bool length = false) {
  Result whole = run(o, {text}, length);
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  Result by_byte = run(o, bytes, length);
  EXPECT_EQ(by_byte.events, whole.events) << "byte-by-byte differs";
  EXPECT_EQ(by_byte.finish, whole.finish);
  for (size_t cut = 1; cut < text.size(); ++cut) {
    Result two = run(o, {text.substr(0, cut), text.substr(cut)}, length);
    EXPECT_EQ(two.events, whole.events) << "split at " << cut;
    EXPECT_EQ(two.finish, whole.finish) << "split at " << cut;
    if (two.events != whole.events) break;
  }
  return whole;
}

inline std::string text_of(const Result& r, K kind) {
  std::string out;
  for (const auto& e : r.events)
    if (e.kind == kind) out += e.text;
  return out;
}

struct Call {
  std::string name;
  nlohmann::json args;  // the arguments text parsed (it must be JSON)
  std::string text;     // the arguments text as streamed
};

// The calls, each begun, given its arguments and ended in order.
inline std::vector<Call> calls_of(const Result& r) {
  std::vector<Call> calls;
  std::vector<bool> ended;
  for (const auto& e : r.events) {
    if (e.kind == K::kToolCallBegin) {
      EXPECT_EQ(e.tool_index, static_cast<int>(calls.size()));
      calls.push_back({e.text, nullptr, ""});
      ended.push_back(false);
    } else if (e.kind == K::kToolCallArgs) {
      EXPECT_FALSE(ended.at(e.tool_index)) << "arguments after the call ended";
      calls.at(e.tool_index).text += e.text;
    } else if (e.kind == K::kToolCallEnd) {
      ended.at(e.tool_index) = true;
      calls.at(e.tool_index).args = nlohmann::json::parse(calls.at(e.tool_index).text);
    }
  }
  for (size_t i = 0; i < ended.size(); ++i) EXPECT_TRUE(ended[i]) << "call " << i << " never ended";
  return calls;
}

}  // namespace beluga::recipe::test
