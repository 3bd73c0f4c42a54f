// One generation request on a connection (chat, completions, responses, messages): its body is
// parsed, templated and tokenized on the build pool, its prompts are submitted to the engine, and
// the engine's outputs become the API's response or SSE stream, written through the Session that
// owns it. Runs on that session's strand only; at most one generation per session at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "recipe/api_error.h"
#include "server/api_format.h"
#include "server/disaggregation.h"
#include "server/job.h"
#include "server/request_builder.h"
#include "server/response_store.h"

namespace beluga::server {

class Session;

class Generation {
 public:
  explicit Generation(Session& s) : s_(s) {}
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // Starts building the request: `salt` is the request's API key (prefix-cache salt, store tenant),
  // `header_class` its x-traffic-class header, `pd` its part in disaggregated serving
  // (disaggregation.h).
  void start(ServerApi api, std::string salt, std::string header_class, PdRequest pd, std::string body);

  // Ends the generation in whatever state it is: its engine requests are aborted, outputs still on
  // their way and a build in progress become stale. Returns the stream's last events (the API's
  // error event) when `stream_open` (the stream's head went out), else nothing.
  std::string cut_short(const std::string& msg, bool stream_open);
  // The client went away while generating: the engine requests are aborted and the request is
  // counted and logged as 499.
  void on_client_gone();
  // The client went away (or misbehaved) while the request was being built; the build's result
  // closes the connection.
  void mark_client_gone() { client_gone_ = true; }

  ServerApi api() const { return api_; }
  bool building() const { return building_; }
  bool active() const { return active_; }            // submitted to the engine, not yet complete
  bool stream_mode() const { return stream_mode_; }  // the response is an SSE stream
  const Job* job() const { return job_.get(); }

 private:
  // What a build task hands back to the session's strand.
  struct Built {
    std::optional<BuiltRequest> request;
    std::optional<recipe::ApiError> client_error;  // the request is invalid
    std::string internal_error;                    // not empty: a bug while building
  };

  void on_built(uint64_t gen, Built r);
  // Submits the built request's prompts to the engine and starts the response.
  void start_job(BuiltRequest b);
  void on_engine_output(uint64_t gen, int sub, RequestOutput&& o);
  // `out`: the stream's last events.
  void finish_job(std::string out);
  // A prefill for another engine ran: its blocks are sent off the strand, then reported.
  void finish_prefill();
  void on_prefill_sent(uint64_t gen, PrefillReport report);
  void set_building_done();

  Session& s_;
  ServerApi api_ = ServerApi::kChat;
  std::unique_ptr<Job> job_;
  std::shared_ptr<StoredResponse> to_store_;  // Responses with store: kept once the job completes
  std::vector<std::string> ids_;
  std::string header_class_;  // the request's x-traffic-class header
  uint64_t gen_ = 0;          // bumped when outputs (or a build) in flight become stale
  bool active_ = false, stream_mode_ = false;
  bool building_ = false, client_gone_ = false;  // on the build pool; the client left meanwhile
  std::string salt_;                             // the request's API key (prefix-cache salt, store tenant)
  PdRequest pd_;
  std::vector<std::vector<int>> prefill_prompts_;  // a prefill's prompts, for sending their blocks
  std::string traffic_class_;
};

}  // namespace beluga::server
