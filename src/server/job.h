// One API request in flight: its engine sub-requests (one per prompt; n sequences each), the
// per-choice detokenizer and output parser (or stop-string matcher for plain completions), and the
// formatter that turns what they produce into the API's response or SSE events. Single-threaded:
// the connection calls it on its strand with each engine output.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/request.h"
#include "recipe/output_parser.h"
#include "server/api_format.h"
#include "tokenizer/incremental_decoder.h"
#include "tokenizer/tokenizer.h"

namespace beluga::server {

// Holds back text that may still begin a stop string; reports the first stop string that matches.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops = {});
  // Appends to `out` the text that can no longer be part of a stop string; true once one matched
  // (text from the match on is dropped).
  bool feed(std::string_view text, std::string& out);
  std::string flush();  // held text at the end of generation
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::string matched_;
};

struct JobSpec {
  ServerApi api = ServerApi::kChat;
  int n = 1;                       // sequences per prompt
  int num_prompts = 1;             // engine sub-requests
  bool use_parser = true;          // chat-style APIs: reasoning / tool calls / stop via the recipe parser
  recipe::ParserOptions parser;    // when use_parser
  std::vector<std::string> stop;   // completions: stop strings
  std::vector<std::string> echo;   // completions echo: prompt text per prompt (empty: no echo)
  std::vector<int> prompt_tokens;  // per prompt
  int logprobs = -1;               // engine logprobs asked for: -1 none; else top k alternatives
  int prompt_logprobs = -1;        // vLLM's prompt_logprobs asked for: -1 none; else top k alternatives
  // Per prompt, when the engine computes prompt logprobs (prompt_logprobs, or echo with logprobs):
  // the ids whose logprobs the engine reports (all but the first).
  std::vector<std::vector<int>> prompt_ids;
};

// The token's own text: its bytes, with each byte that is not part of a valid UTF-8 sequence
// within the token written as "\xNN" (as OpenAI does for a token holding part of a character).
std::string token_text_of_bytes(std::string_view bytes);

class Job {
 public:
  Job(JobSpec spec, const tok::Tokenizer& tokenizer, std::unique_ptr<ApiFormatter> fmt, bool stream);

  // One engine output of sub-request `sub`; stream text is appended to `out`.
  void on_output(int sub, RequestOutput&& o, std::string& out);
  // The request failed (engine error, abort): streams get the API's error event.
  void fail(const std::string& message, std::string& out);

  bool complete() const { return complete_; }  // every choice finished (or failed)
  bool failed() const { return failed_; }
  const std::string& error() const { return error_; }
  // The failure was the instance's (RequestOutput::unavailable): a 503, which a router retries.
  bool unavailable() const { return unavailable_; }
  // The engine may still be generating for `sub` (not yet reported finished).
  bool engine_active(int sub) const { return engine_active_[size_t(sub)]; }
  int num_subs() const { return spec_.num_prompts; }

  nlohmann::ordered_json response() const { return fmt_->response(choices_, usage_); }
  // The response object as the client got it: streamed, the one the last event carried (null for
  // APIs whose stream has none); otherwise response(). Call once: item ids are drawn anew each time.
  nlohmann::ordered_json final_response() const {
    return stream_ ? fmt_->streamed_response() : fmt_->response(choices_, usage_);
  }
  const Usage& usage() const { return usage_; }
  // A sub-request's prompt-cache hits (tokens in all, of them from the host and the disk tier).
  struct CachedCounts {
    int tokens = 0, host = 0, disk = 0;
  };
  CachedCounts sub_cached(int sub) const;
  // Disaggregated serving: the prompt was computed by a prefill engine, whose cache hits these are
  // (one per sub-request); they are reported instead of this engine's, which found the
  // transferred blocks. Set before the first output.
  void set_prefill_cached(std::vector<CachedCounts> c) { prefill_cached_ = std::move(c); }
  const std::vector<ChoiceText>& choices() const { return choices_; }

  // Timing for metrics (steady clock).
  std::chrono::steady_clock::time_point start_time() const { return start_; }
  std::optional<std::chrono::steady_clock::time_point> first_token_time() const { return first_token_; }

 private:
  struct Seq {
    std::unique_ptr<tok::IncrementalDecoder> decoder;
    std::optional<recipe::OutputParser> parser;
    StopMatcher stop;
    bool done = false;
    int64_t text_chars = 0;  // code points of text decoded so far (echo included)
  };

  void feed_text(size_t ci, std::string_view text, std::vector<recipe::ParserEvent>& evs, bool& reasoning);
  void finish_choice(size_t ci, FinishReason f, bool from_engine, std::vector<recipe::ParserEvent>& evs);
  void apply(size_t ci, std::vector<recipe::ParserEvent>& evs, std::string& out);
  void check_complete(std::string& out);
  void add_logprob(size_t ci, const TokenLogprob& lp, int64_t text_offset);
  LogprobAlt alt_of(int id, float logprob) const;
  // Sub-request `sub`'s first output: its choices' prompt logprobs and echo.
  void begin_sub(size_t sub, const std::vector<TokenLogprob>& prompt_lps, std::string& out);

  JobSpec spec_;
  const tok::Tokenizer& tok_;
  std::unique_ptr<ApiFormatter> fmt_;
  bool stream_;
  std::vector<Seq> seqs_;
  std::vector<ChoiceText> choices_;
  std::vector<bool> engine_active_, sub_begun_;
  std::vector<int> sub_prompt_, sub_cached_, sub_cached_host_, sub_cached_disk_;
  std::vector<CachedCounts> prefill_cached_;
  Usage usage_;
  bool begun_ = false, complete_ = false, failed_ = false;
  std::string error_;
  bool unavailable_ = false;
  std::chrono::steady_clock::time_point start_;
  std::optional<std::chrono::steady_clock::time_point> first_token_;
};

}  // namespace beluga::server
