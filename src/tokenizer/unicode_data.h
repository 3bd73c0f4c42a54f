// Unicode normalization data (generated into unicode_data.cc by gen_unicode_data.py): canonical
// combining classes, full canonical and compatibility decompositions, primary composites, and the
// code points that can make a string change under NFC/NFKC ("attention" sets for the quick check).
#pragma once

#include <cstddef>
#include <cstdint>

namespace beluga::tok::unicode {

struct CccEntry {
  char32_t cp;
  uint8_t ccc;
};
struct DecompEntry {
  char32_t cp;
  uint32_t offset;  // into kDecompPool
  uint32_t len;
};
struct CompositeEntry {
  char32_t first, second, composite;
};
struct Range {
  char32_t lo, hi;  // inclusive
};

extern const char* const kUnicodeVersion;
extern const CccEntry kCcc[];
extern const size_t kCccCount;
extern const DecompEntry kCanonical[];
extern const size_t kCanonicalCount;
extern const DecompEntry kCompat[];
extern const size_t kCompatCount;
extern const char32_t kDecompPool[];
extern const CompositeEntry kComposites[];
extern const size_t kCompositesCount;
extern const Range kNfcAttention[];
extern const size_t kNfcAttentionCount;
extern const Range kNfkcAttention[];
extern const size_t kNfkcAttentionCount;

}  // namespace beluga::tok::unicode
