// UTF-8 helpers for the tokenizer: decoding one code point, validation, and lossy repair.
// Repair follows the WHATWG / Rust `from_utf8_lossy` rule (each maximal invalid subpart becomes one
// U+FFFD), so text we repair matches what a JavaScript or Rust peer would see for the same bytes.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace beluga::tok {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Length of the valid UTF-8 sequence starting at s[i], or 0 if the bytes there are not a complete,
// valid sequence (truncated, overlong, surrogate, > U+10FFFF, or a stray continuation byte).
size_t utf8_valid_prefix_len(std::string_view s, size_t i);

// Decodes the code point at s[i] (which must start a valid sequence) and advances i past it.
char32_t utf8_decode(std::string_view s, size_t& i);

void utf8_append(std::string& out, char32_t cp);

// Offset of the first invalid byte, or s.size() if s is entirely valid UTF-8.
size_t utf8_first_invalid(std::string_view s);

// Appends s to out with every maximal invalid subpart replaced by U+FFFD.
void utf8_append_lossy(std::string& out, std::string_view s);

// Length of the longest prefix of s that is valid UTF-8 except possibly for an incomplete (but so
// far valid) sequence at the very end; `incomplete` receives the length of that unfinished tail.
size_t utf8_complete_prefix(std::string_view s, size_t& incomplete);

}  // namespace beluga::tok
