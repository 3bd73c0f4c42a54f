#include "tokenizer/normalizer.h"

#include <algorithm>
#include <cstdint>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "tokenizer/unicode_data.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace beluga::tok {

namespace {

constexpr char32_t kMaxCp = 0x110000;

// Hangul syllables compose and decompose algorithmically (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

struct Decomp {
  uint32_t offset, len;
};

// Lookup structures built once from the generated arrays.
struct Tables {
  std::vector<uint8_t> ccc;  // indexed by code point; flat because it is hit for every slow-path char
  std::unordered_map<char32_t, Decomp> canonical, compat;
  std::unordered_map<uint64_t, char32_t> compose;
  std::vector<uint64_t> nfc_attention, nfkc_attention;  // bitsets over code points

  Tables() : ccc(kMaxCp, 0), nfc_attention(kMaxCp / 64, 0), nfkc_attention(kMaxCp / 64, 0) {
    using namespace unicode;
    for (size_t i = 0; i < kCccCount; ++i) ccc[kCcc[i].cp] = kCcc[i].ccc;
    for (size_t i = 0; i < kCanonicalCount; ++i)
      canonical[kCanonical[i].cp] = {kCanonical[i].offset, kCanonical[i].len};
    for (size_t i = 0; i < kCompatCount; ++i) compat[kCompat[i].cp] = {kCompat[i].offset, kCompat[i].len};
    for (size_t i = 0; i < kCompositesCount; ++i)
      compose[key(kComposites[i].first, kComposites[i].second)] = kComposites[i].composite;
    fill(nfc_attention, kNfcAttention, kNfcAttentionCount);
    fill(nfkc_attention, kNfkcAttention, kNfkcAttentionCount);
  }
  static uint64_t key(char32_t a, char32_t b) { return (uint64_t(a) << 32) | b; }
  static void fill(std::vector<uint64_t>& bits, const unicode::Range* r, size_t n) {
    for (size_t i = 0; i < n; ++i)
      for (char32_t c = r[i].lo; c <= r[i].hi; ++c) bits[c >> 6] |= uint64_t(1) << (c & 63);
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

bool compatibility(NormalForm f) {
  return f == NormalForm::kNFKC || f == NormalForm::kNFKD;
}
bool composing(NormalForm f) {
  return f == NormalForm::kNFC || f == NormalForm::kNFKC;
}

void decompose(const Tables& t, NormalForm form, char32_t cp, std::vector<char32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    char32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  const auto& map = compatibility(form) ? t.compat : t.canonical;
  auto it = map.find(cp);
  if (it == map.end()) {
    out.push_back(cp);
    return;
  }
  // Stored decompositions are already full (recursively applied).
  out.insert(out.end(), unicode::kDecompPool + it->second.offset,
             unicode::kDecompPool + it->second.offset + it->second.len);
}

// Canonical ordering: stable sort of each run of non-starters by combining class.
void reorder(const Tables& t, std::vector<char32_t>& s) {
  size_t i = 0;
  while (i < s.size()) {
    if (t.ccc[s[i]] == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < s.size() && t.ccc[s[j]] != 0) ++j;
    std::stable_sort(s.begin() + i, s.begin() + j,
                     [&](char32_t a, char32_t b) { return t.ccc[a] < t.ccc[b]; });
    i = j;
  }
}

char32_t compose_pair(const Tables& t, char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  auto it = t.compose.find(Tables::key(a, b));
  return it == t.compose.end() ? 0 : it->second;
}

// Canonical composition (UAX #15, section 1.3), in place.
void compose(const Tables& t, std::vector<char32_t>& s) {
  if (s.empty()) return;
  size_t out = 1, starter = 0;
  bool have_starter = t.ccc[s[0]] == 0;
  int last_class = have_starter ? 0 : 256;
  for (size_t i = 1; i < s.size(); ++i) {
    char32_t ch = s[i];
    int cls = t.ccc[ch];
    if (have_starter && (last_class < cls || last_class == 0)) {
      // last_class == 0 means the previous character is the starter itself (adjacent pair).
      if (char32_t c = compose_pair(t, s[starter], ch)) {
        s[starter] = c;
        continue;
      }
    }
    if (cls == 0) {
      starter = out;
      have_starter = true;
    }
    last_class = cls;
    s[out++] = ch;
  }
  s.resize(out);
}

}  // namespace

bool quick_check(NormalForm form, std::string_view in) {
  const Tables& t = tables();
  const auto& bits = compatibility(form) ? t.nfkc_attention : t.nfc_attention;
  bool decomposing = !composing(form);
  size_t i = 0;
  while (i < in.size()) {
    if (static_cast<unsigned char>(in[i]) < 0x80) {
      ++i;  // ASCII never changes under any normal form
      continue;
    }
    char32_t cp = utf8_decode(in, i);
    if (bits[cp >> 6] >> (cp & 63) & 1) return false;
    if (decomposing) {
      // NFC-stable characters may still decompose (é); NFD needs every decomposable one handled.
      if ((cp >= kSBase && cp < kSBase + kSCount) || (compatibility(form) ? t.compat : t.canonical).count(cp))
        return false;
    }
  }
  return true;
}

void normalize_into(NormalForm form, std::string_view in, std::string& out) {
  const Tables& t = tables();
  thread_local std::vector<char32_t> cps;
  cps.clear();
  size_t i = 0;
  while (i < in.size()) decompose(t, form, utf8_decode(in, i), cps);
  reorder(t, cps);
  if (composing(form)) compose(t, cps);
  out.clear();
  out.reserve(in.size() + in.size() / 4);
  for (char32_t c : cps) utf8_append(out, c);
}

Normalizer Normalizer::from_json(const nlohmann::json& j) {
  Normalizer n;
  if (j.is_null()) return n;
  BELUGA_CHECK(j.is_object() && j.contains("type"), "tokenizer normalizer: expected an object with a type");
  std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    for (const auto& sub : j.at("normalizers")) {
      Normalizer s = from_json(sub);
      n.steps_.insert(n.steps_.end(), s.steps_.begin(), s.steps_.end());
    }
  } else if (type == "NFC") {
    n.steps_.push_back(NormalForm::kNFC);
  } else if (type == "NFKC") {
    n.steps_.push_back(NormalForm::kNFKC);
  } else if (type == "NFD") {
    n.steps_.push_back(NormalForm::kNFD);
  } else if (type == "NFKD") {
    n.steps_.push_back(NormalForm::kNFKD);
  } else {
    fail("tokenizer normalizer type '", type,
         "' is not supported (supported: NFC, NFKC, NFD, NFKD, Sequence)");
  }
  return n;
}

std::string_view Normalizer::apply(std::string_view in, std::string& buf) const {
  std::string_view cur = in;
  thread_local std::string tmp;
  for (NormalForm f : steps_) {
    if (quick_check(f, cur)) continue;
    normalize_into(f, cur, tmp);
    buf.swap(tmp);
    cur = buf;
  }
  return cur;
}

}  // namespace beluga::tok
