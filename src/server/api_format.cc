#include "server/api_format.h"

#include <algorithm>

#include "recipe/json_depth.h"
#include "server/sse.h"

namespace beluga::server {

using Json = nlohmann::ordered_json;
using Ev = recipe::ParserEvent;

namespace {

// Beluga's extension beside DeepSeek's prompt_cache_hit_tokens: where the cached tokens came from
// (device: the engine's KV pool; host, disk: the tiers below it, docs/kv-cache.md).
Json hits_by_tier(const Usage& u) {
  return Json{{"device", u.cached_tokens - u.cached_tokens_host - u.cached_tokens_disk},
              {"host", u.cached_tokens_host},
              {"disk", u.cached_tokens_disk}};
}

}  // namespace

Json openai_usage(const Usage& u) {
  return Json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}},
              {"completion_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}},
              {"prompt_cache_hit_tokens", u.cached_tokens},
              {"prompt_cache_hit_tokens_by_tier", hits_by_tier(u)},
              {"prompt_cache_miss_tokens", u.prompt_tokens - u.cached_tokens}};
}

Json responses_usage(const Usage& u) {
  return Json{{"input_tokens", u.prompt_tokens},
              {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
              {"output_tokens", u.completion_tokens},
              {"output_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_cache_hit_tokens", u.cached_tokens},
              {"prompt_cache_hit_tokens_by_tier", hits_by_tier(u)},
              {"prompt_cache_miss_tokens", u.prompt_tokens - u.cached_tokens}};
}

// Anthropic counts cache reads apart from input_tokens (input = prompt - cache read).
Json anthropic_usage(const Usage& u) {
  return Json{{"input_tokens", u.prompt_tokens - u.cached_tokens},
              {"output_tokens", u.completion_tokens},
              {"cache_creation_input_tokens", 0},
              {"cache_read_input_tokens", u.cached_tokens},
              {"prompt_cache_hit_tokens", u.cached_tokens},
              {"prompt_cache_hit_tokens_by_tier", hits_by_tier(u)},
              {"prompt_cache_miss_tokens", u.prompt_tokens - u.cached_tokens}};
}

Json arguments_object(const std::string& text) {
  if (text.empty()) return Json::object();
  // Model-written text: nested deeper than the limit, it stays text (dumping it would recurse).
  Json j = recipe::parse_json_bounded(text);
  if (j.is_discarded() || !j.is_object()) return Json{{"arguments", text}};
  return j;
}

namespace {

Json json_or_null(const Json& req, const char* key, Json def = nullptr) {
  return req.is_object() && req.contains(key) ? req[key] : def;
}

Json byte_array(const std::string& bytes) {
  Json a = Json::array();
  for (unsigned char b : bytes) a.push_back(int(b));
  return a;
}

// Chat Completions: {"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}.
Json chat_logprobs(const std::vector<TokenLogprobOut>& lps, size_t from, size_t to) {
  Json content = Json::array();
  for (size_t i = from; i < to; ++i) {
    const TokenLogprobOut& t = lps[i];
    Json top = Json::array();
    for (const auto& a : t.top)
      top.push_back(Json{{"token", a.token}, {"logprob", a.logprob}, {"bytes", byte_array(a.bytes)}});
    content.push_back(Json{{"token", t.chosen.token},
                           {"logprob", t.chosen.logprob},
                           {"bytes", byte_array(t.chosen.bytes)},
                           {"top_logprobs", std::move(top)}});
  }
  return Json{{"content", std::move(content)}, {"refusal", nullptr}};
}

// Legacy Completions: parallel arrays {tokens, token_logprobs, top_logprobs, text_offset}.
Json completions_logprobs(const std::vector<TokenLogprobOut>& lps, size_t from, size_t to) {
  Json tokens = Json::array(), lp = Json::array(), top = Json::array(), off = Json::array();
  for (size_t i = from; i < to; ++i) {
    const TokenLogprobOut& t = lps[i];
    tokens.push_back(t.chosen.token);
    off.push_back(t.text_offset);
    if (t.no_logprob) {  // the echoed prompt's first token, as OpenAI and vLLM give it
      lp.push_back(nullptr);
      top.push_back(nullptr);
      continue;
    }
    lp.push_back(t.chosen.logprob);
    Json alts = Json::object();
    for (const auto& a : t.top)
      if (!alts.contains(a.token)) alts[a.token] = a.logprob;
    top.push_back(std::move(alts));
  }
  return Json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(lp)},
              {"top_logprobs", std::move(top)},
              {"text_offset", std::move(off)}};
}

// vLLM's prompt_logprobs: [null, {"<id>": {logprob, rank, decoded_token}, ...}, ...] (null when
// not known).
Json prompt_logprobs_json(const std::optional<PromptLogprobs>& p) {
  if (!p) return nullptr;
  Json a = Json::array();
  for (const auto& pos : *p) {
    if (pos.empty()) {
      a.push_back(nullptr);
      continue;
    }
    Json d = Json::object();
    for (const auto& alt : pos) {
      const std::string key = std::to_string(alt.id);
      if (!d.contains(key))  // the prompt token may also be one of the top alternatives
        d[key] = Json{{"logprob", alt.logprob}, {"rank", alt.rank}, {"decoded_token", alt.decoded}};
    }
    a.push_back(std::move(d));
  }
  return a;
}

// How many logprob entries of each choice a stream has sent.
class SentCursor {
 public:
  // The range [from, to) not yet sent for `c`; marks it sent.
  std::pair<size_t, size_t> take(const ChoiceText& c) {
    if (size_t(c.index) >= sent_.size()) sent_.resize(size_t(c.index) + 1, 0);
    size_t& s = sent_[size_t(c.index)];
    const size_t from = std::min(s, c.logprobs.size());
    s = c.logprobs.size();
    return {from, s};
  }

 private:
  std::vector<size_t> sent_;
};

// ---------------------------------------------------------------- OpenAI Chat Completions

// The OpenAI streams (chat and legacy completions) share chunk framing, the usage chunk, [DONE] and
// the in-stream error shape; they differ in the object name and the choice fields.
class OpenAiFormatter : public ApiFormatter {
 public:
  OpenAiFormatter(FormatContext ctx, const char* object) : ctx_(std::move(ctx)), object_(object) {}

  void end(const std::vector<ChoiceText>&, const Usage& usage, std::string& out) override {
    if (ctx_.include_usage) {  // the final usage chunk, continuous usage or not
      Json j = chunk(Json::array());
      j["usage"] = openai_usage(usage);
      out += sse_data(j);
    }
    out += kSseDone;
  }

  void error(const std::string& message, std::string& out) override {
    out += sse_data(Json{
        {"error", {{"message", message}, {"type", "internal_error"}, {"param", nullptr}, {"code", 500}}}});
    out += kSseDone;
  }

 protected:
  // `c`: the choice the chunk is about (its usage so far goes in with continuous usage).
  Json chunk(Json choices, const ChoiceText* c = nullptr) const {
    Json j{{"id", ctx_.id},
           {"object", object_},
           {"created", ctx_.created},
           {"model", ctx_.model},
           {"system_fingerprint", nullptr},
           {"choices", std::move(choices)}};
    if (ctx_.include_usage) {
      if (ctx_.continuous_usage && c)
        j["usage"] = Json{{"prompt_tokens", prompt_tokens_},
                          {"completion_tokens", c->tokens},
                          {"total_tokens", prompt_tokens_ + c->tokens}};
      else
        j["usage"] = nullptr;
    }
    return j;
  }

  FormatContext ctx_;
  const char* object_;
  SentCursor sent_;
  int64_t prompt_tokens_ = 0;  // from begin(): the engine's count when the stream opened
};

class ChatFormatter final : public OpenAiFormatter {
 public:
  explicit ChatFormatter(FormatContext ctx) : OpenAiFormatter(std::move(ctx), "chat.completion.chunk") {}

  void begin(const Usage& usage, std::string& out) override {
    prompt_tokens_ = usage.prompt_tokens;
    for (int i = 0; i < ctx_.n; ++i)
      out += sse_data(chunk(Json::array({Json{{"index", i},
                                              {"delta", {{"role", "assistant"}, {"content", ""}}},
                                              {"logprobs", nullptr},
                                              {"finish_reason", nullptr}}})));
  }

  void delta(const ChoiceText& c, const Ev& ev, std::string& out) override {
    Json d = Json::object();
    switch (ev.kind) {
      case Ev::Kind::kReasoning:
        d["reasoning_content"] = ev.text;
        break;
      case Ev::Kind::kContent:
        d["content"] = ev.text;
        break;
      case Ev::Kind::kToolCallBegin: {
        const ToolCallOut& call = c.calls.at(size_t(ev.tool_index));
        d["tool_calls"] = Json::array({Json{{"index", ev.tool_index},
                                            {"id", call.id},
                                            {"type", "function"},
                                            {"function", {{"name", call.name}, {"arguments", ""}}}}});
        break;
      }
      case Ev::Kind::kToolCallArgs:
        d["tool_calls"] =
            Json::array({Json{{"index", ev.tool_index}, {"function", {{"arguments", ev.text}}}}});
        break;
      case Ev::Kind::kToolCallEnd:
        return;
    }
    out += sse_data(chunk(Json::array({Json{{"index", c.index},
                                            {"delta", std::move(d)},
                                            {"logprobs", logprobs(c)},
                                            {"finish_reason", nullptr}}}),
                          &c));
  }

  void finish(const ChoiceText& c, std::string& out) override {
    out += sse_data(chunk(Json::array({Json{{"index", c.index},
                                            {"delta", Json::object()},
                                            {"logprobs", logprobs(c, /*only_if_new=*/true)},
                                            {"finish_reason", c.finish}}}),
                          &c));
  }

  Json response(const std::vector<ChoiceText>& choices, const Usage& usage) const override {
    Json cs = Json::array();
    for (const auto& c : choices) {
      Json msg{{"role", "assistant"}};
      msg["content"] = c.content.empty() && !c.calls.empty() ? Json(nullptr) : Json(c.content);
      if (!c.reasoning.empty()) msg["reasoning_content"] = c.reasoning;
      if (!c.calls.empty()) {
        Json calls = Json::array();
        for (const auto& call : c.calls)
          calls.push_back(Json{{"id", call.id},
                               {"type", "function"},
                               {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
        msg["tool_calls"] = std::move(calls);
      }
      cs.push_back(Json{
          {"index", c.index},
          {"message", std::move(msg)},
          {"logprobs", ctx_.logprobs >= 0 ? chat_logprobs(c.logprobs, 0, c.logprobs.size()) : Json(nullptr)},
          {"finish_reason", c.finish}});
    }
    Json r{{"id", ctx_.id},
           {"object", "chat.completion"},
           {"created", ctx_.created},
           {"model", ctx_.model},
           {"choices", std::move(cs)},
           {"usage", openai_usage(usage)},
           {"system_fingerprint", nullptr}};
    // vLLM puts a chat request's prompt logprobs on the response (one prompt for all choices).
    if (ctx_.prompt_logprobs)
      r["prompt_logprobs"] =
          choices.empty() ? Json(nullptr) : prompt_logprobs_json(choices[0].prompt_logprobs);
    return r;
  }

 private:
  // The logprobs of the tokens added to `c` since its last chunk (null when not asked for, or
  // when `only_if_new` and there are none).
  Json logprobs(const ChoiceText& c, bool only_if_new = false) {
    if (ctx_.logprobs < 0) return nullptr;
    auto [from, to] = sent_.take(c);
    if (only_if_new && from == to) return nullptr;
    return chat_logprobs(c.logprobs, from, to);
  }
};

// ---------------------------------------------------------------- OpenAI (legacy) Completions

class CompletionsFormatter final : public OpenAiFormatter {
 public:
  explicit CompletionsFormatter(FormatContext ctx) : OpenAiFormatter(std::move(ctx), "text_completion") {}

  void begin(const Usage& usage, std::string&) override { prompt_tokens_ = usage.prompt_tokens; }

  void delta(const ChoiceText& c, const Ev& ev, std::string& out) override {
    if (ev.kind != Ev::Kind::kContent || ev.text.empty()) return;
    out += sse_data(chunk(
        Json::array({Json{
            {"index", c.index}, {"text", ev.text}, {"logprobs", logprobs(c)}, {"finish_reason", nullptr}}}),
        &c));
  }

  void finish(const ChoiceText& c, std::string& out) override {
    out += sse_data(chunk(
        Json::array(
            {Json{{"index", c.index}, {"text", ""}, {"logprobs", logprobs(c)}, {"finish_reason", c.finish}}}),
        &c));
  }

  Json response(const std::vector<ChoiceText>& choices, const Usage& usage) const override {
    Json cs = Json::array();
    for (const auto& c : choices) {
      cs.push_back(
          Json{{"index", c.index},
               {"text", c.content},
               {"logprobs",
                ctx_.logprobs >= 0 ? completions_logprobs(c.logprobs, 0, c.logprobs.size()) : Json(nullptr)},
               {"finish_reason", c.finish}});
      if (ctx_.prompt_logprobs) cs.back()["prompt_logprobs"] = prompt_logprobs_json(c.prompt_logprobs);
    }
    return Json{{"id", ctx_.id},
                {"object", "text_completion"},
                {"created", ctx_.created},
                {"model", ctx_.model},
                {"choices", std::move(cs)},
                {"usage", openai_usage(usage)},
                {"system_fingerprint", nullptr}};
  }

 private:
  // The logprobs of the tokens added to `c` since its last chunk (null when not asked for).
  Json logprobs(const ChoiceText& c) {
    if (ctx_.logprobs < 0) return nullptr;
    auto [from, to] = sent_.take(c);
    return completions_logprobs(c.logprobs, from, to);
  }
};

// ---------------------------------------------------------------- OpenAI Responses

class ResponsesFormatter final : public ApiFormatter {
 public:
  explicit ResponsesFormatter(FormatContext ctx) : ctx_(std::move(ctx)) {}

  void begin(const Usage&, std::string& out) override {
    Json r = base("in_progress", Json::array(), nullptr);
    event(out, "response.created", Json{{"response", r}});
    event(out, "response.in_progress", Json{{"response", r}});
  }

  void delta(const ChoiceText& c, const Ev& ev, std::string& out) override {
    if (c.index != 0) return;
    switch (ev.kind) {
      case Ev::Kind::kReasoning: {
        Item& it = open(Kind::kReasoning, -1, c, out);
        it.text += ev.text;
        event(out, "response.reasoning_text.delta",
              Json{{"item_id", it.id},
                   {"output_index", index_of(it)},
                   {"content_index", 0},
                   {"delta", ev.text}});
        break;
      }
      case Ev::Kind::kContent: {
        Item& it = open(Kind::kMessage, -1, c, out);
        it.text += ev.text;
        event(out, "response.output_text.delta",
              Json{{"item_id", it.id},
                   {"output_index", index_of(it)},
                   {"content_index", 0},
                   {"delta", ev.text},
                   {"logprobs", Json::array()}});
        break;
      }
      case Ev::Kind::kToolCallBegin:
        open(Kind::kCall, ev.tool_index, c, out);
        break;
      case Ev::Kind::kToolCallArgs: {
        Item& it = open(Kind::kCall, ev.tool_index, c, out);
        it.text += ev.text;
        event(out, "response.function_call_arguments.delta",
              Json{{"item_id", it.id}, {"output_index", index_of(it)}, {"delta", ev.text}});
        break;
      }
      case Ev::Kind::kToolCallEnd:
        close(out);
        break;
    }
  }

  void finish(const ChoiceText& c, std::string& out) override {
    if (c.index == 0) close(out);
  }

  void end(const std::vector<ChoiceText>& choices, const Usage& usage, std::string& out) override {
    Json output = Json::array();
    for (const auto& it : items_) output.push_back(item_json(it, "completed"));
    const bool incomplete = !choices.empty() && choices[0].finish == "length";
    Json r = base(incomplete ? "incomplete" : "completed", std::move(output), responses_usage(usage));
    if (incomplete) r["incomplete_details"] = Json{{"reason", "max_output_tokens"}};
    final_ = r;
    event(out, incomplete ? "response.incomplete" : "response.completed", Json{{"response", std::move(r)}});
  }

  Json streamed_response() const override { return final_; }

  void error(const std::string& message, std::string& out) override {
    Json output = Json::array();
    for (const auto& it : items_) output.push_back(item_json(it, "incomplete"));
    Json r = base("failed", std::move(output), nullptr);
    r["error"] = Json{{"code", "server_error"}, {"message", message}};
    event(out, "response.failed", Json{{"response", std::move(r)}});
  }

  Json response(const std::vector<ChoiceText>& choices, const Usage& usage) const override {
    Json output = Json::array();
    const ChoiceText empty;
    const ChoiceText& c = choices.empty() ? empty : choices[0];
    if (!c.reasoning.empty())
      output.push_back(
          item_json(Item{Kind::kReasoning, random_id("rs_"), c.reasoning, "", "", -1}, "completed"));
    if (!c.content.empty() || c.calls.empty())
      output.push_back(
          item_json(Item{Kind::kMessage, random_id("msg_"), c.content, "", "", -1}, "completed"));
    for (size_t i = 0; i < c.calls.size(); ++i)
      output.push_back(item_json(
          Item{Kind::kCall, random_id("fc_"), c.calls[i].arguments, c.calls[i].id, c.calls[i].name, int(i)},
          "completed"));
    const bool incomplete = c.finish == "length";
    Json r = base(incomplete ? "incomplete" : "completed", std::move(output), responses_usage(usage));
    if (incomplete) r["incomplete_details"] = Json{{"reason", "max_output_tokens"}};
    return r;
  }

 private:
  enum class Kind { kReasoning, kMessage, kCall };
  struct Item {
    Kind kind;
    std::string id;
    std::string text;  // reasoning text, message text or call arguments
    std::string call_id, name;
    int tool_index = -1;
  };

  Json base(const char* status, Json output, Json usage) const {
    const Json& q = ctx_.request;
    return Json{{"id", ctx_.id},
                {"object", "response"},
                {"created_at", ctx_.created},
                {"status", status},
                {"background", false},
                {"error", nullptr},
                {"incomplete_details", nullptr},
                {"instructions", json_or_null(q, "instructions")},
                {"max_output_tokens", json_or_null(q, "max_output_tokens")},
                {"model", ctx_.model},
                {"output", std::move(output)},
                {"parallel_tool_calls", json_or_null(q, "parallel_tool_calls", true)},
                {"previous_response_id", json_or_null(q, "previous_response_id")},
                {"reasoning", json_or_null(q, "reasoning", Json{{"effort", nullptr}, {"summary", nullptr}})},
                {"store", json_or_null(q, "store", false)},
                {"temperature", json_or_null(q, "temperature", 1.0)},
                {"text", json_or_null(q, "text", Json{{"format", {{"type", "text"}}}})},
                {"tool_choice", json_or_null(q, "tool_choice", "auto")},
                {"tools", json_or_null(q, "tools", Json::array())},
                {"top_p", json_or_null(q, "top_p", 1.0)},
                {"truncation", "disabled"},
                {"usage", std::move(usage)},
                {"user", nullptr},
                {"metadata", json_or_null(q, "metadata", Json::object())}};
  }

  static Json item_json(const Item& it, const char* status) {
    switch (it.kind) {
      case Kind::kReasoning:
        return Json{{"id", it.id},
                    {"type", "reasoning"},
                    {"summary", Json::array()},
                    {"content", Json::array({Json{{"type", "reasoning_text"}, {"text", it.text}}})},
                    {"status", status}};
      case Kind::kMessage:
        return Json{{"id", it.id},
                    {"type", "message"},
                    {"status", status},
                    {"role", "assistant"},
                    {"content", Json::array({Json{{"type", "output_text"},
                                                  {"text", it.text},
                                                  {"annotations", Json::array()},
                                                  {"logprobs", Json::array()}}})}};
      case Kind::kCall:
        return Json{{"id", it.id},           {"type", "function_call"}, {"status", status},
                    {"call_id", it.call_id}, {"name", it.name},         {"arguments", it.text}};
    }
    return nullptr;
  }

  int index_of(const Item& it) const { return int(&it - items_.data()); }

  void event(std::string& out, const char* type, Json j) {
    Json e{{"type", type}, {"sequence_number", seq_++}};
    for (auto& [k, v] : j.items()) e[k] = v;
    out += sse_event(type, e);
  }

  Item& open(Kind kind, int tool_index, const ChoiceText& c, std::string& out) {
    if (open_ && items_.back().kind == kind && items_.back().tool_index == tool_index) return items_.back();
    close(out);
    Item it{kind, "", "", "", "", tool_index};
    if (kind == Kind::kReasoning) it.id = random_id("rs_");
    if (kind == Kind::kMessage) it.id = random_id("msg_");
    if (kind == Kind::kCall) {
      it.id = random_id("fc_");
      if (tool_index >= 0 && size_t(tool_index) < c.calls.size()) {
        it.call_id = c.calls[size_t(tool_index)].id;
        it.name = c.calls[size_t(tool_index)].name;
      }
    }
    items_.push_back(std::move(it));
    open_ = true;
    Item& cur = items_.back();
    Json added = item_json(cur, "in_progress");
    if (kind == Kind::kMessage) added["content"] = Json::array();
    if (kind == Kind::kReasoning) added["content"] = Json::array();
    event(out, "response.output_item.added",
          Json{{"output_index", index_of(cur)}, {"item", std::move(added)}});
    if (kind == Kind::kMessage)
      event(out, "response.content_part.added",
            Json{{"item_id", cur.id},
                 {"output_index", index_of(cur)},
                 {"content_index", 0},
                 {"part",
                  {{"type", "output_text"},
                   {"text", ""},
                   {"annotations", Json::array()},
                   {"logprobs", Json::array()}}}});
    return cur;
  }

  void close(std::string& out) {
    if (!open_) return;
    open_ = false;
    const Item& it = items_.back();
    const int idx = index_of(it);
    switch (it.kind) {
      case Kind::kReasoning:
        event(out, "response.reasoning_text.done",
              Json{{"item_id", it.id}, {"output_index", idx}, {"content_index", 0}, {"text", it.text}});
        break;
      case Kind::kMessage:
        event(out, "response.output_text.done",
              Json{{"item_id", it.id},
                   {"output_index", idx},
                   {"content_index", 0},
                   {"text", it.text},
                   {"logprobs", Json::array()}});
        event(out, "response.content_part.done",
              Json{{"item_id", it.id},
                   {"output_index", idx},
                   {"content_index", 0},
                   {"part",
                    {{"type", "output_text"},
                     {"text", it.text},
                     {"annotations", Json::array()},
                     {"logprobs", Json::array()}}}});
        break;
      case Kind::kCall:
        event(out, "response.function_call_arguments.done",
              Json{{"item_id", it.id}, {"output_index", idx}, {"name", it.name}, {"arguments", it.text}});
        break;
    }
    event(out, "response.output_item.done",
          Json{{"output_index", idx}, {"item", item_json(it, "completed")}});
  }

  FormatContext ctx_;
  int64_t seq_ = 0;
  std::vector<Item> items_;
  bool open_ = false;
  Json final_;  // the response object of the last event
};

// ---------------------------------------------------------------- Anthropic Messages

class MessagesFormatter final : public ApiFormatter {
 public:
  explicit MessagesFormatter(FormatContext ctx) : ctx_(std::move(ctx)) {}

  const char* tool_id_prefix() const override { return "toolu_"; }

  void begin(const Usage& usage, std::string& out) override {
    Json msg{{"id", ctx_.id},
             {"type", "message"},
             {"role", "assistant"},
             {"model", ctx_.model},
             {"content", Json::array()},
             {"stop_reason", nullptr},
             {"stop_sequence", nullptr},
             {"usage", anthropic_usage(usage)}};
    out += sse_event("message_start", Json{{"type", "message_start"}, {"message", std::move(msg)}});
    out += sse_event("ping", Json{{"type", "ping"}});
  }

  void delta(const ChoiceText& c, const Ev& ev, std::string& out) override {
    if (c.index != 0) return;
    switch (ev.kind) {
      case Ev::Kind::kReasoning:
        open(BlockKind::kThinking, -1, c, out);
        block_delta(out, Json{{"type", "thinking_delta"}, {"thinking", ev.text}});
        break;
      case Ev::Kind::kContent:
        open(BlockKind::kText, -1, c, out);
        block_delta(out, Json{{"type", "text_delta"}, {"text", ev.text}});
        break;
      case Ev::Kind::kToolCallBegin:
        open(BlockKind::kToolUse, ev.tool_index, c, out);
        break;
      case Ev::Kind::kToolCallArgs:
        open(BlockKind::kToolUse, ev.tool_index, c, out);
        block_delta(out, Json{{"type", "input_json_delta"}, {"partial_json", ev.text}});
        break;
      case Ev::Kind::kToolCallEnd:
        close(out);
        break;
    }
  }

  void finish(const ChoiceText& c, std::string& out) override {
    if (c.index == 0) close(out);
  }

  void end(const std::vector<ChoiceText>& choices, const Usage& usage, std::string& out) override {
    const ChoiceText empty;
    const ChoiceText& c = choices.empty() ? empty : choices[0];
    Json u = anthropic_usage(usage);
    out += sse_event("message_delta",
                     Json{{"type", "message_delta"},
                          {"delta", {{"stop_reason", stop_reason(c)}, {"stop_sequence", stop_sequence(c)}}},
                          {"usage", std::move(u)}});
    out += sse_event("message_stop", Json{{"type", "message_stop"}});
  }

  void error(const std::string& message, std::string& out) override {
    out +=
        sse_event("error", Json{{"type", "error"}, {"error", {{"type", "api_error"}, {"message", message}}}});
  }

  Json response(const std::vector<ChoiceText>& choices, const Usage& usage) const override {
    const ChoiceText empty;
    const ChoiceText& c = choices.empty() ? empty : choices[0];
    Json content = Json::array();
    if (!c.reasoning.empty())
      content.push_back(Json{{"type", "thinking"}, {"thinking", c.reasoning}, {"signature", ""}});
    if (!c.content.empty() || c.calls.empty()) content.push_back(Json{{"type", "text"}, {"text", c.content}});
    for (const auto& call : c.calls)
      content.push_back(Json{{"type", "tool_use"},
                             {"id", call.id},
                             {"name", call.name},
                             {"input", arguments_object(call.arguments)}});
    return Json{{"id", ctx_.id},
                {"type", "message"},
                {"role", "assistant"},
                {"model", ctx_.model},
                {"content", std::move(content)},
                {"stop_reason", stop_reason(c)},
                {"stop_sequence", stop_sequence(c)},
                {"usage", anthropic_usage(usage)}};
  }

 private:
  enum class BlockKind { kThinking, kText, kToolUse };

  static const char* stop_reason(const ChoiceText& c) {
    if (c.finish == "tool_calls") return "tool_use";
    if (c.finish == "length") return "max_tokens";
    if (!c.stop_sequence.empty()) return "stop_sequence";
    return "end_turn";
  }
  static Json stop_sequence(const ChoiceText& c) {
    return c.stop_sequence.empty() ? Json(nullptr) : Json(c.stop_sequence);
  }

  void open(BlockKind kind, int tool_index, const ChoiceText& c, std::string& out) {
    if (open_ && kind_ == kind && tool_index_ == tool_index) return;
    close(out);
    open_ = true;
    kind_ = kind;
    tool_index_ = tool_index;
    Json block;
    switch (kind) {
      case BlockKind::kThinking:
        block = Json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}};
        break;
      case BlockKind::kText:
        block = Json{{"type", "text"}, {"text", ""}};
        break;
      case BlockKind::kToolUse: {
        std::string id, name;
        if (tool_index >= 0 && size_t(tool_index) < c.calls.size()) {
          id = c.calls[size_t(tool_index)].id;
          name = c.calls[size_t(tool_index)].name;
        }
        block = Json{{"type", "tool_use"}, {"id", id}, {"name", name}, {"input", Json::object()}};
        break;
      }
    }
    out += sse_event(
        "content_block_start",
        Json{{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(block)}});
  }

  void block_delta(std::string& out, Json delta) {
    out += sse_event("content_block_delta",
                     Json{{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(delta)}});
  }

  void close(std::string& out) {
    if (!open_) return;
    if (kind_ == BlockKind::kThinking) block_delta(out, Json{{"type", "signature_delta"}, {"signature", ""}});
    out += sse_event("content_block_stop", Json{{"type", "content_block_stop"}, {"index", index_}});
    open_ = false;
    ++index_;
  }

  FormatContext ctx_;
  bool open_ = false;
  BlockKind kind_ = BlockKind::kText;
  int tool_index_ = -1;
  int index_ = 0;
};

}  // namespace

std::unique_ptr<ApiFormatter> make_formatter(ServerApi api, FormatContext ctx) {
  switch (api) {
    case ServerApi::kChat:
      return std::make_unique<ChatFormatter>(std::move(ctx));
    case ServerApi::kCompletions:
      return std::make_unique<CompletionsFormatter>(std::move(ctx));
    case ServerApi::kResponses:
      return std::make_unique<ResponsesFormatter>(std::move(ctx));
    case ServerApi::kMessages:
      return std::make_unique<MessagesFormatter>(std::move(ctx));
  }
  return nullptr;
}

}  // namespace beluga::server
