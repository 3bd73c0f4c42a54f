#include "tokenizer/pre_tokenizer.h"

#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/utf8.h"
#include "util/error.h"

namespace beluga::tok {

namespace {

// GPT-2's pattern, used by ByteLevel when `use_regex` is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

constexpr size_t kMaxStages = 16;

SplitBehavior parse_behavior(const std::string& s) {
  if (s == "Removed") return SplitBehavior::kRemoved;
  if (s == "Isolated") return SplitBehavior::kIsolated;
  if (s == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (s == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (s == "Contiguous") return SplitBehavior::kContiguous;
  fail("tokenizer pre_tokenizer: unknown split behavior '", s, "'");
}

struct Span {
  size_t begin, end;
  bool is_match;
};

// Turns the stream of (gap | match) spans of one piece into the pieces a split behaviour produces,
// exactly as Hugging Face's NormalizedString::split does, but one span at a time.
class BehaviorFolder {
 public:
  BehaviorFolder(SplitBehavior b, std::string_view text, FunctionRef<void(std::string_view)> emit)
      : b_(b), text_(text), emit_(emit) {}

  void push(Span s) {
    switch (b_) {
      case SplitBehavior::kIsolated:
        out(s.begin, s.end);
        break;
      case SplitBehavior::kRemoved:
        if (!s.is_match) out(s.begin, s.end);
        break;
      case SplitBehavior::kContiguous:
        if (held_ && held_match_ == s.is_match) {
          held_end_ = s.end;
        } else {
          flush();
          hold(s);
        }
        break;
      case SplitBehavior::kMergedWithPrevious:
        // A match right after a gap joins that gap; any other span starts a new piece.
        if (held_ && s.is_match && !held_match_) {
          held_end_ = s.end;
          held_match_ = true;
        } else {
          flush();
          hold(s);
        }
        break;
      case SplitBehavior::kMergedWithNext:
        // A match right before a gap joins that gap.
        if (held_ && held_match_ && !s.is_match && !held_merged_) {
          held_end_ = s.end;
          held_merged_ = true;
          held_match_ = false;
        } else {
          flush();
          hold(s);
        }
        break;
    }
  }
  void finish() { flush(); }

 private:
  void out(size_t b, size_t e) {
    if (e > b) emit_(text_.substr(b, e - b));
  }
  void hold(Span s) {
    held_ = true;
    held_begin_ = s.begin;
    held_end_ = s.end;
    held_match_ = s.is_match;
    held_merged_ = false;
  }
  void flush() {
    if (held_) out(held_begin_, held_end_);
    held_ = false;
  }

  SplitBehavior b_;
  std::string_view text_;
  FunctionRef<void(std::string_view)> emit_;
  bool held_ = false, held_match_ = false, held_merged_ = false;
  size_t held_begin_ = 0, held_end_ = 0;
};

}  // namespace

void PreTokenizer::add(const nlohmann::json& j) {
  BELUGA_CHECK(j.is_object() && j.contains("type"),
               "tokenizer pre_tokenizer: expected an object with a type");
  std::string type = j["type"].get<std::string>();
  if (type == "Sequence") {
    for (const auto& sub : j.at("pretokenizers")) add(sub);
  } else if (type == "Split") {
    const auto& pat = j.at("pattern");
    Stage s;
    if (pat.contains("Regex")) {
      s.regex = std::make_shared<Regex>(pat["Regex"].get<std::string>());
    } else {
      BELUGA_CHECK(pat.contains("String"), "tokenizer Split pattern must be Regex or String");
      s.regex = std::make_shared<Regex>(pat["String"].get<std::string>(), /*literal=*/true);
    }
    s.behavior = parse_behavior(j.at("behavior").get<std::string>());
    s.invert = j.value("invert", false);
    stages_.push_back(std::move(s));
  } else if (type == "ByteLevel") {
    byte_level_ = true;
    Stage s;
    s.add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) s.regex = std::make_shared<Regex>(kGpt2Pattern);
    if (s.regex || s.add_prefix_space) stages_.push_back(std::move(s));
  } else if (type == "Digits") {
    Stage s;
    // Rust's char::is_numeric is the N category; runs are one piece unless individual_digits.
    s.regex = std::make_shared<Regex>(j.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+");
    stages_.push_back(std::move(s));
  } else {
    fail("tokenizer pre_tokenizer type '", type,
         "' is not supported (supported: Sequence, Split, ByteLevel, Digits)");
  }
  BELUGA_CHECK(stages_.size() <= kMaxStages, "tokenizer pre_tokenizer: more than ", kMaxStages, " stages");
}

PreTokenizer PreTokenizer::from_json(const nlohmann::json& j) {
  PreTokenizer p;
  if (!j.is_null()) p.add(j);
  return p;
}

void PreTokenizer::split(std::string_view text, FunctionRef<void(std::string_view)> on_word) const {
  if (!text.empty()) run(0, text, on_word);
}

void PreTokenizer::run(size_t k, std::string_view piece, FunctionRef<void(std::string_view)> on_word) const {
  if (k == stages_.size()) {
    on_word(piece);
    return;
  }
  const Stage& st = stages_[k];
  // One buffer per depth: a prefixed piece stays alive while deeper stages look at it.
  thread_local std::string prefixed[kMaxStages];
  if (st.add_prefix_space && piece[0] != ' ') {
    prefixed[k].assign(1, ' ');
    prefixed[k].append(piece);
    piece = prefixed[k];
  }
  if (!st.regex) {
    run(k + 1, piece, on_word);
    return;
  }
  auto next = [&](std::string_view sub) { run(k + 1, sub, on_word); };
  BehaviorFolder fold(st.behavior, piece, next);
  size_t pos = 0, prev = 0, mb, me;
  while (pos <= piece.size() && st.regex->find(piece, pos, mb, me)) {
    if (me == mb) {
      // An empty match splits nothing; step over one character, as Oniguruma's iterator does.
      if (mb >= piece.size()) break;
      size_t len = utf8_valid_prefix_len(piece, mb);
      pos = mb + (len ? len : 1);
      continue;
    }
    if (mb > prev) fold.push({prev, mb, st.invert});
    fold.push({mb, me, !st.invert});
    prev = pos = me;
  }
  if (prev < piece.size()) fold.push({prev, piece.size(), st.invert});
  fold.finish();
}

}  // namespace beluga::tok
