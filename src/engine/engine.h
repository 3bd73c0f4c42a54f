// Engine: owns a Model and its paged KV cache and runs the serving loop on its own thread:
// schedule -> build batch -> forward -> sample -> emit outputs, with the forward on a thread of its
// own (ModelRunner) so that the CPU work of step N+1 overlaps the model's work on step N.
// Thread-safe submit/abort; outputs go to each request's callback on the engine thread.
// Failure boundary: an exception escaping any part of a loop iteration (scheduling, sampling, batch
// building, a request's output callback) fails the requests it concerns and the loop goes on; a
// callback that throws fails only its own request. The queue limit counts sequences (n per request).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/kv_connector.h"
#include "engine/kv_events.h"
#include "engine/latency_policy.h"
#include "engine/request.h"
#include "engine/spec_config.h"
#include "model/model.h"

namespace beluga {

struct EngineConfig {
  int max_num_seqs = 64;              // sequences decoding at once
  int max_num_batched_tokens = 2048;  // tokens per step (prefill chunks + decodes)
  // 0: from kv_cache_bytes. Per rank when the model's step peers are attention data parallel
  // (model/data_parallel_split.h): each rank's cache is its own, the block manager partitions the
  // blocks of all, a sequence must fit one rank's, and steps sample on the host.
  int num_kv_blocks = 0;
  size_t kv_cache_bytes = size_t(1) << 30;
  int max_model_len = 0;    // 0: the model's max positions
  int max_queue_len = 256;  // waiting sequences (each request counts n); beyond it submit() says kQueueFull
  bool enable_prefix_caching = true;
  // The tail-latency policy (latency_policy.h): an ITL target that bounds each step's prefill by the
  // fitted step cost, and a TTFT SLO that orders admission. Both off by default: today's scheduling.
  LatencyConfig latency;
  // Speculative decoding (spec_decode.h); off unless enabled(). Needs a model with an MTP module and
  // no kv_connector (yet). While on, steps do not overlap: each one plans from the last one's accepts.
  SpecConfig speculative;
  // The tiers below the device pool (src/kvstore), or none. Not owned; outlives the engine. Its
  // block_bytes() must be the model's KV bytes per block.
  KvConnector* kv_connector = nullptr;
  // Hears the device prefix cache's stored/removed blocks (engine/kv_events.h), or null. Not owned;
  // outlives the engine. Called on the engine thread.
  KvEventSink* kv_events = nullptr;
  // Overlap (the default): step N+1 is scheduled while step N computes, and N's outputs go out while
  // N+1 computes; where every row of N+1 samples without the host and N returns ids (greedy or
  // device sampling), N+1 is launched before N's tokens are applied (`early_launch`: the runner puts
  // N's ids in and starts N+1 the moment N is done; masks of constrained rows follow once N is
  // applied). Off: the serial reference, each step scheduled, launched, waited for, sampled and
  // delivered before the next one starts (the same tokens; for comparing and debugging).
  bool async_scheduling = true;
  bool early_launch = true;  // with async_scheduling; off: launched after N is applied (A/B, tests)
  // How long the engine thread and the model runner's poll for each other (yielding) before they
  // block (ModelRunner): a wake-up costs tens of microseconds, a small model's whole step on a GPU.
  // -1: 2000 on a device backend, 0 on the CPU (whose compute threads want the cores). While steps
  // run back to back both threads stay busy (yielding to any other runnable thread); an idle engine
  // polls at most once, for this long, after its last step.
  int poll_micros = -1;
  // Speculative decoding: whether a step of greedy decodes queues its first MTP pass behind the
  // verify forward before the host verifies (SpecDecoder::mtp_ahead). -1: on a device backend, whose
  // queue runs the pass while the host verifies; off on the CPU, where nothing overlaps and the pass
  // would only compute more logit rows; 0 / 1: off / on (tests).
  int mtp_ahead = -1;
  // Steps whose every sample row needs no sequence history (sampler.h: samples_on_device) sample on
  // the device when the model has a sampler (CUDA), constrained rows with their masks uploaded with
  // the step; off (`--no-device-sampling`): the logits come to the host sampler (the reference).
  bool device_sampling = true;
  // Threads beside the engine thread that fill constrained rows' token masks in parallel
  // (mask_filler.h); -1: MaskFiller::default_workers (none below 8 cores, up to 7), 0: the engine
  // thread alone (`--grammar-threads`).
  int mask_threads = -1;
  // Deterministic mode (`--deterministic`, docs/deterministic.md): a request gives the same token ids
  // and logprobs alone or in any batch, with or without prefix-cache hits and chunked prefill. The
  // engine's part: one attention form for every step (MLA absorbed, not chosen by the step's longest
  // query) and seed 0 for requests without one. The backend must be batch invariant too
  // (CpuOptions::deterministic). Not with speculative decoding (its drafts depend on the batch).
  bool deterministic = false;
  // Non-empty: write a Chrome-trace JSON of the loop's host spans (per step: admit, schedule, wait,
  // sample, build batch, launch, deliver) and the model runner's forwards to this file when the engine
  // stops (src/util/trace.h; `beluga serve` takes it from BELUGA_TRACE). Empty: no tracing cost.
  std::string trace_path;
  // Testing aid: called on the model thread before each step's forward with the step's number
  // (0, 1, ...); an exception it throws fails the step like a forward error.
  std::function<void(int64_t step)> step_hook;
  // Testing aid: called on the engine thread after each step's results are applied, with the number
  // of steps finished so far (1, 2, ...); an exception it throws takes the loop's failure path (the
  // requests of the steps in hand fail, the engine keeps serving the others).
  std::function<void(int64_t steps)> loop_hook;
};

// kUnavailable: no engine to take it right now (server/restartable_engine.h: restarting).
enum class SubmitStatus { kOk, kQueueFull, kPromptTooLong, kInvalid, kUnavailable };

struct EngineStats {
  int64_t requests_finished = 0;
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
  int64_t prefix_cache_queries = 0;     // prompt tokens looked up
  int64_t prefix_cache_hits = 0;        // of which served from cache (every tier)
  int64_t prefix_cache_hits_below = 0;  // of which loaded from below the device pool
  int64_t preemptions = 0;
  int64_t steps = 0;
  // Steps whose forward threw, plus loop iterations whose exception the step boundary caught (their
  // requests failed); `steps` counts every finished forward, failed ones included, so the two tell
  // the server's /health whether recent steps fail.
  int64_t steps_failed = 0;
  // Steps launched before the previous step's tokens reached the engine (their tokens resolved on
  // the runner: the overlap of `async_scheduling`), and those of them skipped and launched again.
  int64_t steps_early = 0;
  int64_t steps_early_retried = 0;
  // Steps whose rows the host sampler took from copied-back logits (prompt logprobs, top logprobs with
  // logit edits, masks the device could not take, backends without a device sampler); device sampling and
  // device argmaxes are the rest.
  int64_t steps_host_sampled = 0;
  int64_t last_step_unix_ms = 0;  // when the loop last finished an iteration (liveness)
  int running = 0;
  int waiting = 0;
  int kv_blocks_total = 0;
  int kv_blocks_used = 0;  // referenced by live sequences (cached-but-free blocks are not counted)
  std::vector<int> kv_blocks_used_by_rank;  // data parallel: kv_blocks_used of each rank's cache
  // Speculative decoding (all zero when off), as vLLM's spec_decode metrics.
  int64_t spec_drafts = 0;                          // sequence-steps that verified at least one draft token
  int64_t spec_draft_tokens = 0;                    // draft tokens verified
  int64_t spec_accepted_tokens = 0;                 // of which accepted
  std::vector<int64_t> spec_accepted_per_position;  // [num_speculative_tokens]
};

class Engine {
 public:
  Engine(Model& model, const EngineConfig& cfg);
  ~Engine();  // stops the loop; pending requests finish with kAbort
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  SubmitStatus submit(EngineRequest req, std::string* why = nullptr);
  void abort(const std::string& request_id);  // no-op for unknown or finished ids
  EngineStats stats() const;
  int max_model_len() const { return max_model_len_; }
  const ModelConfig& model_config() const { return model_.config(); }

 private:
  struct Impl;
  void loop();

  Model& model_;
  EngineConfig cfg_;
  int max_model_len_;
  std::unique_ptr<Impl> impl_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<EngineRequest> incoming_;
  int incoming_seqs_ = 0;  // sequences (sum of n) in incoming_, for the queue limit
  std::vector<std::string> aborts_;
  bool stop_ = false;
  int waiting_count_ = 0;  // sequences the scheduler has not admitted yet (for the queue limit)
  EngineStats published_stats_;
  std::thread thread_;
};

}  // namespace beluga
