// Prompt: an encoded conversation as a list of segments, each a control token or plain text.
// Control tokens are looked up by id; text is tokenized with special-token matching off, so text that
// spells `<｜User｜>` can never become the control token. Adjacent text segments merge, so the ids of
// a prompt equal the ids of its text tokenized in one piece wherever no control token intervenes.
#pragma once

#include <concepts>
#include <string>
#include <string_view>
#include <vector>

#include "util/error.h"

namespace beluga::recipe {

// What a Prompt needs from a tokenizer (beluga::tok::Tokenizer has it): the id of one vocabulary
// entry (negative or an exception when absent) and plain-text encoding.
template <typename T>
concept PromptTokenizer = requires(const T& t, std::string_view s) {
  { t.token_id(s) } -> std::convertible_to<int>;
  { t.encode(s, false) } -> std::convertible_to<std::vector<int>>;
};

struct Segment {
  bool control = false;
  std::string text;       // the token's spelling when control
  bool optional = false;  // control token that falls back to plain text when the vocabulary lacks it
  bool operator==(const Segment&) const = default;
};

class Prompt {
 public:
  void text(std::string_view s);
  void control(std::string_view token);
  // A control token some vocabularies of the family lack (`<think>`, `｜DSML｜`): plain text there.
  void optional_control(std::string_view token);

  const std::vector<Segment>& segments() const { return segments_; }
  // The prompt as one string (what a Jinja renderer or the reference encoders print).
  std::string str() const;
  // Token ids; a control token missing from the vocabulary is an error naming it (an optional one
  // falls back to text).
  template <PromptTokenizer Tok>
  std::vector<int> ids(const Tok& tokenizer) const;

 private:
  std::vector<Segment> segments_;
};

template <PromptTokenizer Tok>
std::vector<int> Prompt::ids(const Tok& tokenizer) const {
  std::vector<int> out;
  for (const auto& s : segments_) {
    if (s.control) {
      int id = -1;
      try {
        id = tokenizer.token_id(s.text);
      } catch (const Error&) {
        id = -1;  // absent from the vocabulary
      }
      if (id >= 0) {
        out.push_back(id);
        continue;
      }
      BELUGA_CHECK(s.optional, "the tokenizer has no token ", s.text, " that this chat format needs");
    }
    std::vector<int> ids = tokenizer.encode(s.text, /*allow_special=*/false);
    out.insert(out.end(), ids.begin(), ids.end());
  }
  return out;
}

}  // namespace beluga::recipe
