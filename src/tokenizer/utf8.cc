#include "tokenizer/utf8.h"

#include <cstdint>
#include <cstring>

namespace beluga::tok {

namespace {

// Valid ranges for the second byte, per the lead byte (Unicode Table 3-7); later bytes are 80..BF.
struct LeadInfo {
  uint8_t len;
  uint8_t lo;
  uint8_t hi;
};

LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // excludes surrogates
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // caps at U+10FFFF
  return {0, 0, 0};
}

// How many bytes starting at s[i] form a valid (possibly unfinished) prefix of a sequence, and
// whether that sequence is complete.
size_t valid_run(std::string_view s, size_t i, bool& complete) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  LeadInfo li = lead_info(p[i]);
  complete = false;
  if (li.len == 0) return 0;
  if (li.len == 1) {
    complete = true;
    return 1;
  }
  size_t n = 1;
  while (n < li.len) {
    if (i + n >= s.size()) return n;  // truncated at end of input
    uint8_t c = p[i + n];
    uint8_t lo = n == 1 ? li.lo : 0x80, hi = n == 1 ? li.hi : 0xBF;
    if (c < lo || c > hi) return n;
    ++n;
  }
  complete = true;
  return n;
}

}  // namespace

size_t utf8_valid_prefix_len(std::string_view s, size_t i) {
  bool complete;
  size_t n = valid_run(s, i, complete);
  return complete ? n : 0;
}

char32_t utf8_decode(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  uint8_t b = p[i];
  if (b < 0x80) {
    ++i;
    return b;
  }
  if (b < 0xE0) {
    char32_t cp = (char32_t(b & 0x1F) << 6) | (p[i + 1] & 0x3F);
    i += 2;
    return cp;
  }
  if (b < 0xF0) {
    char32_t cp = (char32_t(b & 0x0F) << 12) | (char32_t(p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F);
    i += 3;
    return cp;
  }
  char32_t cp = (char32_t(b & 0x07) << 18) | (char32_t(p[i + 1] & 0x3F) << 12) |
                (char32_t(p[i + 2] & 0x3F) << 6) | (p[i + 3] & 0x3F);
  i += 4;
  return cp;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t utf8_first_invalid(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t i = 0, n = s.size();
  while (i < n) {
    // ASCII fast path: 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    size_t len = utf8_valid_prefix_len(s, i);
    if (len == 0) return i;
    i += len;
  }
  return n;
}

void utf8_append_lossy(std::string& out, std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t bad = i + utf8_first_invalid(s.substr(i));
    out.append(s.data() + i, bad - i);
    if (bad >= s.size()) break;
    bool complete;
    size_t run = valid_run(s, bad, complete);
    utf8_append(out, kReplacementChar);
    i = bad + (run == 0 ? 1 : run);  // a maximal invalid subpart is replaced as one unit
  }
}

size_t utf8_complete_prefix(std::string_view s, size_t& incomplete) {
  incomplete = 0;
  // Only the last up-to-3 bytes can be an unfinished sequence; look back for its lead byte.
  size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    auto b = static_cast<uint8_t>(s[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    if (b >= 0xC2 && b <= 0xF4) {
      bool complete;
      size_t run = valid_run(s, n - back, complete);
      if (!complete && run == back) incomplete = back;
    }
    break;
  }
  return n - incomplete;
}

}  // namespace beluga::tok
