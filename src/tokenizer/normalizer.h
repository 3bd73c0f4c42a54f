// Unicode normalizers declared by a tokenizer.json (`NFC`, `NFKC`, `NFD`, `NFKD`, and `Sequence`s of
// them). Text that is already normalized (the common case) is detected by a quick check and returned
// without copying; only text containing code points that can change goes through the full
// decompose / reorder / compose algorithm of UAX #15.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace beluga::tok {

enum class NormalForm { kNFC, kNFKC, kNFD, kNFKD };

// Normalizes valid UTF-8 `in` into `out` (replacing its contents).
void normalize_into(NormalForm form, std::string_view in, std::string& out);

// True if `in` (valid UTF-8) certainly equals its `form` normalization.
bool quick_check(NormalForm form, std::string_view in);

class Normalizer {
 public:
  Normalizer() = default;
  // Parses the `normalizer` object of tokenizer.json (null means none); throws on unsupported types.
  static Normalizer from_json(const nlohmann::json& j);

  bool is_identity() const { return steps_.empty(); }

  // The normalized text: `in` itself when nothing changes, else a view of `buf` (which it overwrites).
  std::string_view apply(std::string_view in, std::string& buf) const;

 private:
  std::vector<NormalForm> steps_;
};

}  // namespace beluga::tok
