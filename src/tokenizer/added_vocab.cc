#include "tokenizer/added_vocab.h"

#include <algorithm>

#include "tokenizer/normalizer.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace beluga::tok {

namespace {

// Rust's char::is_whitespace: the Unicode White_Space property.
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// Start of the run of whitespace that ends s (s.size() if none).
size_t trailing_space_start(std::string_view s) {
  size_t i = s.size();
  while (i > 0) {
    size_t j = i - 1;
    while (j > 0 && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) --j;
    size_t k = j;
    if (!is_white_space(utf8_decode(s, k))) break;
    i = j;
  }
  return i;
}

size_t leading_space_len(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t k = i;
    if (!is_white_space(utf8_decode(s, k))) break;
    i = k;
  }
  return i;
}

// Rust regex's Unicode \w (used by Hugging Face for single_word), close enough via PCRE2 properties.
bool word_char_at_edge(std::string_view s, bool at_end) {
  static const Regex start_word("^[\\p{L}\\p{M}\\p{N}\\p{Pc}]");
  static const Regex end_word("[\\p{L}\\p{M}\\p{N}\\p{Pc}]$");
  size_t b, e;
  return !s.empty() && (at_end ? end_word : start_word).find(s, 0, b, e);
}

}  // namespace

void AddedVocab::Trie::add(std::string_view key, int token) {
  if (key.empty()) return;
  first[static_cast<unsigned char>(key[0])] = true;
  int n = 0;
  for (unsigned char c : key) {
    auto& edges = nodes[n].next;
    auto it = std::lower_bound(edges.begin(), edges.end(), std::make_pair(c, 0),
                               [](const auto& a, const auto& b) { return a.first < b.first; });
    if (it != edges.end() && it->first == c) {
      n = it->second;
    } else {
      int child = static_cast<int>(nodes.size());
      edges.insert(it, {c, child});
      nodes.emplace_back();  // may reallocate: `edges` is not used after this
      n = child;
    }
  }
  if (nodes[n].token < 0) nodes[n].token = token;  // first declaration of a duplicate wins
}

std::pair<int, size_t> AddedVocab::Trie::longest(std::string_view text, size_t i) const {
  int n = 0, best = -1;
  size_t best_len = 0;
  for (size_t j = i; j < text.size(); ++j) {
    auto c = static_cast<unsigned char>(text[j]);
    const auto& edges = nodes[n].next;
    auto it = std::lower_bound(edges.begin(), edges.end(), std::make_pair(c, 0),
                               [](const auto& a, const auto& b) { return a.first < b.first; });
    if (it == edges.end() || it->first != c) break;
    n = it->second;
    if (nodes[n].token >= 0) {
      best = nodes[n].token;
      best_len = j + 1 - i;
    }
  }
  return {best, best_len};
}

void AddedVocab::build(std::vector<AddedToken> tokens, const Normalizer& norm) {
  tokens_ = std::move(tokens);
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& t = tokens_[i];
    by_id_.emplace(t.id, i);
    by_content_.emplace(t.content, i);
    if (t.normalized) {
      std::string buf;
      normalized_.add(norm.apply(t.content, buf), static_cast<int>(i));
    } else {
      raw_.add(t.content, static_cast<int>(i));
    }
  }
}

const AddedToken* AddedVocab::find_id(int id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const AddedToken* AddedVocab::find_content(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

void AddedVocab::split(std::string_view text, bool normalized_pass,
                       FunctionRef<void(std::string_view)> on_text,
                       FunctionRef<void(const AddedToken&)> on_token) const {
  const Trie& trie = normalized_pass ? normalized_ : raw_;
  size_t emitted = 0;  // end of what has been handed out
  size_t i = 0;
  while (i < text.size()) {
    if (!trie.first[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    auto [tok, len] = trie.longest(text, i);
    if (tok < 0) {
      ++i;
      continue;
    }
    const AddedToken& t = tokens_[tok];
    size_t start = i, stop = i + len;
    i = stop;  // the matcher resumes after the match even when the match is rejected or widened
    if (t.single_word &&
        (word_char_at_edge(text.substr(0, start), true) || word_char_at_edge(text.substr(stop), false)))
      continue;
    if (t.lstrip) start = std::max(trailing_space_start(text.substr(0, start)), emitted);
    if (t.rstrip) stop += leading_space_len(text.substr(stop));
    if (start > emitted) on_text(text.substr(emitted, start - emitted));
    on_token(t);
    emitted = stop;
    i = std::max(i, stop);
  }
  if (emitted < text.size()) on_text(text.substr(emitted));
}

}  // namespace beluga::tok
