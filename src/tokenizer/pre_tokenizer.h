// The pre-tokenizer of a tokenizer.json: splits normalized text into words that BPE encodes one at a
// time. Supports `Sequence`, `Split` (regex or string pattern, all five split behaviours, invert),
// `ByteLevel` (optional GPT-2 regex and prefix space) and `Digits`. Stages run depth-first and hand
// each finished word straight to the caller, so no list of pieces is ever materialized.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/function_ref.h"
#include "tokenizer/regex.h"

namespace beluga::tok {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  PreTokenizer() = default;
  // Parses the `pre_tokenizer` object (null means none); throws on unsupported types.
  static PreTokenizer from_json(const nlohmann::json& j);

  // True if a ByteLevel step is present, i.e. words are to be read as raw bytes by byte-level BPE.
  bool byte_level() const { return byte_level_; }

  // Calls on_word for each non-empty word of text, in order. The views are valid during the call.
  void split(std::string_view text, FunctionRef<void(std::string_view)> on_word) const;

 private:
  struct Stage {
    std::shared_ptr<const Regex> regex;  // null for a ByteLevel stage without regex
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;
  };
  void add(const nlohmann::json& j);
  void run(size_t stage, std::string_view piece, FunctionRef<void(std::string_view)> on_word) const;

  std::vector<Stage> stages_;
  bool byte_level_ = false;
};

}  // namespace beluga::tok
