#include "grammar/char_set.h"

#include <algorithm>
#include <string>
#include <string_view>

namespace beluga::grammar {

namespace {

constexpr uint32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;

// The byte-range sequences of UTF-8 encodings of [lo, hi] (one encoded length, no surrogates): split
// until every piece is a product of per-byte ranges (the construction of Rust's utf8-ranges).
void utf8_pieces(Grammar& g, uint32_t lo, uint32_t hi, std::vector<int>& out) {
  static constexpr uint32_t kLenMax[] = {0x7F, 0x7FF, 0xFFFF, kMaxCodePoint};
  for (uint32_t m : kLenMax)
    if (lo <= m && hi > m) {
      utf8_pieces(g, lo, m, out);
      utf8_pieces(g, m + 1, hi, out);
      return;
    }
  if (hi <= 0x7F) {
    out.push_back(g.bytes(ByteSet::range(lo, hi)));
    return;
  }
  std::string a, b;
  append_utf8(a, lo);
  append_utf8(b, hi);
  size_t n = a.size();
  for (size_t i = 1; i < n; ++i) {
    uint32_t m = (uint32_t(1) << (6 * i)) - 1;  // the low i continuation bytes
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_pieces(g, lo, lo | m, out);
        utf8_pieces(g, (lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_pieces(g, lo, (hi & ~m) - 1, out);
        utf8_pieces(g, hi & ~m, hi, out);
        return;
      }
    }
  }
  std::vector<int> seq;
  for (size_t i = 0; i < n; ++i) seq.push_back(g.bytes(ByteSet::range(uint8_t(a[i]), uint8_t(b[i]))));
  out.push_back(g.seq(std::move(seq)));
}

// The characters a JSON string cannot hold raw: their one canonical escape each.
bool json_escaped(uint32_t c) {
  return c < 0x20 || c == '"' || c == '\\';
}
std::string json_escape(uint32_t c) {
  switch (c) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
  }
  static const char* hex = "0123456789abcdef";
  return std::string("\\u00") + hex[c >> 4] + hex[c & 15];
}

}  // namespace

void CharSet::add(uint32_t lo, uint32_t hi) {
  hi = std::min(hi, kMaxCodePoint);
  if (lo > hi) return;
  if (lo <= kSurrogateHi && hi >= kSurrogateLo) {  // cut the surrogates out
    if (lo < kSurrogateLo) add(lo, kSurrogateLo - 1);
    if (hi > kSurrogateHi) add(kSurrogateHi + 1, hi);
    return;
  }
  // Insert, then merge overlapping or adjacent ranges.
  auto it = std::lower_bound(ranges_.begin(), ranges_.end(), std::make_pair(lo, hi));
  it = ranges_.insert(it, {lo, hi});
  size_t i = size_t(it - ranges_.begin());
  if (i > 0) --i;
  std::vector<std::pair<uint32_t, uint32_t>> merged(ranges_.begin(), ranges_.begin() + long(i));
  for (size_t j = i; j < ranges_.size(); ++j) {
    auto r = ranges_[j];
    if (!merged.empty() && r.first <= merged.back().second + 1)
      merged.back().second = std::max(merged.back().second, r.second);
    else
      merged.push_back(r);
  }
  ranges_ = std::move(merged);
}

CharSet CharSet::complement() const {
  CharSet out;
  uint32_t next = 0;
  for (auto [lo, hi] : ranges_) {
    if (lo > next) out.add(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.add(next, kMaxCodePoint);
  return out;
}

bool CharSet::contains(uint32_t c) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), std::make_pair(c, kMaxCodePoint + 1));
  return it != ranges_.begin() && std::prev(it)->second >= c;
}

int utf8_chars(Grammar& g, const CharSet& s) {
  std::vector<int> alts;
  for (auto [lo, hi] : s.ranges()) utf8_pieces(g, lo, hi, alts);
  return g.choice(std::move(alts));
}

int json_string_chars(Grammar& g, const CharSet& s) {
  std::vector<int> alts;
  for (auto [lo, hi] : s.ranges())
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x5C); ++c)
      if (json_escaped(c)) alts.push_back(g.literal(json_escape(c)));
  CharSet plain;
  for (auto [lo, hi] : s.ranges()) {
    // Drop the escaped characters (below 0x20, '"', '\\') from the raw part.
    uint32_t a = std::max<uint32_t>(lo, 0x20);
    for (uint32_t c : {uint32_t('"'), uint32_t('\\')}) {
      if (a <= c && c <= hi) {
        if (a < c) plain.add(a, c - 1);
        a = c + 1;
      }
    }
    if (a <= hi) plain.add(a, hi);
  }
  if (!plain.empty()) alts.push_back(utf8_chars(g, plain));
  return g.choice(std::move(alts));
}

void append_utf8(std::string& out, uint32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

bool decode_utf8(std::string_view s, size_t& i, uint32_t& c) {
  auto b = [&](size_t k) { return uint8_t(s[k]); };
  uint8_t b0 = b(i);
  size_t n;
  uint32_t min;
  if (b0 < 0x80) {
    c = b0;
    ++i;
    return true;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2, c = b0 & 0x1F, min = 0x80;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3, c = b0 & 0x0F, min = 0x800;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4, c = b0 & 0x07, min = 0x10000;
  } else {
    return false;
  }
  if (i + n > s.size()) return false;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return false;
    c = (c << 6) | (b(i + k) & 0x3F);
  }
  if (c < min || c > kMaxCodePoint || (c >= kSurrogateLo && c <= kSurrogateHi)) return false;
  i += n;
  return true;
}

}  // namespace beluga::grammar
