// Unicode normalization (UAX #15) on known cases: composition, decomposition, canonical ordering,
// compatibility mappings, Hangul, and the quick check that lets normalized text through untouched.
#include "tokenizer/normalizer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace beluga::tok {
namespace {

std::string norm(NormalForm f, const std::string& s) {
  std::string out;
  normalize_into(f, s, out);
  return out;
}

TEST(Normalizer, ComposeAndDecompose) {
  EXPECT_EQ(norm(NormalForm::kNFC, "e\xCC\x81"), "\xC3\xA9");  // e + acute -> é
  EXPECT_EQ(norm(NormalForm::kNFD, "\xC3\xA9"), "e\xCC\x81");
  EXPECT_EQ(norm(NormalForm::kNFC, "\xE2\x84\xAB"), "\xC3\x85");      // Angstrom sign -> Å (singleton)
  EXPECT_EQ(norm(NormalForm::kNFKC, "\xEF\xAC\x81"), "fi");           // ﬁ ligature
  EXPECT_EQ(norm(NormalForm::kNFC, "\xEF\xAC\x81"), "\xEF\xAC\x81");  // NFC keeps compatibility characters
  EXPECT_EQ(norm(NormalForm::kNFKC, "\xE2\x91\xA0"), "1");            // ①
  EXPECT_EQ(norm(NormalForm::kNFKD, "\xC2\xB2"), "2");                // ²
}

TEST(Normalizer, CanonicalOrderingThenComposition) {
  // a + circumflex (230) + dot below (220): reordered to dot below first, then composed to ậ.
  EXPECT_EQ(norm(NormalForm::kNFC, "a\xCC\x82\xCC\xA3"), "\xE1\xBA\xAD");
  EXPECT_EQ(norm(NormalForm::kNFD, "a\xCC\x82\xCC\xA3"), "a\xCC\xA3\xCC\x82");
  // A blocked mark stays separate: acute after a same-class grave cannot compose with the base.
  EXPECT_EQ(norm(NormalForm::kNFC, "a\xCC\x80\xCC\x81"), "\xC3\xA0\xCC\x81");
}

TEST(Normalizer, Hangul) {
  EXPECT_EQ(norm(NormalForm::kNFC, "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"),
            "\xEA\xB0\x81");  // ᄀ+ᅡ+ᆨ -> 각
  EXPECT_EQ(norm(NormalForm::kNFD, "\xEA\xB0\x81"), "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8");
}

TEST(Normalizer, QuickCheckAndPassThrough) {
  EXPECT_TRUE(quick_check(NormalForm::kNFC, "plain ascii"));
  EXPECT_TRUE(quick_check(NormalForm::kNFC, "\xC3\xA9\xE4\xB8\xAD"));  // é 中 are NFC
  EXPECT_FALSE(quick_check(NormalForm::kNFD, "\xC3\xA9"));
  EXPECT_FALSE(quick_check(NormalForm::kNFC, "e\xCC\x81"));
  EXPECT_FALSE(quick_check(NormalForm::kNFKC, "\xEF\xAC\x81"));
  auto n = Normalizer::from_json(nlohmann::json{{"type", "NFC"}});
  std::string buf;
  std::string text = "already normalized \xC3\xA9";
  std::string_view out = n.apply(text, buf);
  EXPECT_EQ(out.data(), text.data()) << "normalized text must not be copied";
  EXPECT_EQ(n.apply("e\xCC\x81", buf), "\xC3\xA9");
}

TEST(Normalizer, UnsupportedTypeIsAnError) {
  EXPECT_THROW(Normalizer::from_json(nlohmann::json{{"type", "Lowercase"}}), std::exception);
  EXPECT_TRUE(Normalizer::from_json(nlohmann::json()).is_identity());
  EXPECT_TRUE(
      Normalizer::from_json(nlohmann::json{{"type", "Sequence"}, {"normalizers", nlohmann::json::array()}})
          .is_identity());
}

}  // namespace
}  // namespace beluga::tok
