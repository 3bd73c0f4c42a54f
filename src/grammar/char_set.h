// Sets of Unicode code points (as sorted, disjoint, non-adjacent ranges) and their lowering to the
// byte-level IR, shared by the regex and GBNF front ends: as raw UTF-8 (what a model writes as text)
// or as the canonical spelling inside a JSON string (json_string.h: \" \\ and control escapes, raw
// UTF-8 otherwise), which is how a JSON Schema `pattern` constrains the characters of a string value.
// Surrogates (U+D800..U+DFFF) have no UTF-8 form: sets never contain them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grammar/grammar.h"

namespace beluga::grammar {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

class CharSet {
 public:
  CharSet() = default;
  static CharSet range(uint32_t lo, uint32_t hi) {
    CharSet s;
    s.add(lo, hi);
    return s;
  }
  static CharSet all() { return range(0, kMaxCodePoint); }

  void add(uint32_t lo, uint32_t hi);  // [lo, hi], clipped to valid scalar values
  void add(uint32_t c) { add(c, c); }
  void add(const CharSet& o) {
    for (auto [lo, hi] : o.ranges_) add(lo, hi);
  }
  CharSet complement() const;  // every scalar value not in the set
  bool contains(uint32_t c) const;
  bool empty() const { return ranges_.empty(); }
  const std::vector<std::pair<uint32_t, uint32_t>>& ranges() const { return ranges_; }

 private:
  std::vector<std::pair<uint32_t, uint32_t>> ranges_;
};

// One character of the set, as its UTF-8 bytes.
int utf8_chars(Grammar& g, const CharSet& s);
// One character of the set, as its canonical spelling inside a JSON string.
int json_string_chars(Grammar& g, const CharSet& s);

// Appends the UTF-8 encoding of scalar value c (c <= kMaxCodePoint, not a surrogate).
void append_utf8(std::string& out, uint32_t c);
// Decodes one UTF-8 character of s at i (advancing i); false if the bytes there are not well-formed.
bool decode_utf8(std::string_view s, size_t& i, uint32_t& c);

}  // namespace beluga::grammar
