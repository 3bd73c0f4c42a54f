#include "engine/engine.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <climits>
#include <cstdio>
#include <random>
#include <unordered_map>

#include "engine/engine_impl.h"
#include "util/error.h"
#include "util/trace.h"

namespace beluga {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kError:
      return "error";
  }
  return "?";
}

namespace {

int blocks_for_bytes(const Model& m, size_t bytes) {
  const size_t per_block = m.kv_bytes_per_token() * kKvBlockSize;
  return int(std::max<size_t>(1, bytes / std::max<size_t>(per_block, 1)));
}

}  // namespace

Engine::Engine(Model& model, const EngineConfig& cfg) : model_(model), cfg_(cfg) {
  max_model_len_ =
      cfg.max_model_len > 0 ? std::min(cfg.max_model_len, model.max_positions()) : model.max_positions();
  const int num_blocks =
      cfg.num_kv_blocks > 0 ? cfg.num_kv_blocks : blocks_for_bytes(model, cfg.kv_cache_bytes);
  BELUGA_CHECK(int64_t(num_blocks) * kKvBlockSize >= max_model_len_, "the KV cache (", num_blocks,
               " blocks of ", kKvBlockSize, " tokens) cannot hold one sequence of max_model_len ",
               max_model_len_, " tokens; give it more memory or lower --max-model-len");
  const StepPeers* peers = model.step_peers();
  const int dp = peers && peers->data_parallel() ? peers->ranks() : 1;  // caches of num_blocks each
  if (cfg.kv_connector)
    BELUGA_CHECK(cfg.kv_connector->block_bytes() == kv_block_image_bytes(model, cfg.speculative),
                 "the KV connector's blocks are ", cfg.kv_connector->block_bytes(), " bytes, the model's ",
                 kv_block_image_bytes(model, cfg.speculative),
                 cfg.speculative.method == SpecConfig::Method::kMtp ? " (with the MTP layer)" : "");
  impl_ = std::make_unique<Impl>(model, cfg, num_blocks, dp);
  impl_->stats.kv_blocks_total = num_blocks * dp;
  if (dp > 1) impl_->stats.kv_blocks_used_by_rank.assign(size_t(dp), 0);
  published_stats_ = impl_->stats;  // /metrics shows the cache's size before the first request
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

SubmitStatus Engine::submit(EngineRequest req, std::string* why) {
  auto say = [&](SubmitStatus s, std::string msg) {
    if (why) *why = std::move(msg);
    return s;
  };
  const int V = model_.config().vocab_size;
  if (req.prompt.empty()) return say(SubmitStatus::kInvalid, "the prompt is empty");
  for (int t : req.prompt)
    if (t < 0 || t >= V)
      return say(SubmitStatus::kInvalid, str("token id ", t, " is outside the vocabulary"));
  const SamplingParams& p = req.sampling;
  if (p.n < 1 || p.n > 128) return say(SubmitStatus::kInvalid, "n must be between 1 and 128");
  if (p.max_tokens < 1) return say(SubmitStatus::kInvalid, "max_tokens must be at least 1");
  if (p.temperature < 0 || p.top_p <= 0 || p.top_p > 1 || p.top_k < 0 || p.min_p < 0 || p.min_p > 1 ||
      p.repetition_penalty <= 0 || p.min_tokens < 0 || p.logprobs > 20 || p.prompt_logprobs < -1 ||
      p.prompt_logprobs > 20)
    return say(SubmitStatus::kInvalid, "sampling parameters out of range");
  if (int64_t(req.prompt.size()) + p.max_tokens > max_model_len_)
    return say(SubmitStatus::kPromptTooLong,
               str("this model's maximum context length is ", max_model_len_, " tokens; the request has ",
                   req.prompt.size(), " prompt tokens and asks for ", p.max_tokens, " more"));
  if (p.n > cfg_.max_queue_len)
    return say(SubmitStatus::kInvalid, str("n = ", p.n, " sequences can never fit the engine's queue of ",
                                           cfg_.max_queue_len, " sequences"));
  {
    std::lock_guard<std::mutex> lk(mu_);
    // Counted in sequences: a request with n = 128 takes as much of the queue as 128 requests.
    if (incoming_seqs_ + waiting_count_ + p.n > cfg_.max_queue_len)
      return say(SubmitStatus::kQueueFull, "the server's request queue is full; retry later");
    incoming_seqs_ += p.n;
    incoming_.push_back(std::move(req));
  }
  cv_.notify_one();
  return SubmitStatus::kOk;
}

void Engine::abort(const std::string& id) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    aborts_.push_back(id);
  }
  cv_.notify_one();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return published_stats_;
}

// One iteration of the loop, with step N on the runner (if any):
//   a. take new requests and aborts; admit; abort (rows of N belonging to aborted requests are skipped
//      later: they are looked up by slot).
//   b. schedule step N+1 as chunks only, planning with tokens N has not sampled yet (Seq::pending).
//      Where nothing in N+1 needs the host between the steps (Impl::can_launch_early), build and
//      launch it now with N's tokens as future tokens (the runner fills them in and starts N+1 the
//      moment N is done); its commit, masks and pending marks follow c (settle_early).
//   c. wait for N; sample its rows and apply them (append or finish); drop the chunks of sequences
//      that finished from N+1 (an early N+1 computes their rows for nothing).
//   d. (not launched early) build N+1's batch (every token is known now), launch it, commit it at
//      once: the runner runs steps in order, so N+2 sees N+1's KV even though N+1 may still be
//      computing.
//      Requests that want prompt logprobs add a logit row per prompt position not yet asked for;
//      such a step takes the logits back (no device argmax).
//   e. while N+1 runs: emit N's outputs, retire finished requests, publish stats.
// Blocks freed in a or c (abort, finish, preemption) may still be written by step N and may be handed
// to another sequence in N+1 at once. That is safe only because steps run in order on one thread and
// a step writes every KV slot of its new tokens before it reads them: N+1 never sees N's stale data.
namespace {

// A request's callback, fenced: a throwing callback is the server's bug for that request alone, so
// it is logged and reported to the caller (false), never allowed to unwind the engine loop.
bool deliver(const EngineRequest& req, RequestOutput&& out) noexcept {
  if (!req.on_output) return true;
  try {
    req.on_output(std::move(out));
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "beluga engine: the output callback of request %s threw: %s\n", req.id.c_str(),
                 e.what());
  } catch (...) {
    std::fprintf(stderr, "beluga engine: the output callback of request %s threw\n", req.id.c_str());
  }
  return false;
}

// Seconds on a steady clock: Seq::arrival and the scheduler's `now` (the TTFT SLO's aging).
double clock_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A request's prefix-cache accounting, as its first sequence found it at first admission.
void set_cached(RequestOutput& out, const Seq& s) {
  out.cached_tokens = s.num_cached;
  out.cached_tokens_disk = s.num_cached_disk;
  out.cached_tokens_host = s.num_cached_below - s.num_cached_disk;
}

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void Engine::loop() {
  Impl& im = *impl_;
  const int V = model_.config().vocab_size;
  const size_t words = (size_t(V) + 31) / 32;  // of a token mask
  Tracer* const tr = im.trace.get();           // null: every TraceSpan below is a no-op
  const int lane = im.trace_lane;
  // submit()'s view of the queue, made exact before a callback runs: a caller that sees its request
  // end (an abort, say) and submits again must not find the old sequences still counted.
  auto publish_waiting = [&] {
    std::lock_guard<std::mutex> lk(mu_);
    waiting_count_ = im.scheduler.num_waiting();
  };
  auto emit_final = [&](int slot, FinishReason why, const std::string& error, bool unavailable = false) {
    auto it = im.requests.find(slot);
    if (it == im.requests.end()) return;
    Impl::Request& r = it->second;
    RequestOutput out;
    out.request_id = r.req.id;
    out.prompt_tokens = int(r.req.prompt.size());
    if (!r.seqs.empty()) set_cached(out, *r.seqs[0]);
    for (auto& s : r.seqs) {
      if (s->finish != FinishReason::kNone) continue;
      s->finish = why;
      im.scheduler.remove(s.get());
      SeqOutput so;
      so.index = s->index;
      so.finish = why;
      out.seqs.push_back(std::move(so));
    }
    out.finished = true;
    out.error = error;
    out.unavailable = unavailable;
    publish_waiting();
    deliver(r.req, std::move(out));  // the request ends here whether or not its callback copes
    im.slot_of.erase(r.req.id);
    im.requests.erase(it);
    im.stats.requests_finished++;
  };

  // Host-sampled step N: the masks of its constrained rows (the rows apply_step samples with a
  // processor), all at once.
  auto prefill_host_masks = [&] {
    im.host_step_masks.clear();
    im.row_mask.assign(im.rows.size(), -1);
    for (size_t r = 0; r < im.rows.size(); ++r) {
      auto it = im.requests.find(im.rows[r].slot);
      if (it == im.requests.end() || it->second.procs.empty() || im.rows[r].prompt_pos >= 0) continue;
      const Seq& s = *it->second.seqs[size_t(im.rows[r].index)];
      if (s.finish != FinishReason::kNone) continue;
      im.row_mask[r] =
          im.host_step_masks.add(it->second.procs[size_t(s.index)].get(), im.host_step_masks.size() * words);
    }
    if (im.host_step_masks.empty()) return;
    im.host_masks.assign(im.host_step_masks.size() * words, 0);
    im.host_step_masks.fill(im.host_masks.data(), V);
  };

  // Step N's results: sample each row as a synchronous engine would, append the token or finish.
  auto apply_step = [&] {
    const bool on_device = im.runner.device_sampled();  // the masks went with the step (step d)
    if (!on_device) prefill_host_masks();
    if (!on_device && !im.runner.greedy() && !im.rows.empty()) im.stats.steps_host_sampled++;
    for (size_t r = 0; r < im.rows.size(); ++r) {
      if (im.rows[r].draft > 0 && im.rows[r].draft > im.spec->accepted(im.rows[r].bseq))
        continue;  // rejected
      auto it = im.requests.find(im.rows[r].slot);
      if (it == im.requests.end()) continue;  // aborted while the step ran
      Impl::Request& rq = it->second;
      if (const int p = im.rows[r].prompt_pos; p >= 0) {
        // Rows were handed out in position order, each position once, all before the request's
        // first sampled token (see step d).
        BELUGA_ASSERT(rq.prompt_lps_pending && int(rq.prompt_lps.size()) == p);
        rq.prompt_lps.push_back(token_logprob(im.runner.logits() + r * size_t(V), V,
                                              rq.req.prompt[size_t(p) + 1], rq.req.sampling.prompt_logprobs,
                                              im.scratch, im.index_scratch));
        rq.prefix_cap = p + 1;
        continue;
      }
      Seq* s = rq.seqs[size_t(im.rows[r].index)].get();
      s->pending = 0;
      if (s->finish != FinishReason::kNone) continue;
      SampleContext ctx = Impl::sample_context(rq, *s);  // pending is 0: ctx's step is num_output()
      LogitsProcessor* proc = rq.procs.empty() ? nullptr : rq.procs[size_t(s->index)].get();
      std::string proc_error;
      if (proc && !on_device) {
        // Structured output: the processor's mask (EOS only where the grammar accepts).
        const int j = im.row_mask[r];
        BELUGA_ASSERT(j >= 0 && im.host_step_masks.proc(j) == proc);
        proc_error = im.host_step_masks.problem(j);
        ctx.allowed = im.host_step_masks.mask(j);
      }
      SampleResult res{};
      if (proc_error.empty()) {      // else the sequence fails below
        if (im.rows[r].bseq >= 0) {  // speculating: verification sampled it (draft_verifier.h)
          res.token = im.spec->token(im.rows[r].bseq, im.rows[r].draft);
        } else if (on_device) {
          const int32_t* o = im.runner.sampled() + r * size_t(kSampleOutCols);
          res.token = o[0];
          if (rq.req.sampling.logprobs >= 0) {
            res.logprob.token = o[0];
            res.logprob.logprob = std::bit_cast<float>(o[1]);
            res.logprob.rank = o[2];
            for (int j = 0; j < o[3]; ++j)
              res.logprob.top.emplace_back(o[4 + 2 * j], std::bit_cast<float>(o[5 + 2 * j]));
          }
        } else if (im.runner.greedy()) {  // every row samples_raw_argmax(): the device took the argmax
          res.token = im.runner.greedy_tokens()[r];
        } else {
          res = sample(im.runner.logits() + r * size_t(V), V, ctx, im.scratch, im.index_scratch);
        }
      }
      if (proc && proc_error.empty()) {
        try {
          proc->accept(res.token);
        } catch (const std::exception& e) {
          proc_error = e.what();
        }
      }
      auto [oi, added] = im.out_of.try_emplace(s->request, im.outs.size());
      if (added) im.outs.emplace_back(s->request, RequestOutput{});
      RequestOutput& out = im.outs[oi->second].second;
      if (!proc_error.empty()) {
        SeqOutput so;
        so.index = s->index;
        so.finish = s->finish = FinishReason::kError;
        out.error = proc_error;
        im.scheduler.remove(s);
        rq.unfinished--;
        out.seqs.push_back(std::move(so));
        continue;
      }
      if (rq.prompt_lps_pending) {
        // The request's first sampled token: its sequence's prefill computed every prompt position
        // not scored before (prefix_cap kept the others out of the cache), so all are here.
        BELUGA_ASSERT(rq.prompt_lps.size() + 1 == rq.req.prompt.size());
        out.prompt_logprobs = std::move(rq.prompt_lps);
        rq.prompt_lps_pending = false;
        rq.prefix_cap = INT_MAX;
      }
      SeqOutput so;
      so.index = s->index;
      const bool is_stop = std::find(rq.stop_ids.begin(), rq.stop_ids.end(), res.token) != rq.stop_ids.end();
      im.stats.generation_tokens++;
      if (is_stop) {
        so.finish = FinishReason::kStop;
        so.stop_token = res.token;
      } else {
        s->tokens.push_back(res.token);
        s->output_counts[res.token]++;
        so.tokens.push_back(res.token);
        if (rq.req.sampling.logprobs >= 0) so.logprobs.push_back(std::move(res.logprob));
        if (s->num_output() >= rq.req.sampling.max_tokens || int(s->tokens.size()) >= max_model_len_)
          so.finish = FinishReason::kLength;
      }
      if (so.finish != FinishReason::kNone) {
        s->finish = so.finish;
        im.scheduler.remove(s);  // also from the waiting queue if N+1's schedule preempted it
        rq.unfinished--;
      }
      out.seqs.push_back(std::move(so));
    }
  };

  // Step N failed: fail its requests, as a synchronous engine would. Its commit already published
  // blocks whose KV was never written; take them out of the prefix index and fail the requests that
  // picked them up for N+1 too (they would read garbage). Their chunks leave N+1 before their Seqs go.
  auto fail_step = [&](const std::string& error, bool unavailable) {
    im.failed.assign(im.step_slots.begin(), im.step_slots.end());
    std::erase_if(im.published, [&](int b) { return !im.blocks.is_published(b); });  // evicted: reused
    if (!im.published.empty())
      for (auto& [slot, rq] : im.requests)
        for (auto& s : rq.seqs)
          if (std::find_first_of(s->blocks.begin(), s->blocks.end(), im.published.begin(),
                                 im.published.end()) != s->blocks.end())
            im.failed.push_back(slot);
    std::sort(im.failed.begin(), im.failed.end());
    im.failed.erase(std::unique(im.failed.begin(), im.failed.end()), im.failed.end());
    std::erase_if(im.chunks, [&](const Chunk& c) {
      return std::binary_search(im.failed.begin(), im.failed.end(), c.seq->request);
    });
    for (int slot : im.failed) emit_final(slot, FinishReason::kError, error, unavailable);
    for (int b : im.published) im.blocks.unpublish(b);
  };

  // A new request enters the engine. If anything here throws, the request fails on its own (its
  // Seqs join the scheduler only once they are owned by the request, so nothing dangles).
  auto admit = [&](EngineRequest&& req) {
    const int slot = im.next_slot++;
    try {
      // In the map before anything else can throw: from here on a failure ends it through emit_final.
      Impl::Request& rr = im.requests.try_emplace(slot).first->second;
      rr.req = std::move(req);
      im.slot_of[rr.req.id] = slot;
      rr.seed = rr.req.sampling.seed ? *rr.req.sampling.seed : im.deterministic ? 0 : im.seed_source();
      rr.stop_ids = rr.req.sampling.stop_token_ids;
      if (rr.req.sampling.repetition_penalty != 1.0f) rr.prompt_set = distinct_tokens(rr.req.prompt);
      if (!rr.req.sampling.ignore_eos)
        for (int e : model_.config().eos_token_ids) rr.stop_ids.push_back(e);
      if (rr.req.sampling.prompt_logprobs >= 0) {
        rr.prompt_lps_pending = true;
        rr.prompt_lps.reserve(rr.req.prompt.size() - 1);
        rr.prefix_cap = 0;
      }
      rr.seqs.reserve(size_t(rr.req.sampling.n));
      rr.unfinished = rr.req.sampling.n;
      im.stats.prompt_tokens += int64_t(rr.req.prompt.size());
      for (int i = 0; i < rr.req.sampling.n; ++i) {
        auto s = std::make_unique<Seq>();
        s->order = im.next_order++;
        s->request = slot;
        s->index = i;
        s->salt = &rr.req.cache_salt;
        s->traffic_class = &rr.req.traffic_class;
        s->prefix_cap = &rr.prefix_cap;  // stable: requests are map nodes
        s->tokens = rr.req.prompt;
        s->num_prompt = int(rr.req.prompt.size());
        s->max_length = std::min(s->num_prompt + rr.req.sampling.max_tokens, max_model_len_);
        s->arrival = clock_seconds();
        Seq* raw = s.get();
        if (rr.req.logits_processor) rr.procs.push_back(rr.req.logits_processor());
        rr.seqs.push_back(std::move(s));
        im.scheduler.add(raw);
      }
    } catch (const std::exception& e) {
      const std::string why = str("internal error while admitting the request: ", e.what());
      if (im.requests.count(slot)) {
        emit_final(slot, FinishReason::kError, why);
      } else {
        RequestOutput out;
        out.request_id = req.id;
        out.finished = true;
        out.error = why;
        deliver(req, std::move(out));
      }
    }
  };

  // b. Step N+1's skeleton.
  auto schedule_next = [&] {
    TraceSpan span(tr, lane, "schedule");
    Seq* stuck = nullptr;
    im.scheduler.schedule(im.chunks, &stuck, clock_seconds());
    if (stuck) emit_final(stuck->request, FinishReason::kError, "the request does not fit in the KV cache");
  };

  // c. Step N's results (if a step is in flight). Whether N ran and its tokens came back as ids (a
  // step launched early behind it could name them).
  auto finish_step = [&] {
    if (!im.runner.in_flight()) return false;
    std::string error;
    bool ok = true, unavailable = false;
    try {
      TraceSpan span(tr, lane, "wait");
      im.runner.wait();
    } catch (const Unavailable& e) {  // the model's group is down: not the requests' fault
      ok = false;
      unavailable = true;
      error = e.what();
    } catch (const std::exception& e) {
      ok = false;
      error = e.what();
    } catch (...) {
      ok = false;
      error = "the forward step failed";
    }
    if (im.kv_connector) im.kv_connector->step_done(ok);
    im.stats.steps++;
    if (ok && im.runner.last_tokens() > 0)
      im.policy.observe(im.runner.last_tokens(), im.runner.last_seconds());
    if (ok) {
      TraceSpan span(tr, lane, "sample");
      apply_step();
      if (im.spec) im.commit_verified();
      // A sequence that finished at N may still have a chunk in N+1 (a stop token arrived); its
      // blocks are already released. Seqs stay alive until step e, so c.seq is valid here.
      std::erase_if(im.chunks, [](const Chunk& c) { return c.seq->finish != FinishReason::kNone; });
      span.end();
      if (cfg_.loop_hook) cfg_.loop_hook(im.stats.steps);
    } else {
      im.stats.steps_failed++;
      fail_step(error, unavailable);  // a failed step fails its requests; the engine serves the others
    }
    return ok && (im.runner.device_sampled() || im.runner.greedy());
  };

  // After step N, the step launched early behind it: finished (commit, masks), or, when it named
  // tokens N did not return as ids (N failed, or its masks sent it to the host), skipped by the
  // runner and launched again from what is left of its chunks.
  auto settle_early = [&](bool n_ids) {
    if (!im.early_future || n_ids) {
      im.finish_early();
      return;
    }
    TraceSpan span(tr, lane, "retry early step");
    im.runner.wait();
    BELUGA_ASSERT(im.runner.skipped());
    im.masks_unreleased = false;  // a skipped step never waits for them
    im.saves_unreleased = false;
    im.early_future = false;
    im.early_pending = false;
    im.next_rows.clear();
    im.next_slots.clear();
    im.stats.steps_early_retried++;
    if (!im.chunks.empty()) im.launch_next(cfg_.async_scheduling);
  };

  // One iteration after the inputs are taken: admit, abort, schedule N+1, apply N, launch N+1, emit
  // N's outputs (serial: schedule, launch and apply the same step, then emit it).
  auto iterate = [&](std::deque<EngineRequest>& incoming, std::vector<std::string>& aborts) {
    TraceSpan step(tr, lane, "step", im.stats.steps);
    TraceSpan admitting(tr, lane, "admit");
    for (auto& req : incoming) admit(std::move(req));
    incoming.clear();
    publish_waiting();

    // After admitting: an abort may name a request that arrived in the same batch.
    for (const auto& id : aborts) {
      auto it = im.slot_of.find(id);
      if (it != im.slot_of.end()) emit_final(it->second, FinishReason::kAbort, "");
    }
    aborts.clear();
    admitting.end();

    // b, c, d: overlapped, N+1 is planned while N computes (with N's tokens pending); serial, nothing
    // is in flight here and the step launched in d is finished at once. When step N speculates, step
    // N+1's chunks depend on how many drafts it accepts: N is finished first (no overlap).
    // With async scheduling, N+1 is launched before N's tokens are applied wherever nothing in it
    // needs them on the host (can_launch_early): the runner starts it the moment N is done.
    if (im.spec && im.spec->speculating()) finish_step();
    schedule_next();
    const bool early = cfg_.async_scheduling && cfg_.early_launch && !im.chunks.empty() &&
                       im.can_launch_early() && im.launch_next(true, true);
    if (cfg_.async_scheduling) {
      const bool n_ids = finish_step();
      if (early) settle_early(n_ids);
    }
    if (!early && !im.chunks.empty())
      im.launch_next(cfg_.async_scheduling);  // d. Step N+1: build, launch, commit.
    if (!cfg_.async_scheduling) finish_step();

    // e. Step N's outputs, while N+1 runs. A callback that throws fails its own request only.
    TraceSpan delivering(tr, lane, "deliver");
    for (auto& [slot, out] : im.outs) {
      auto it = im.requests.find(slot);
      if (it == im.requests.end()) continue;
      Impl::Request& rq = it->second;
      out.request_id = rq.req.id;
      out.prompt_tokens = int(rq.req.prompt.size());
      set_cached(out, *rq.seqs[0]);
      out.finished = rq.unfinished == 0;
      if (!deliver(rq.req, std::move(out)) && rq.unfinished > 0) {
        emit_final(slot, FinishReason::kError, "internal error: the request's output could not be delivered");
        continue;
      }
      if (rq.unfinished == 0) {
        im.slot_of.erase(rq.req.id);
        im.requests.erase(slot);
        im.stats.requests_finished++;
      }
    }
    im.outs.clear();
    im.out_of.clear();
  };

  // The step boundary: an exception escaped an iteration, so the state of the steps in hand (the one
  // in flight, the one being built, outputs not yet delivered) cannot be trusted. The step in flight
  // finishes first (its KV writes must land before its blocks are reused); its blocks leave the prefix
  // index as after a failed forward; every request those steps concern fails; requests the loop had
  // not touched yet (waiting, not scheduled) go on.
  auto recover = [&](const std::string& what) {
    std::fprintf(stderr, "beluga engine: internal error in a step, failing its requests: %s\n", what.c_str());
    im.stats.steps_failed++;
    if (im.masks_unreleased) {  // an early step waits for masks that will never come
      im.runner.release_masks(false);
      im.masks_unreleased = false;
    }
    if (im.saves_unreleased) {  // and for saves: none (its blocks leave the index below)
      std::vector<KvCopy> none;
      im.runner.release_saves(none);
      im.saves_unreleased = false;
    }
    // The connector heard of every step in flight but an early one not yet finished.
    int told = im.runner.num_in_flight() - (im.early_pending ? 1 : 0);
    while (im.runner.in_flight()) {
      try {
        im.runner.wait();
      } catch (...) {  // its requests fail below either way
      }
      if (im.kv_connector && told-- > 0) im.kv_connector->step_done(false);
    }
    im.early_pending = false;
    if (im.kv_connector) {  // copies handed out for a step that never launched: dropped with it
      im.kv_connector->step_launched();
      im.kv_connector->step_done(false);
    }
    for (const Chunk& c : im.chunks) im.step_slots.push_back(c.seq->request);
    im.step_slots.insert(im.step_slots.end(), im.next_slots.begin(), im.next_slots.end());
    im.next_slots.clear();
    im.next_rows.clear();
    im.early_future = false;
    for (const auto& [slot, out] : im.outs) im.step_slots.push_back(slot);
    im.outs.clear();
    im.out_of.clear();
    im.rows.clear();
    fail_step(str("internal error in the engine: ", what), false);
    im.chunks.clear();
    im.step_slots.clear();
    im.published.clear();
    im.verified_saves.clear();  // dropped with the step above
  };

  std::deque<EngineRequest> incoming;
  std::vector<std::string> aborts;
  for (;;) {
    // a. New requests and aborts; block only when there is nothing to do at all.
    {
      std::unique_lock<std::mutex> lk(mu_);
      if (!im.runner.in_flight()) {
        // Every sequence waits on a KV load (from disk): look again shortly, unless news come first.
        if (im.scheduler.num_loading() > 0 && im.scheduler.num_running() == 0 &&
            im.scheduler.num_loading() == im.scheduler.num_waiting())
          cv_.wait_for(lk, std::chrono::microseconds(200),
                       [&] { return stop_ || !incoming_.empty() || !aborts_.empty(); });
        else
          cv_.wait(lk,
                   [&] { return stop_ || !incoming_.empty() || !aborts_.empty() || !im.requests.empty(); });
      }
      if (stop_) break;
      incoming.swap(incoming_);
      aborts.swap(aborts_);
      waiting_count_ += incoming_seqs_;  // still queued as far as submit() is concerned
      incoming_seqs_ = 0;
    }
    try {
      iterate(incoming, aborts);
    } catch (const std::exception& e) {
      recover(e.what());
    } catch (...) {
      recover("unknown exception");
    }
    incoming.clear();
    aborts.clear();
    {
      std::lock_guard<std::mutex> lk(mu_);
      waiting_count_ = im.scheduler.num_waiting();
      im.stats.running = im.scheduler.num_running();
      im.stats.waiting = im.scheduler.num_waiting();
      im.stats.kv_blocks_used = im.blocks.num_used();
      if (im.blocks.num_partitions() > 1) {
        for (int p = 0; p < im.blocks.num_partitions(); ++p)
          im.stats.kv_blocks_used_by_rank[size_t(p)] =
              im.blocks.blocks_per_partition() - im.blocks.num_free(p);
      }
      im.stats.preemptions = im.scheduler.preemptions();
      im.stats.prefix_cache_queries = im.scheduler.cache_queries();
      im.stats.prefix_cache_hits = im.scheduler.cache_hits();
      im.stats.prefix_cache_hits_below = im.scheduler.cache_hits_below();
      im.stats.last_step_unix_ms = unix_ms();
      if (im.spec) {
        const SpecStats& ss = im.spec->stats();
        im.stats.spec_drafts = ss.drafts;
        im.stats.spec_draft_tokens = ss.draft_tokens;
        im.stats.spec_accepted_tokens = ss.accepted_tokens;
        im.stats.spec_accepted_per_position = ss.accepted_per_position;
      }
      published_stats_ = im.stats;
    }
  }
  // Shutting down: the steps in flight finish (their results are dropped); every request still here
  // ends as aborted.
  while (im.runner.in_flight()) {
    bool ok = true;
    try {
      im.runner.wait();
    } catch (...) {  // the requests end as aborted either way
      ok = false;
    }
    if (im.kv_connector) im.kv_connector->step_done(ok);
  }
  std::vector<int> slots;
  for (auto& [slot, r] : im.requests) slots.push_back(slot);
  for (int slot : slots) emit_final(slot, FinishReason::kAbort, "");
}

}  // namespace beluga
