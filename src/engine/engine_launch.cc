// Step d of the engine loop (engine.cc): build step N+1's batch from the scheduled chunks, pick where
// it samples (the device, with constrained rows' masks filled beside the forward, or the host),
// launch it and commit it; or launch it early, before step N's tokens are applied, and finish it
// (commit, masks, pending marks) once they are.
#include <algorithm>

#include "engine/engine_impl.h"
#include "util/error.h"
#include "util/log.h"

namespace beluga {

// Step d's device row for sequence s, or false: the step samples on the host. A mask the device
// cannot take as it is (a processor that throws, an empty mask, min_tokens masking the only stop
// the grammar allows) sends the step to the host, whose sampler reports or resolves it as before.
// ahead > 0: the row of the sequence's ahead-th draft (speculative verification, draft_verifier.h):
// the draw of output position num_output + ahead, on logits nothing edits (samples_speculatively).
bool Engine::Impl::add_device_row(Request& rq, const Seq& s, int ahead) {
  SampleContext ctx = sample_context(rq, s);
  if (ahead > 0) {
    if (!samples_speculatively(ctx)) return false;
    ctx.num_output += ahead;
    dsamp.rows.push_back(device_sample_row(ctx, nullptr, false));
    return true;
  }
  if (!samples_on_device(ctx)) return false;
  // Penalties count the token step N is still sampling (an early step): resolved by the runner.
  const bool pending_edit = s.pending > 0 && edits_logits(rq.req.sampling);
  if (pending_edit) dsamp.pending.push_back({int32_t(dsamp.rows.size()), s.pending_row});
  DeviceSampleRow row = device_sample_row(ctx, &dsamp.edits, pending_edit);
  if (dsamp.edits.size() > size_t(Model::kMaxSampleEdits)) return false;
  LogitsProcessor* proc = rq.procs.empty() ? nullptr : rq.procs[size_t(s.index)].get();
  const bool mask_stops = ctx.num_output < rq.req.sampling.min_tokens && !rq.stop_ids.empty();
  if (proc || mask_stops) {
    const size_t off = dsamp.masks.size();
    if (off / mask_words >= size_t(Model::kMaxMaskRows)) return false;
    dsamp.masks.resize(off + mask_words, proc ? 0u : ~0u);
    if (proc) {  // filled with the step's other constrained rows (launch_next)
      masks.add(proc, off, mask_stops ? &rq.stop_ids : nullptr);
      mask_seqs.emplace_back(s.request, s.index);
    } else {
      uint32_t* m = dsamp.masks.data() + off;
      clear_ids(m, rq.stop_ids, vocab);
      if (allows_none(m, mask_words)) return false;
    }
    row.mask_row = int(off / mask_words);
  }
  dsamp.rows.push_back(row);
  return true;
}

void Engine::Impl::find_spec_eligible() {
  spec_eligible.clear();
  for (const Chunk& c : chunks) {
    const Request& rq = requests.at(c.seq->request);
    const bool ok = rq.procs.empty() && samples_speculatively(sample_context(rq, *c.seq));
    spec_eligible.push_back(ok ? &rq.req.sampling : nullptr);
  }
}

// Whether step N+1 (`chunks`) may be launched before step N's tokens are applied.
bool Engine::Impl::can_launch_early() {
  // A drafting step plans from accepted counts (and N, if it drafted, was applied already); KV loads
  // finished by this schedule belong to the step (rare: launched after N then); expert-parallel peers
  // get the batch as it is; prompt logprobs need the logits.
  // Why a speculating engine's step is not launched early (debug log: the overlap's diagnosis).
  auto no = [&](const char* why) {
    if (spec) log::debug("engine", "not early: ", why, " (", chunks.size(), " chunks)");
    return false;
  };
  if (scheduler.has_loads()) return no("KV loads");
  if (model.has_step_peers()) return no("expert-parallel peers");
  if (runner.num_in_flight() != 1) return no("the step ahead was applied first (it speculated)");
  if (spec) {  // N's plan is the runner's while it drafts (run_step); N+1's must not replace it
    if (spec_step.drafting) return no("the step ahead drafts");
    find_spec_eligible();
    if (!spec->plain_next(chunks, spec_eligible)) return no("the gate drafts");
  }
  const bool ids = runner.last_launch_samples_ids();
  for (const Chunk& c : chunks) {
    const Seq& s = *c.seq;
    if (s.pending > 0 && !ids) return no("the step ahead's tokens come back as logits");
    const Request& rq = requests.at(s.request);
    if (rq.prompt_lps_pending) return no("prompt logprobs");
    if (c.start + c.len > int(s.tokens.size()) + s.pending) return no("a chunk past the known tokens");
    if (!c.sample) continue;
    // Its row must sample without the host (launch_next's choice, foreseen so that a step that goes
    // to the host sampler is not built twice).
    const SampleContext ctx = sample_context(rq, s);
    if (device_sampling ? !samples_on_device(ctx) : !(rq.procs.empty() && samples_raw_argmax(ctx)))
      return no("a row samples on the host");
  }
  return true;
}

// d. Step N+1: build its batch, launch it and (unless early) commit it.
bool Engine::Impl::launch_next(bool async_scheduling, bool early) {
  Tracer* const tr = trace.get();  // null: every TraceSpan below is a no-op
  const int lane = trace_lane;
  Batch& b = batch;
  std::vector<Row>& out_rows = early ? next_rows : rows;
  std::vector<int>& out_slots = early ? next_slots : step_slots;
  b.tokens.clear();
  b.logit_rows.clear();
  b.seqs.resize(chunks.size());
  out_rows.clear();
  out_slots.clear();
  bool greedy = true;   // all rows greedy on raw logits: sample on the device
  bool future = false;  // some token is one step N is still sampling
  // Every row within the device sampler's reach (sampler.h: samples_on_device): sample them there,
  // constrained rows with the mask filled now (their processor has seen every token up to N).
  bool device = device_sampling;  // a speculating step samples on the host (below)
  dsamp.clear();
  masks.clear();
  mask_seqs.clear();
  TraceSpan build(tr, lane, early ? "build batch (early)" : "build batch");
  // Speculation needs a distribution each row fixes alone: nothing edits the logits as tokens come.
  auto spec_ok = [&](const Request& rq, const Seq& s) {
    return rq.procs.empty() && samples_speculatively(sample_context(rq, s));
  };
  if (spec) {  // the gate: which drafts this step verifies (a step launched early never drafts)
    if (!early) find_spec_eligible();  // early: can_launch_early found it for these chunks
    spec->begin_step(chunks, spec_eligible);
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    Seq* s = c.seq;
    const int known = int(s->tokens.size());
    BELUGA_ASSERT(c.start + c.len <= known + (early ? s->pending : 0));
    b.seqs[i].context_len = c.start;
    b.seqs[i].query_len = c.len;
    b.seqs[i].block_table.assign(s->blocks.begin(), s->blocks.end());
    const int base = int(b.tokens.size()) - c.start;  // row of position c.start + k: base + c.start + k
    const int end = std::min(c.start + c.len, known);
    b.tokens.insert(b.tokens.end(), s->tokens.begin() + c.start, s->tokens.begin() + end);
    if (end < c.start + c.len) {  // the token step N samples at its row pending_row
      BELUGA_ASSERT(s->pending == 1 && s->pending_row >= 0 && end + 1 == c.start + c.len);
      b.tokens.push_back(-(s->pending_row + 1));
      future = true;
    }
    Request& rq = requests.at(s->request);
    if (rq.prompt_lps_pending) {
      BELUGA_ASSERT(!early);  // can_launch_early
      // The prompt positions of this chunk no row has asked for yet; position p's logits score
      // prompt token p + 1 (the last prompt position's are the sample row below). Every step
      // before this one has been applied, so prompt_lp_next counts rows exactly.
      BELUGA_ASSERT(c.start <= rq.prompt_lp_next || c.start >= s->num_prompt - 1);  // prefix_cap
      const int from = std::max(c.start, rq.prompt_lp_next);
      const int to = std::min(c.start + c.len, s->num_prompt - 1);
      for (int p = from; p < to; ++p) {
        b.logit_rows.push_back(base + p);
        out_rows.push_back({s->request, s->index, p});
      }
      if (from < to) {
        rq.prompt_lp_next = to;
        greedy = false;  // these rows need the logits themselves
        device = false;
      }
    }
    const SampleContext ctx = sample_context(rq, *s);
    const bool eligible = spec ? spec_eligible[i] != nullptr : spec_ok(rq, *s);
    const bool raw_argmax = eligible && rq.req.sampling.temperature <= 0.0f;
    if (c.sample) {
      b.logit_rows.push_back(int(b.tokens.size()) - 1);
      out_rows.push_back({s->request, s->index, -1});
      greedy = greedy && raw_argmax;
      if (device) device = add_device_row(rq, *s);
    }
    if (spec) {  // this sequence's drafts, verified as extra rows
      const int k =
          spec->plan_chunk(int(i), *c.seq, c, eligible ? &ctx : nullptr, int(b.logit_rows.size()) - 1, b);
      if (spec->verifies(int(i))) out_rows.back().bseq = int(i);  // its sample row: the verifier's token
      for (int j = 1; j <= k; ++j) {
        out_rows.push_back({s->request, s->index, -1, j, int(i)});
        if (device) device = add_device_row(rq, *s, j);
      }
    }
    out_slots.push_back(s->request);
  }
  std::sort(out_slots.begin(), out_slots.end());
  out_slots.erase(std::unique(out_slots.begin(), out_slots.end()), out_slots.end());
  // A step that verifies drafts samples every verify row on the device too: verification compares
  // each row's draw with its draft (draft_verifier.h's coupled rule), so it needs ids, not logits.
  // All raw argmax: argmax_rows is the cheaper device path.
  greedy = greedy && !b.logit_rows.empty();
  device = device && !greedy && !b.logit_rows.empty() && dsamp.rows.size() == b.logit_rows.size();
  if (early && !device && !greedy && !b.logit_rows.empty()) return false;  // it samples on the host
  build.end();
  // Each sampling chunk's logit row: the name of its token for a step launched early behind this one.
  for (size_t i = 0, r = 0; i < chunks.size(); ++i) {
    if (!chunks[i].sample) continue;
    while (out_rows[r].prompt_pos >= 0 || out_rows[r].draft > 0) ++r;
    chunks[i].seq->pending_row = int(r++);
  }
  TraceSpan launch(tr, lane, early ? "launch (early)" : "launch");
  KvStepCopies* copies = nullptr;
  if (!early) {
    commit_chunks(copies);
  } else if (kv_connector) {  // its saves once committed (finish_early)
    copies = &kv_copies;
    copies->clear();
  }
  // Constrained rows' masks: filled while the forward runs (the runner waits for them before it
  // samples; an early step's once step N is applied), or with --no-async-scheduling before the
  // launch; a mask that cannot go up sends the step to the host sampler.
  const bool masks_later = device && !masks.empty() && (async_scheduling || early);
  if (device && !masks.empty() && !masks_later) {
    TraceSpan masks_span(tr, lane, "masks");
    masks.fill(dsamp.masks.data(), vocab);
    device = masks.all_usable();
  }
  // b, copies, dsamp: swapped for older ones (capacity)
  const SpecStep planned = spec ? spec->planned() : SpecStep{};
  BELUGA_ASSERT(!early || !planned.drafting);  // can_launch_early: SpecDecoder::plain_next
  (early ? next_spec_step : spec_step) = planned;
  runner.launch(b, greedy, copies, device ? &dsamp : nullptr, masks_later, early && copies, planned.drafting);
  early_future = early && future;
  masks_unreleased = masks_later;
  saves_unreleased = early && copies;
  if (early) {
    early_pending = true;
    stats.steps_early++;
    return true;
  }
  if (masks_later) {
    TraceSpan masks_span(tr, lane, "masks (beside the forward)");
    bool usable = false;
    try {
      masks.fill(runner.pending_masks(), vocab);
      usable = masks.all_usable();
    } catch (...) {
      runner.release_masks(false);  // the runner must not wait for masks that will never come
      masks_unreleased = false;
      throw;
    }
    runner.release_masks(usable);
    masks_unreleased = false;
  }
  if (kv_connector) kv_connector->step_launched();
  mark_pending();
  // Speculating, the next schedule runs after this step's results: its chunks (whose Seqs an abort
  // may free meanwhile) are the SpecDecoder's business until then.
  if (spec) chunks.clear();
  return true;
}

void Engine::Impl::commit_chunks(KvStepCopies*& copies) {
  published.clear();
  published_keys.clear();
  published_classes.clear();
  scheduler.commit(chunks, &published, &published_keys, &published_classes);
  copies = nullptr;
  if (kv_connector) {  // this step's loads and the saves of the blocks it fills
    copies = &kv_copies;
    scheduler.take_loads(copies->loads);
    copies->saves.clear();
    for (size_t i = 0; i < published.size(); ++i)
      if (std::byte* host = kv_connector->start_save(published_keys[i], *published_classes[i]))
        copies->saves.push_back({published[i], host});
    copies->saves_first.clear();
    std::swap(copies->saves_first, verified_saves);
  }
}

void Engine::Impl::commit_verified() {
  verified.clear();
  verified_keys.clear();
  verified_classes.clear();
  spec->after_apply(
      spec_step,
      [&](int slot, int index) -> Seq* {
        auto it = requests.find(slot);
        return it == requests.end() ? nullptr : it->second.seqs[size_t(index)].get();
      },
      scheduler, &verified, &verified_keys, &verified_classes);
  if (!kv_connector) return;
  // Their KV was written by the step just applied; the next step copies them out before anything
  // it runs can write to a block (one freed by an abort and reused meanwhile).
  for (size_t i = 0; i < verified.size(); ++i)
    if (std::byte* host = kv_connector->start_save(verified_keys[i], *verified_classes[i]))
      verified_saves.push_back({verified[i], host});
}

void Engine::Impl::mark_pending() {
  for (const Chunk& c : chunks)
    if (c.sample) c.seq->pending = 1;
}

// After step N: its tokens are in the sequences, so the early step's chunks (those of sequences
// still running: finish_step dropped the others, whose rows the step computes for nothing) are
// committed, its masks filled from processors that have taken N's tokens, its sequences marked.
void Engine::Impl::finish_early() {
  Tracer* const tr = trace.get();
  TraceSpan span(tr, trace_lane, "finish early step");
  KvStepCopies* copies = nullptr;
  commit_chunks(copies);
  if (copies) {  // the saves go with the step; the connector counts it launched from here
    // can_launch_early: no loads, no speculation
    BELUGA_ASSERT(copies->loads.empty() && copies->saves_first.empty() && saves_unreleased);
    runner.release_saves(copies->saves);
    saves_unreleased = false;
    kv_connector->step_launched();
  }
  if (masks_unreleased) {
    for (size_t j = 0; j < mask_seqs.size(); ++j) {
      auto it = requests.find(mask_seqs[j].first);
      if (it == requests.end() || it->second.seqs[size_t(mask_seqs[j].second)]->finish != FinishReason::kNone)
        masks.drop(int(j));  // ended at step N: its row's token is dropped anyway
    }
    bool usable = false;
    try {
      masks.fill(runner.pending_masks(), vocab);
      usable = masks.all_usable();
    } catch (...) {
      runner.release_masks(false);
      masks_unreleased = false;
      throw;
    }
    runner.release_masks(usable);
    masks_unreleased = false;
  }
  mark_pending();
  std::swap(rows, next_rows);
  std::swap(step_slots, next_slots);
  spec_step = next_spec_step;
  next_rows.clear();
  next_slots.clear();
  early_future = false;
  early_pending = false;
}

}  // namespace beluga
