#include "tokenizer/byte_level.h"

#include <cstdint>

#include "tokenizer/utf8.h"

namespace beluga::tok {

namespace {

bool printable(unsigned b) {
  return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
}

constexpr char32_t kAlphabetEnd = 256 + 68;  // 68 non-printable bytes are numbered from U+0100

struct Tables {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, kAlphabetEnd> to_byte{};  // -1 where a character is not in the alphabet
  Tables() {
    to_byte.fill(-1);
    unsigned next = 0;
    for (unsigned b = 0; b < 256; ++b) {
      to_char[b] = printable(b) ? b : 256 + next++;
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t byte_to_char(unsigned char b) {
  return tables().to_char[b];
}

std::optional<unsigned char> char_to_byte(char32_t c) {
  if (c >= kAlphabetEnd || tables().to_byte[c] < 0) return std::nullopt;
  return static_cast<unsigned char>(tables().to_byte[c]);
}

std::optional<std::string> byte_level_decode(std::string_view token) {
  std::string out;
  size_t i = 0;
  while (i < token.size()) {
    if (utf8_valid_prefix_len(token, i) == 0) return std::nullopt;
    auto b = char_to_byte(utf8_decode(token, i));
    if (!b) return std::nullopt;
    out.push_back(static_cast<char>(*b));
  }
  return out;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) utf8_append(out, byte_to_char(b));
  return out;
}

}  // namespace beluga::tok
