// The prompt token ids a generation request becomes on a replica, computed as `beluga serve` does
// (the recipe's API adapters, the model's chat encoder and tokenizer; /v1/completions: BOS + text, or
// the ids given), so that their chain hashes are the replica's own prefix-cache keys. The router
// needs the model directory's tokenizer files only, never its weights.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "recipe/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace beluga::router {

enum class GenerationRoute { kChat, kCompletions, kResponses, kMessages };
// The POST routes that generate; null for every other path.
std::optional<GenerationRoute> generation_route(std::string_view path);

class PromptModel {
 public:
  // DIR/tokenizer.json, tokenizer_config.json (chat template), config.json (model type, BOS id).
  static PromptModel from_dir(const std::string& dir);

  // What routing needs from a request body.
  struct Key {
    std::vector<int> tokens;           // empty: the body does not parse (its replica will say why)
    std::string previous_response_id;  // Responses: the stored response it continues
  };
  Key key(GenerationRoute route, std::string_view body) const;

 private:
  PromptModel(tok::Tokenizer t, recipe::ChatEncoder e, int bos)
      : tokenizer_(std::move(t)), encoder_(std::move(e)), bos_(bos) {}
  tok::Tokenizer tokenizer_;
  recipe::ChatEncoder encoder_;
  int bos_ = -1;
};

}  // namespace beluga::router
