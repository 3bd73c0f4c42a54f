// GPT-2 byte-level alphabet: every byte 0..255 is spelled as one printable Unicode character in
// vocabulary strings (printable Latin-1 bytes as themselves, the rest as U+0100 + n). Byte-level BPE
// vocabularies are stored in this spelling; Beluga converts them to raw bytes once, at load time.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace beluga::tok {

// The character that spells byte b.
char32_t byte_to_char(unsigned char b);

// The byte a character spells, or nullopt if it is not one of the 256 alphabet characters.
std::optional<unsigned char> char_to_byte(char32_t c);

// Raw bytes of a vocabulary string, or nullopt if some character is outside the alphabet.
std::optional<std::string> byte_level_decode(std::string_view token);

// The vocabulary spelling of raw bytes.
std::string byte_level_encode(std::string_view bytes);

}  // namespace beluga::tok
