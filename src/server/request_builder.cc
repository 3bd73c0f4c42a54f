#include "server/request_builder.h"

#include <cmath>

#include "recipe/json_depth.h"
#include "recipe/json_fields.h"
#include "recipe/request.h"
#include "server/sse.h"
#include "server/structured_output.h"
#include "tokenizer/utf8.h"

namespace beluga::server {

using Json = nlohmann::ordered_json;
using recipe::ApiError;
using recipe::Fields;

recipe::Api error_api(ServerApi api) {
  switch (api) {
    case ServerApi::kChat:
    case ServerApi::kCompletions:
      return recipe::Api::kChat;
    case ServerApi::kResponses:
      return recipe::Api::kResponses;
    case ServerApi::kMessages:
      return recipe::Api::kMessages;
  }
  return recipe::Api::kChat;
}

const char* server_api_name(ServerApi api) {
  switch (api) {
    case ServerApi::kChat:
      return "chat";
    case ServerApi::kCompletions:
      return "completions";
    case ServerApi::kResponses:
      return "responses";
    case ServerApi::kMessages:
      return "messages";
  }
  return "?";
}

namespace {

// Sampling extensions beyond what the recipe adapters read (vLLM's names), shared by the APIs.
void extra_sampling(const Fields& f, const Json& body, SamplingParams& sp, int vocab) {
  if (Fields::has(body, "min_p")) sp.min_p = float(f.number(body["min_p"], "min_p", 0, 1));
  if (Fields::has(body, "repetition_penalty"))
    sp.repetition_penalty = float(f.number(body["repetition_penalty"], "repetition_penalty", 0.01, 100));
  if (Fields::has(body, "min_tokens"))
    sp.min_tokens = int(f.integer(body["min_tokens"], "min_tokens", 0, 1 << 30));
  if (Fields::has(body, "ignore_eos")) sp.ignore_eos = f.boolean(body["ignore_eos"], "ignore_eos");
  if (Fields::has(body, "stop_token_ids")) {
    const Json& a = f.array(body["stop_token_ids"], "stop_token_ids");
    for (size_t i = 0; i < a.size(); ++i)
      sp.stop_token_ids.push_back(
          int(f.integer(a[i], recipe::path_index("stop_token_ids", i), 0, vocab - 1)));
  }
  if (Fields::has(body, "logit_bias")) {
    const Json& lb = f.object(body["logit_bias"], "logit_bias");
    for (const auto& [k, v] : lb.items()) {
      char* end = nullptr;
      long id = std::strtol(k.c_str(), &end, 10);
      if (k.empty() || *end != '\0' || id < 0 || id >= vocab)
        f.fail(recipe::path_join("logit_bias", k), "is not a token id of this model");
      sp.logit_bias[int(id)] = float(f.number(v, recipe::path_join("logit_bias", k), -100, 100));
    }
  }
}

// vLLM's prompt_logprobs extension (chat and completions): 0..20 alternatives per prompt token, or
// -1 when absent. As in vLLM, not with stream (the response carries them in a field of its own).
int parse_prompt_logprobs(const Fields& f, const Json& body, bool stream) {
  if (!Fields::has(body, "prompt_logprobs")) return -1;
  const int k = int(f.integer(body["prompt_logprobs"], "prompt_logprobs", 0, 20));
  if (stream) f.fail("prompt_logprobs", "not available with `stream: true`");
  return k;
}

int parse_n(const Fields& f, Json& body) {
  int n = 1;
  if (Fields::has(body, "n")) n = int(f.integer(body["n"], "n", 1, 128));
  if (body.is_object()) body.erase("n");
  return n;
}

// The fan-out limit, counted in sequences (what the engine schedules), before any tokenizing.
void check_fan_out(const Fields& f, int64_t prompts, int n, const ModelInfo& info) {
  if (prompts * n <= info.max_seqs_per_request) return;
  f.fail("n", "this request asks for " + std::to_string(prompts) + " prompt(s) x n=" + std::to_string(n) +
                  " = " + std::to_string(prompts * n) + " sequences; the limit is " +
                  std::to_string(info.max_seqs_per_request) + " sequences per request");
}

void check_model(ServerApi api, const Json& body, const ModelInfo& info) {
  if (!body.is_object() || !body.contains("model") || !body["model"].is_string()) return;
  const std::string m = body["model"].get<std::string>();
  if (m != info.served_name)
    throw ApiError(error_api(api), 404, "The model `" + m + "` does not exist.", "model");
}

int64_t resolve_max_tokens(ServerApi api, std::optional<int64_t> requested, size_t prompt_len,
                           const ModelInfo& info) {
  if (int64_t(prompt_len) >= info.max_model_len)
    throw ApiError(error_api(api), 400,
                   "This model's maximum context length is " + std::to_string(info.max_model_len) +
                       " tokens. However, your prompt has " + std::to_string(prompt_len) + " tokens.",
                   api == ServerApi::kCompletions ? "prompt" : "messages");
  const int64_t room = info.max_model_len - int64_t(prompt_len);
  // OpenAI (and vLLM) refuse an explicit budget past the context; Anthropic clients always send
  // max_tokens, often larger than a small model's context, so there it is a cap, as for the defaults.
  if (requested && *requested > room && api != ServerApi::kMessages)
    throw ApiError(error_api(api), 400,
                   "This model's maximum context length is " + std::to_string(info.max_model_len) +
                       " tokens. However, you requested " + std::to_string(int64_t(prompt_len) + *requested) +
                       " tokens (" + std::to_string(prompt_len) + " in the " +
                       (api == ServerApi::kCompletions ? "prompt" : "messages") + ", " +
                       std::to_string(*requested) +
                       " in the completion). Please reduce the length of the messages or completion.",
                   api == ServerApi::kResponses ? "max_output_tokens" : "max_tokens");
  int64_t m =
      requested ? *requested : (api == ServerApi::kCompletions ? info.default_completions_max_tokens : room);
  return std::min(m, room);
}

void default_sampling(SamplingParams& sp, const ModelInfo& info) {
  if (info.default_temperature) sp.temperature = *info.default_temperature;
  if (info.default_top_p) sp.top_p = *info.default_top_p;
  if (info.default_top_k) sp.top_k = *info.default_top_k;
}

void apply_recipe_sampling(const recipe::SamplingParams& r, SamplingParams& sp) {
  if (r.temperature) sp.temperature = float(*r.temperature);
  if (r.top_p) sp.top_p = float(*r.top_p);
  if (r.top_k) sp.top_k = std::max(0, *r.top_k);
  if (r.presence_penalty) sp.presence_penalty = float(*r.presence_penalty);
  if (r.frequency_penalty) sp.frequency_penalty = float(*r.frequency_penalty);
  if (r.seed) sp.seed = uint64_t(*r.seed);
}

// Chat Completions, Responses and Messages: the recipe adapters + the model's chat encoder.
BuiltRequest build_chat_like(ServerApi api, Json body, const ModelInfo& info, const StoreView& responses) {
  const recipe::Api rapi = error_api(api);
  const Fields f(rapi);
  BuiltRequest b;
  int n = 1;
  if (api == ServerApi::kChat) n = parse_n(f, body);
  check_fan_out(f, 1, n, info);
  recipe::ParsedRequest pr;
  switch (api) {
    case ServerApi::kChat:
      pr = recipe::parse_chat_request(body);
      break;
    case ServerApi::kResponses: {
      recipe::ParseOptions opt;
      if (responses.store && Fields::has(body, "previous_response_id") &&
          body["previous_response_id"].is_string()) {
        b.previous = responses.store->get(body["previous_response_id"].get<std::string>(), responses.tenant);
        if (b.previous) opt.previous_items = b.previous->conversation();
      }
      pr = recipe::parse_responses_request(body, opt);
      break;
    }
    default:
      pr = recipe::parse_messages_request(body);
      break;
  }
  std::vector<int> ids;
  try {
    ids = info.encoder->encode(pr.conversation).ids(*info.tokenizer);
  } catch (const ApiError&) {
    throw;
  } catch (const std::exception& e) {
    throw ApiError(rapi, 400, e.what());
  }
  if (ids.empty()) throw ApiError(rapi, 400, "the prompt is empty", "messages");

  SamplingParams& sp = b.sampling;
  default_sampling(sp, info);
  apply_recipe_sampling(pr.sampling, sp);
  if (!pr.sampling.seed && Fields::has(body, "seed"))
    sp.seed = uint64_t(f.integer(body["seed"], "seed", INT64_MIN, INT64_MAX));
  if (api != ServerApi::kMessages && !pr.sampling.top_k && Fields::has(body, "top_k"))
    sp.top_k = std::max<int>(0, int(f.integer(body["top_k"], "top_k", -1, 1 << 30)));
  extra_sampling(f, body, sp, int(info.tokenizer->vocab_size()));
  if (api == ServerApi::kChat) {
    // OpenAI: `logprobs: true` for the chosen tokens' logprobs, `top_logprobs: 0..20` (only with
    // logprobs) for alternatives.
    const bool logprobs = Fields::has(body, "logprobs") && f.boolean(body["logprobs"], "logprobs");
    int top = 0;
    if (Fields::has(body, "top_logprobs")) {
      top = int(f.integer(body["top_logprobs"], "top_logprobs", 0, 20));
      if (!logprobs) f.fail("top_logprobs", "`logprobs` must be set to true when `top_logprobs` is used");
    }
    if (logprobs) sp.logprobs = top;
    sp.prompt_logprobs = parse_prompt_logprobs(f, body, pr.stream);
  }
  sp.n = n;
  sp.max_tokens = int(std::min<int64_t>(resolve_max_tokens(api, pr.max_tokens, ids.size(), info), 1 << 30));

  b.spec.api = api;
  b.spec.n = n;
  b.spec.num_prompts = 1;
  b.spec.use_parser = true;
  b.spec.parser = recipe::parser_options(*info.encoder, pr.conversation, pr.stop);
  b.spec.prompt_tokens = {int(ids.size())};
  b.spec.logprobs = sp.logprobs;
  b.spec.prompt_logprobs = sp.prompt_logprobs;
  if (sp.prompt_logprobs >= 0) b.spec.prompt_ids = {ids};
  const auto& msgs = pr.conversation.messages;
  const ConstraintContext cc{rapi, &sp, &b.spec.parser, !msgs.empty() && msgs.back().prefix};
  b.logits_processor = tool_call_processor(pr.conversation, *info.tokenizer, info.grammars.get(), cc);
  if (b.logits_processor && pr.constraint.active())
    f.fail(pr.constraint.param, "cannot be combined with a tool_choice that forces a tool call");
  if (!b.logits_processor)
    b.logits_processor = structured_output_processor(pr.constraint, info.grammars.get(), cc);
  b.prompts.push_back(std::move(ids));
  b.stream = pr.stream;

  b.ctx.model = info.served_name;
  b.ctx.created = unix_seconds();
  b.ctx.n = n;
  b.ctx.include_usage = pr.include_usage;
  b.ctx.continuous_usage = pr.continuous_usage;
  if (api == ServerApi::kChat) b.ctx.logprobs = sp.logprobs;
  b.ctx.prompt_logprobs = sp.prompt_logprobs >= 0;
  switch (api) {
    case ServerApi::kChat:
      b.ctx.id = random_id("chatcmpl-");
      break;
    case ServerApi::kResponses:
      b.ctx.id = random_id("resp_");
      b.store = pr.store && responses.store && responses.store->capacity() > 0;
      if (b.store) b.input = recipe::responses_input_items(body["input"]);
      b.ctx.request = body;
      b.ctx.request.erase("input");
      // The response object reports whether it was kept (not just asked to be).
      b.ctx.request["store"] = b.store;
      break;
    default:
      b.ctx.id = random_id("msg_");
      break;
  }
  return b;
}

// Legacy Completions: prompt text or token ids, no chat template, no output parsing.
BuiltRequest build_completions(Json body, const ModelInfo& info) {
  const ServerApi api = ServerApi::kCompletions;
  const Fields f(recipe::Api::kChat);
  if (!body.is_object()) f.fail("", "the request body must be a JSON object");
  BuiltRequest b;
  const int n = parse_n(f, body);
  const int vocab = int(info.tokenizer->vocab_size());

  // prompt: string | [string] | [int] | [[int]]
  const Json& p = f.required(body, "prompt", "");
  const bool many = p.is_array() && !p.empty() && !p[0].is_number();
  check_fan_out(f, many ? int64_t(p.size()) : 1, n, info);
  std::vector<std::string> texts;
  auto text_prompt = [&](const std::string& s) {
    std::vector<int> ids;
    if (info.bos_token_id >= 0) ids.push_back(info.bos_token_id);
    std::vector<int> t = info.tokenizer->encode(s, /*allow_special=*/false);
    ids.insert(ids.end(), t.begin(), t.end());
    b.prompts.push_back(std::move(ids));
    texts.push_back(s);
  };
  auto id_prompt = [&](const Json& a, const std::string& path) {
    std::vector<int> ids;
    for (size_t i = 0; i < a.size(); ++i)
      ids.push_back(int(f.integer(a[i], recipe::path_index(path, i), 0, vocab - 1)));
    if (ids.empty()) f.fail(path, "must not be empty");
    texts.push_back(info.tokenizer->decode(ids));
    b.prompts.push_back(std::move(ids));
  };
  if (p.is_string()) {
    text_prompt(p.get<std::string>());
  } else if (p.is_array() && !p.empty() && p[0].is_number()) {
    id_prompt(p, "prompt");
  } else if (p.is_array() && !p.empty()) {
    if (p.size() > 64) f.fail("prompt", "at most 64 prompts per request");
    for (size_t i = 0; i < p.size(); ++i) {
      const std::string path = recipe::path_index("prompt", i);
      if (p[i].is_string())
        text_prompt(p[i].get<std::string>());
      else if (p[i].is_array())
        id_prompt(p[i], path);
      else
        f.fail(path, "expected a string or an array of token ids");
    }
  } else {
    f.fail("prompt", "expected a string, an array of strings or an array of token ids");
  }
  for (const auto& ids : b.prompts)
    if (ids.empty()) f.fail("prompt", "must not be empty");
  if (Fields::has(body, "suffix") && !f.string(body["suffix"], "suffix").empty())
    f.fail("suffix", "suffix (fill-in-the-middle) is not supported by this model");
  if (Fields::has(body, "best_of") && f.integer(body["best_of"], "best_of", 1, 128) != n)
    f.fail("best_of", "best_of must equal n");
  std::optional<int64_t> max_tokens;
  if (Fields::has(body, "max_tokens")) max_tokens = f.integer(body["max_tokens"], "max_tokens", 1, INT64_MAX);
  bool echo = false;
  if (Fields::has(body, "echo")) echo = f.boolean(body["echo"], "echo");

  SamplingParams& sp = b.sampling;
  default_sampling(sp, info);
  if (Fields::has(body, "temperature"))
    sp.temperature = float(f.number(body["temperature"], "temperature", 0, 2));
  if (Fields::has(body, "top_p")) sp.top_p = float(f.number(body["top_p"], "top_p", 0, 1));
  if (Fields::has(body, "top_k"))
    sp.top_k = std::max<int>(0, int(f.integer(body["top_k"], "top_k", -1, 1 << 30)));
  if (Fields::has(body, "presence_penalty"))
    sp.presence_penalty = float(f.number(body["presence_penalty"], "presence_penalty", -2, 2));
  if (Fields::has(body, "frequency_penalty"))
    sp.frequency_penalty = float(f.number(body["frequency_penalty"], "frequency_penalty", -2, 2));
  if (Fields::has(body, "seed")) sp.seed = uint64_t(f.integer(body["seed"], "seed", INT64_MIN, INT64_MAX));
  // OpenAI: logprobs 0..5 (the chosen token's logprob and up to 5 alternatives per position).
  if (Fields::has(body, "logprobs")) sp.logprobs = int(f.integer(body["logprobs"], "logprobs", 0, 5));
  extra_sampling(f, body, sp, vocab);
  sp.n = n;
  size_t longest = 0;
  for (const auto& ids : b.prompts) longest = std::max(longest, ids.size());
  sp.max_tokens = int(std::min<int64_t>(resolve_max_tokens(api, max_tokens, longest, info), 1 << 30));

  if (Fields::has(body, "stop")) b.spec.stop = f.stop(body["stop"], "stop", 16);
  if (Fields::has(body, "stream")) b.stream = f.boolean(body["stream"], "stream");
  if (Fields::has(body, "stream_options")) {
    const Json& so = f.object(body["stream_options"], "stream_options");
    if (Fields::has(so, "include_usage"))
      b.ctx.include_usage = f.boolean(so["include_usage"], "stream_options.include_usage");
    if (Fields::has(so, "continuous_usage_stats"))
      b.ctx.continuous_usage =
          f.boolean(so["continuous_usage_stats"], "stream_options.continuous_usage_stats");
  }
  b.spec.api = api;
  b.spec.n = n;
  b.spec.num_prompts = int(b.prompts.size());
  b.spec.use_parser = false;
  if (echo) b.spec.echo = texts;
  for (const auto& ids : b.prompts) b.spec.prompt_tokens.push_back(int(ids.size()));
  b.spec.logprobs = sp.logprobs;
  b.ctx.logprobs = sp.logprobs;
  // Prompt logprobs: vLLM's field, and (as in OpenAI and vLLM) echo with logprobs, whose logprobs
  // then cover the prompt's tokens too. The engine computes the larger number of alternatives.
  b.spec.prompt_logprobs = parse_prompt_logprobs(f, body, b.stream);
  b.ctx.prompt_logprobs = b.spec.prompt_logprobs >= 0;
  sp.prompt_logprobs = std::max(b.spec.prompt_logprobs, echo ? sp.logprobs : -1);
  if (sp.prompt_logprobs >= 0) b.spec.prompt_ids = b.prompts;
  // Structured output, as vLLM's completions take it: `response_format` or `structured_outputs`.
  recipe::OutputConstraint constraint;
  if (Fields::has(body, "response_format"))
    constraint = recipe::openai_response_format(f, body["response_format"], "response_format");
  if (Fields::has(body, "structured_outputs"))
    recipe::merge_constraint(
        f, constraint, recipe::vllm_structured_outputs(f, body["structured_outputs"], "structured_outputs"));
  b.logits_processor = structured_output_processor(
      constraint, info.grammars.get(), ConstraintContext{recipe::Api::kChat, &sp, nullptr, false});
  b.ctx.id = random_id("cmpl-");
  b.ctx.model = info.served_name;
  b.ctx.created = unix_seconds();
  b.ctx.n = n * int(b.prompts.size());
  return b;
}

}  // namespace

BuiltRequest build_request(ServerApi api, std::string_view body, const ModelInfo& info,
                           const StoreView& responses) {
  const recipe::Api rapi = error_api(api);
  if (tok::utf8_first_invalid(body) != body.size())
    throw ApiError(rapi, 400, "the request body is not valid UTF-8");
  Json j = recipe::parse_request_json(rapi, body);  // also bounds its nesting (recipe/json_depth.h)
  if (!j.is_object()) throw ApiError(rapi, 400, "the request body must be a JSON object");
  check_model(api, j, info);
  // Beluga's own field, on every API: the KV retention class (checked by the server, which also
  // reads the x-traffic-class header).
  std::string traffic_class;
  if (j.contains("traffic_class")) {
    if (!j["traffic_class"].is_string() || j["traffic_class"].get<std::string>().empty())
      throw ApiError(rapi, 400, "traffic_class must be a non-empty string", "traffic_class");
    traffic_class = j["traffic_class"].get<std::string>();
    j.erase("traffic_class");
  }
  BuiltRequest b = api == ServerApi::kCompletions ? build_completions(std::move(j), info)
                                                  : build_chat_like(api, std::move(j), info, responses);
  b.traffic_class = std::move(traffic_class);
  return b;
}

}  // namespace beluga::server
