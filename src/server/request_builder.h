// API request body -> what the server submits: prompt token ids (one list per prompt), engine
// sampling parameters, the job spec (parser options, stop strings, n) and the formatter context.
// Invalid requests throw recipe::ApiError with the API's own status and JSON body.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/kv_events.h"
#include "engine/request.h"
#include "recipe/api_error.h"
#include "recipe/chat_format.h"
#include "server/api_format.h"
#include "server/disaggregation.h"
#include "server/grammar_cache.h"
#include "server/job.h"
#include "server/response_store.h"
#include "tokenizer/tokenizer.h"

namespace beluga::server {

// Model-wide facts and defaults the builder needs.
struct ModelInfo {
  std::string served_name;  // the id clients must send as `model`
  const tok::Tokenizer* tokenizer = nullptr;
  const recipe::ChatEncoder* encoder = nullptr;
  int max_model_len = 2048;
  int bos_token_id = -1;                     // prepended to /v1/completions text prompts
  std::optional<float> default_temperature;  // generation_config.json
  std::optional<float> default_top_p;
  std::optional<int> default_top_k;
  int default_completions_max_tokens = 16;  // OpenAI's default for /v1/completions
  // Sequences one request may ask for (prompts x n); more is a 400 naming the limit, checked before
  // any prompt is tokenized (`beluga serve --max-seqs-per-request`).
  int max_seqs_per_request = 128;
  // The KV retention classes a request may name (body `traffic_class`, header `x-traffic-class`;
  // default chat); another is a 400, KV tiers on or off.
  std::vector<std::string> traffic_classes = {"agent", "chat"};
  // Compiled structured-output grammars of this model's vocabulary (null: structured outputs are
  // refused with a 400).
  std::shared_ptr<GrammarCache> grammars;
  // Extra /metrics text (the KV tiers'), appended when set.
  std::function<std::string()> extra_metrics;
  // Disaggregated serving: this server's role and its KV transfer ends.
  Disaggregation pd;
  // The KV block events GET /v1/kv/events serves (kv_events_route.h); null: none. Outlives the server.
  const KvEventLog* kv_events = nullptr;
};

struct BuiltRequest {
  std::vector<std::vector<int>> prompts;
  SamplingParams sampling;
  JobSpec spec;
  FormatContext ctx;
  bool stream = false;
  // Responses: whether to store the response once it completes, the response it continues, and this
  // request's own input items (what StoredResponse keeps).
  bool store = false;
  std::shared_ptr<const StoredResponse> previous;
  nlohmann::ordered_json input;
  std::string traffic_class;  // as the body gave it; empty: none
  // Structured output: one processor per sequence (null: unconstrained). Compiled while building.
  LogitsProcessorFactory logits_processor;
};

// Where a Responses request's `previous_response_id` is looked up: the server's store (null: none,
// so nothing is stored and every previous id is unknown) as seen by the request's tenant.
struct StoreView {
  ResponseStore* store = nullptr;
  std::string tenant;
};

recipe::Api error_api(ServerApi api);        // the error shape an API answers in
const char* server_api_name(ServerApi api);  // "chat", "completions", "responses", "messages"

// `body` is the raw request body (UTF-8 is checked here). An unknown `previous_response_id` is a 404.
BuiltRequest build_request(ServerApi api, std::string_view body, const ModelInfo& info,
                           const StoreView& responses = {});

}  // namespace beluga::server
