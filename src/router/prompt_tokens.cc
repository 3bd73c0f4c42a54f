#include "router/prompt_tokens.h"

#include <nlohmann/json.hpp>

#include "recipe/json_depth.h"
#include "recipe/request.h"
#include "util/error.h"
#include "util/file.h"

namespace beluga::router {

using Json = nlohmann::ordered_json;

std::optional<GenerationRoute> generation_route(std::string_view path) {
  if (path == "/v1/chat/completions") return GenerationRoute::kChat;
  if (path == "/v1/completions") return GenerationRoute::kCompletions;
  if (path == "/v1/responses") return GenerationRoute::kResponses;
  if (path == "/v1/messages") return GenerationRoute::kMessages;
  return std::nullopt;
}

PromptModel PromptModel::from_dir(const std::string& dir) {
  BELUGA_CHECK(file_exists(dir + "/tokenizer.json"), "--model ", dir, ": no tokenizer.json there");
  int bos = -1;
  if (file_exists(dir + "/config.json")) {
    auto cfg = nlohmann::json::parse(read_file(dir + "/config.json"), nullptr, false);
    if (cfg.is_object() && cfg.contains("bos_token_id") && cfg["bos_token_id"].is_number_integer())
      bos = cfg["bos_token_id"].get<int>();
  }
  return PromptModel(tok::Tokenizer::from_file(dir + "/tokenizer.json"),
                     recipe::ChatEncoder::from_model_dir(dir), bos);
}

PromptModel::Key PromptModel::key(GenerationRoute route, std::string_view body) const {
  Key k;
  try {
    const recipe::Api api = route == GenerationRoute::kMessages    ? recipe::Api::kMessages
                            : route == GenerationRoute::kResponses ? recipe::Api::kResponses
                                                                   : recipe::Api::kChat;
    Json j = recipe::parse_request_json(api, body);
    if (!j.is_object()) return k;
    // What the server removes before the adapters see the body (server/request_builder.cc).
    j.erase("traffic_class");
    j.erase("n");
    if (route == GenerationRoute::kCompletions) {
      const Json& p = j.contains("prompt") ? j["prompt"] : Json();
      const Json& first = p.is_array() && !p.empty() && !p[0].is_number() ? p[0] : p;
      if (first.is_string()) {
        if (bos_ >= 0) k.tokens.push_back(bos_);
        tokenizer_.encode_into(first.get<std::string>(), /*allow_special=*/false, k.tokens);
      } else if (first.is_array()) {
        for (const auto& t : first)
          if (t.is_number_integer()) k.tokens.push_back(t.get<int>());
      }
      return k;
    }
    if (route == GenerationRoute::kResponses && j.contains("previous_response_id") &&
        j["previous_response_id"].is_string()) {
      // Its prompt starts with the stored conversation, which only the replica that stored it has.
      k.previous_response_id = j["previous_response_id"].get<std::string>();
      return k;
    }
    recipe::ParsedRequest pr = route == GenerationRoute::kChat        ? recipe::parse_chat_request(j)
                               : route == GenerationRoute::kResponses ? recipe::parse_responses_request(j)
                                                                      : recipe::parse_messages_request(j);
    k.tokens = encoder_.encode(pr.conversation).ids(tokenizer_);
  } catch (const std::exception&) {
    k.tokens.clear();  // an invalid request: routed by load, answered by the replica
  }
  return k;
}

}  // namespace beluga::router
