// Engine::Impl: the engine thread's state (engine.h's private part), shared by the loop (engine.cc)
// and the step launcher (engine_launch.cc). Only the engine thread touches it, except the model
// runner's own members (model_runner.h).
#pragma once

#include <climits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/block_manager.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/spec_decode.h"
#include "engine/step_masks.h"
#include "util/trace.h"

namespace beluga {

struct Engine::Impl {
  struct Request {
    EngineRequest req;
    std::vector<std::unique_ptr<Seq>> seqs;
    std::vector<int> stop_ids;
    std::vector<std::unique_ptr<LogitsProcessor>> procs;  // per sequence, when constrained
    std::vector<int> prompt_set;  // distinct prompt tokens, sorted (repetition penalty only)
    uint64_t seed = 0;
    int unfinished = 0;
    // Prompt logprobs (sampling.prompt_logprobs >= 0). Whichever sequence's prefill reaches a prompt
    // position first scores it, and each position is scored once: a sequence recomputing after a
    // preemption, or a later one of the n, adds no rows for positions already asked for.
    bool prompt_lps_pending = false;       // asked for and not yet sent
    std::vector<TokenLogprob> prompt_lps;  // prompt token i+1's entry at i
    int prompt_lp_next = 0;  // positions with a row so far (applied or in the batch being built)
    // Every Seq's prefix_cap: the positions scored so far may come from the prefix cache, the others
    // must be computed (their logits are needed). INT_MAX when nothing is pending.
    int prefix_cap = INT_MAX;
  };
  // A logit row of the step in flight, by (request slot, sequence index) rather than Seq*: the
  // request may be aborted (and its Seqs freed) before the step's results are applied.
  struct Row {
    int slot, index;
    int prompt_pos;  // -1: samples the sequence's next token; else scores prompt token prompt_pos + 1
    int draft = 0;   // speculative: the row after the draft-th draft token of batch sequence `bseq`
    int bseq = -1;   // >= 0: that batch sequence's verification sampled this row (SpecDecoder::token)
  };

  // `ranks`: data-parallel ranks, each with a cache of num_blocks (1: none).
  Impl(Model& m, const EngineConfig& cfg, int num_blocks, int ranks)
      : model(m),
        vocab(m.config().vocab_size),
        mask_words((size_t(vocab) + 31) / 32),
        spec(cfg.speculative.enabled()
                 ? std::make_unique<SpecDecoder>(
                       m, cfg.speculative, num_blocks,
                       cfg.max_num_batched_tokens +
                           cfg.max_num_seqs * (cfg.speculative.num_speculative_tokens + 1),
                       cfg.mtp_ahead >= 0 ? cfg.mtp_ahead > 0 : m.ops().device() != Device::kCpu)
                 : nullptr),
        blocks(num_blocks * ranks, cfg.enable_prefix_caching, cfg.kv_events, ranks),
        policy(cfg.latency),
        scheduler(blocks, cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.kv_connector,
                  spec ? spec->lookahead() : 0,
                  cfg.latency.budget_on() || cfg.latency.admission_on() ? &policy : nullptr),
        kv(m.make_kv_cache(num_blocks)),
        kv_connector(cfg.kv_connector),
        trace(cfg.trace_path.empty() ? nullptr : std::make_unique<Tracer>(cfg.trace_path)),
        trace_lane(trace ? trace->add_lane("engine loop") : 0),
        runner(m, kv, cfg.step_hook, trace.get(), spec.get(),
               cfg.deterministic ? MlaMode::kAbsorbed : MlaMode::kAuto,
               cfg.poll_micros >= 0               ? cfg.poll_micros
               : m.ops().device() == Device::kCpu ? 0
                                                  : 2000),
        device_sampling(cfg.device_sampling && m.has_sampler() && ranks == 1),
        deterministic(cfg.deterministic),
        mask_filler(cfg.mask_threads >= 0 ? cfg.mask_threads
                                          : MaskFiller::default_workers(std::thread::hardware_concurrency())),
        masks(mask_filler),
        host_step_masks(mask_filler) {}

  Model& model;
  const int vocab;
  const size_t mask_words;            // of a token mask: ceil(vocab / 32)
  std::unique_ptr<SpecDecoder> spec;  // speculative decoding, or null
  std::vector<const SamplingParams*>
      spec_eligible;  // per chunk of the step being built (SpecDecoder::begin_step)
  BlockManager blocks;
  LatencyPolicy policy;  // before scheduler, which keeps a pointer to it
  Scheduler scheduler;
  KvCache kv;
  KvConnector* kv_connector;
  std::unique_ptr<Tracer> trace;  // null: tracing off. Before runner: written after its thread stops
  int trace_lane;
  ModelRunner runner;                         // after kv: its thread uses kv, so it must stop first
  std::unordered_map<int, Request> requests;  // by slot
  std::unordered_map<std::string, int> slot_of;
  int next_slot = 0;
  int64_t next_order = 0;
  std::mt19937_64 seed_source{std::random_device{}()};
  EngineStats stats;

  // Reused every step (the loop allocates little once warm).
  std::vector<Chunk> chunks;  // the next step: scheduled before the step in flight is done
  Batch batch;
  std::vector<Row> rows;        // the step in flight: one per logit row
  std::vector<int> step_slots;  // the step in flight: its requests (sorted, unique)
  // The step launched early (behind the one in flight, before its tokens are applied): its rows and
  // requests, which become `rows` and `step_slots` once the step before it is done.
  std::vector<Row> next_rows;
  std::vector<int> next_slots;
  bool early_future = false;           // the early step names the step in flight's tokens (future tokens)
  bool masks_unreleased = false;       // the last launched step waits for masks the engine still owes it
  bool saves_unreleased = false;       // and for its KV saves (an early step with a KV connector)
  bool early_pending = false;          // an early step is in flight, not yet finished (finish_early)
  SpecStep spec_step, next_spec_step;  // speculation: the step in flight's plan, the early step's
  std::vector<std::pair<int, int>> mask_seqs;  // (slot, index) of each of `masks`' rows being launched
  std::vector<int> published;             // the step in flight: blocks its commit put in the prefix index
  std::vector<BlockHash> published_keys;  // their keys
  std::vector<const std::string*> published_classes;  // their sequences' traffic classes
  KvStepCopies kv_copies;                             // the step being launched: its KV connector copies
  // Speculation: blocks of accepted drafts published after their step (SpecDecoder::after_apply),
  // saved with the next step (KvStepCopies::saves_first).
  std::vector<int> verified;
  std::vector<BlockHash> verified_keys;
  std::vector<const std::string*> verified_classes;
  std::vector<KvCopy> verified_saves;
  std::vector<std::pair<int, RequestOutput>> outs;  // (slot, output) of the last applied step
  std::unordered_map<int, size_t> out_of;           // slot -> index in outs
  std::vector<int> failed;
  std::vector<float> scratch;
  std::vector<int> index_scratch;
  const bool device_sampling;  // steps may sample on the device (EngineConfig::device_sampling)
  const bool deterministic;    // EngineConfig::deterministic: unseeded requests use seed 0
  DeviceSampling dsamp;        // the step being launched: its device-sampling rows and masks
  // Constrained rows' masks, filled together (step_masks.h): the step being launched's device rows
  // (into dsamp.masks; an early step's are filled after the step before it is applied), and the
  // applied step's host rows (into host_masks, [masks, words]).
  MaskFiller mask_filler;
  StepMasks masks;
  StepMasks host_step_masks;
  std::vector<uint32_t> host_masks;
  std::vector<int> row_mask;  // host rows: each row's index in `masks`, or -1

  // Step d, building and launching step N+1 (engine_launch.cc): a sequence's device-sampling row (or
  // false: the step samples on the host), and the whole step. With `async_scheduling`, constrained
  // rows' masks are filled while the forward runs.
  bool add_device_row(Request& rq, const Seq& s, int ahead = 0);
  // The sampler's view of sequence s's next token: output number num_output() + pending (its seed's
  // step; pending is 0 once the step ahead is applied).
  static SampleContext sample_context(const Request& rq, const Seq& s) {
    SampleContext ctx{&rq.req.sampling, &rq.req.prompt, &s.output_counts, s.num_output() + s.pending,
                      &rq.stop_ids,     rq.seed,        s.index};
    ctx.prompt_set = &rq.prompt_set;
    return ctx;
  }
  // Builds and launches step N+1 from `chunks`. Early (async scheduling, step N still in flight and
  // its tokens not applied): N's pending tokens go in as future tokens (model_runner.h), and the
  // commit, the masks and the pending marks wait for finish_early(); an early build returns false,
  // launching nothing, when the step would sample on the host.
  bool launch_next(bool async_scheduling, bool early = false);
  // Whether step N+1 may be launched early: no part that needs the host between the steps
  // (a step that drafts, KV loads, expert-parallel peers, prompt logprobs) and N's tokens come back
  // as ids.
  bool can_launch_early();
  // spec_eligible for `chunks`: each one's sampling parameters if its sequence may speculate.
  void find_spec_eligible();
  // After step N is applied: the early step N+1's commit (its chunks' tokens are known now) with its
  // KV saves, its constrained rows' masks (their processors have taken N's tokens) and pending marks.
  void finish_early();
  // Commits `chunks` (scheduler and KV connector) once their tokens are known.
  void commit_chunks(KvStepCopies*& copies);
  // After a speculating step is applied: the verifier's accepted positions committed
  // (SpecDecoder::after_apply) and the blocks they fill handed to the KV connector to save.
  void commit_verified();
  // Marks the launched step's sampling chunks pending, naming each one's logit row.
  void mark_pending();
};

}  // namespace beluga
