#include "tokenizer/tokenizer.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "tokenizer/added_vocab.h"
#include "tokenizer/bpe.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"
#include "util/error.h"
#include "util/file.h"

namespace beluga::tok {

struct Tokenizer::Impl {
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  Bpe bpe;
  AddedVocab added;
  bool has_normalized_added = false;
  size_t vocab_size = 0;
  // Per id: the bytes it decodes to, and flags; filled once so decode is a table walk.
  std::vector<std::string_view> piece;
  std::vector<uint8_t> flags;  // bit 0: added, bit 1: special
};

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::string text = read_file(path);
  try {
    return from_json(text);
  } catch (const Error& e) {
    fail(path, ": ", e.what());
  }
}

Tokenizer Tokenizer::from_json(std::string_view json_text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    fail("tokenizer.json is not valid JSON: ", e.what());
  }
  BELUGA_CHECK(j.is_object() && j.contains("model"), "tokenizer.json: no model");
  auto impl = std::make_shared<Impl>();
  try {
    impl->normalizer = Normalizer::from_json(j.value("normalizer", nlohmann::json()));
    impl->pre_tokenizer = PreTokenizer::from_json(j.value("pre_tokenizer", nlohmann::json()));
    BELUGA_CHECK(impl->pre_tokenizer.byte_level(),
                 "tokenizer.json: only byte-level BPE tokenizers (a ByteLevel pre-tokenizer) are supported");
    const auto& dec = j.value("decoder", nlohmann::json());
    BELUGA_CHECK(dec.is_null() || dec.value("type", std::string()) == "ByteLevel",
                 "tokenizer.json: only the ByteLevel decoder is supported");
    impl->bpe = Bpe::from_json(j["model"]);

    std::vector<AddedToken> added;
    for (const auto& a : j.value("added_tokens", nlohmann::json::array())) {
      AddedToken t;
      t.id = a.at("id").get<int>();
      t.content = a.at("content").get<std::string>();
      BELUGA_CHECK(t.id >= 0 && !t.content.empty(), "tokenizer.json: bad added token '", t.content, "'");
      t.special = a.value("special", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.single_word = a.value("single_word", false);
      t.normalized = a.value("normalized", !t.special);
      // Like Hugging Face, an added token whose content is already a vocabulary entry keeps that id.
      if (int vocab_id = impl->bpe.id_of_spelling(t.content); vocab_id >= 0) t.id = vocab_id;
      impl->has_normalized_added |= t.normalized;
      added.push_back(std::move(t));
    }
    impl->added.build(std::move(added), impl->normalizer);
  } catch (const nlohmann::json::exception& e) {
    fail("tokenizer.json: ", e.what());
  }

  size_t n = impl->bpe.id_limit();
  for (const auto& t : impl->added.tokens()) n = std::max(n, size_t(t.id) + 1);
  impl->vocab_size = n;
  impl->piece.assign(n, {});
  impl->flags.assign(n, 0);
  for (size_t id = 0; id < impl->bpe.id_limit(); ++id)
    if (impl->bpe.has_id(int(id))) impl->piece[id] = impl->bpe.bytes(int(id));
  for (const auto& t : impl->added.tokens()) {
    impl->piece[t.id] = t.content;
    impl->flags[t.id] = 1 | (t.special ? 2 : 0);
  }
  return Tokenizer(std::move(impl));
}

std::vector<int> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int> out;
  out.reserve(text.size() / 3 + 4);
  encode_into(text, allow_special, out);
  return out;
}

void Tokenizer::encode_into(std::string_view text, bool allow_special, std::vector<int>& out) const {
  const Impl& im = *impl_;
  thread_local std::string repaired;
  if (utf8_first_invalid(text) != text.size()) {
    repaired.clear();
    utf8_append_lossy(repaired, text);
    text = repaired;
  }
  auto push_token = [&](const AddedToken& t) { out.push_back(t.id); };
  auto encode_words = [&](std::string_view s) {
    im.pre_tokenizer.split(s, [&](std::string_view word) { im.bpe.encode_word(word, out); });
  };
  // Text between raw-matched added tokens: normalize, then match `normalized` added tokens.
  auto encode_piece = [&](std::string_view piece) {
    thread_local std::string norm_buf;
    std::string_view norm = im.normalizer.apply(piece, norm_buf);
    if (allow_special && im.has_normalized_added) {
      im.added.split(norm, /*normalized_pass=*/true, encode_words, push_token);
    } else {
      encode_words(norm);
    }
  };
  if (allow_special && !im.added.empty()) {
    im.added.split(text, /*normalized_pass=*/false, encode_piece, push_token);
  } else {
    encode_piece(text);
  }
}

std::string Tokenizer::decode(std::span<const int> ids, bool skip_special) const {
  const Impl& im = *impl_;
  std::string bytes;
  for (int id : ids) {
    if (id < 0 || size_t(id) >= im.vocab_size) continue;
    if (skip_special && (im.flags[id] & 2)) continue;
    bytes.append(im.piece[id]);
  }
  if (utf8_first_invalid(bytes) == bytes.size()) return bytes;
  std::string out;
  utf8_append_lossy(out, bytes);
  return out;
}

int Tokenizer::token_id(std::string_view token) const {
  if (const AddedToken* t = impl_->added.find_content(token)) return t->id;
  return impl_->bpe.id_of_spelling(token);
}

std::string_view Tokenizer::token_text(int id) const {
  if (id < 0 || size_t(id) >= impl_->vocab_size) return {};
  if (const AddedToken* t = impl_->added.find_id(id)) return t->content;
  return impl_->bpe.has_id(id) ? std::string_view(impl_->bpe.spelling(id)) : std::string_view();
}

std::string_view Tokenizer::token_bytes(int id) const {
  if (id < 0 || size_t(id) >= impl_->vocab_size) return {};
  return impl_->piece[id];
}

bool Tokenizer::is_special(int id) const {
  return id >= 0 && size_t(id) < impl_->vocab_size && (impl_->flags[id] & 2);
}

bool Tokenizer::is_added(int id) const {
  return id >= 0 && size_t(id) < impl_->vocab_size && (impl_->flags[id] & 1);
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const {
  return impl_->added.tokens();
}

size_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}

}  // namespace beluga::tok
