// Engine output -> each API's response JSON and SSE stream. A formatter sees the choices' text as
// the job (job.h) parses it: reasoning / content / tool-call deltas per choice, then a finish per
// choice, then the end with usage. Streamed and non-streamed responses come from the same state.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "recipe/output_parser.h"

namespace beluga::server {

enum class ServerApi { kChat, kCompletions, kResponses, kMessages };

struct ToolCallOut {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text as the model wrote it
};

// One alternative of a token position (OpenAI's top_logprobs entries).
struct LogprobAlt {
  std::string token;  // the token's own text; bytes that are not UTF-8 on their own as "\\xNN"
  std::string bytes;  // the raw bytes the token decodes to
  float logprob = 0.0f;
};

// One token's logprobs, as text: a generated token's, or (completions echo) a prompt token's.
struct TokenLogprobOut {
  LogprobAlt chosen;
  std::vector<LogprobAlt> top;  // best first (empty unless top logprobs were asked for)
  int64_t text_offset = 0;      // completions: code points of the choice's text before this token
  bool no_logprob = false;      // the first prompt token: nothing before it (null logprob and top)
};

// One entry of vLLM's prompt_logprobs ({token id: {logprob, rank, decoded_token}}).
struct PromptLogprobAlt {
  int id = 0;
  float logprob = 0.0f;
  int rank = 0;
  std::string decoded;
};
// vLLM's prompt_logprobs of one prompt: per prompt token, the token itself then its top alternatives;
// the first token's is empty (null: nothing precedes it).
using PromptLogprobs = std::vector<std::vector<PromptLogprobAlt>>;

// One generated sequence as text, accumulated so far.
struct ChoiceText {
  int index = 0;
  std::string reasoning;
  std::string content;
  std::vector<ToolCallOut> calls;
  std::string finish;         // "stop" | "length" | "tool_calls"; empty while generating
  std::string stop_sequence;  // the stop string that ended it, if one did
  int tokens = 0;             // generated tokens (the stopping EOS excluded)
  int reasoning_tokens = 0;
  // Per generated token when logprobs were asked for (chat: content tokens only; completions with
  // echo: the prompt's tokens first). A streaming formatter sends the entries added since its last
  // event for the choice.
  std::vector<TokenLogprobOut> logprobs;
  // vLLM's prompt_logprobs of the choice's prompt, once known (the engine's first output for it).
  std::optional<PromptLogprobs> prompt_logprobs;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t reasoning_tokens = 0;
  int64_t cached_tokens_host = 0,
          cached_tokens_disk = 0;  // of cached_tokens, from the tiers below the device
};

// What every formatter needs to know about its request.
struct FormatContext {
  std::string id;  // response id (chatcmpl-…, cmpl-…, resp_…, msg_…)
  std::string model;
  int64_t created = 0;
  int n = 1;                     // choices
  bool include_usage = false;    // chat / completions streams: a final usage chunk
  int logprobs = -1;             // chat / completions: -1 no logprobs; else k top alternatives
  bool prompt_logprobs = false;  // chat / completions (not streamed): vLLM's prompt_logprobs field
  nlohmann::ordered_json request = nlohmann::ordered_json::object();  // the request body (echoed fields)
  // With include_usage (vLLM's stream_options.continuous_usage_stats): every chunk of a choice's text
  // also carries usage, completion_tokens being the tokens that choice has generated so far, so a
  // client can tell how many tokens each chunk delivered.
  bool continuous_usage = false;
};

class ApiFormatter {
 public:
  virtual ~ApiFormatter() = default;
  // Prefix of tool-call ids for this API ("call_", "toolu_").
  virtual const char* tool_id_prefix() const { return "call_"; }
  // Stream: the opening events (called once, when the first engine output arrives).
  virtual void begin(const Usage& usage, std::string& out) = 0;
  // Stream: one delta of choice `c` (already appended to c).
  virtual void delta(const ChoiceText& c, const recipe::ParserEvent& ev, std::string& out) = 0;
  // Stream: choice `c` finished (c.finish set).
  virtual void finish(const ChoiceText& c, std::string& out) = 0;
  // Stream: every choice finished.
  virtual void end(const std::vector<ChoiceText>& choices, const Usage& usage, std::string& out) = 0;
  // Stream: the request failed after the stream began.
  virtual void error(const std::string& message, std::string& out) = 0;
  // The non-streamed response (item ids are drawn anew on each call).
  virtual nlohmann::ordered_json response(const std::vector<ChoiceText>& choices,
                                          const Usage& usage) const = 0;
  // Stream: the complete response object the stream ended with, for APIs whose last event carries
  // one (Responses: what is stored for GET /v1/responses/{id}); null otherwise or before end().
  virtual nlohmann::ordered_json streamed_response() const { return nullptr; }
};

std::unique_ptr<ApiFormatter> make_formatter(ServerApi api, FormatContext ctx);

// Usage objects of each API (OpenAI chat/completions carry DeepSeek's cache fields too).
nlohmann::ordered_json openai_usage(const Usage& u);
nlohmann::ordered_json responses_usage(const Usage& u);
nlohmann::ordered_json anthropic_usage(const Usage& u);

// Tool-call arguments as a JSON object (Anthropic `input`): invalid text becomes {"arguments": text}.
nlohmann::ordered_json arguments_object(const std::string& text);

}  // namespace beluga::server
