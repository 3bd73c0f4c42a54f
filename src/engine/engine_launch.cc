// Step d of the engine loop (engine.cc): build step N+1's batch from the scheduled chunks, pick where
// it samples (the device, with constrained rows' masks filled beside the forward, or the host),
// launch it and commit it.
#include <algorithm>

#include "engine/engine_impl.h"
#include "util/error.h"

namespace beluga {

// Step d's device row for sequence s, or false: the step samples on the host. A mask the device
// cannot take as it is (a processor that throws, an empty mask, min_tokens masking the only stop
// the grammar allows) sends the step to the host, whose sampler reports or resolves it as before.
bool Engine::Impl::add_device_row(Request& rq, const Seq& s) {
  const SampleContext ctx{&rq.req.sampling, &rq.req.prompt, &s.output_counts, s.num_output(),
                          &rq.stop_ids,     rq.seed,        s.index};
  if (!samples_on_device(ctx)) return false;
  DeviceSampleRow row = device_sample_row(ctx);
  LogitsProcessor* proc = rq.procs.empty() ? nullptr : rq.procs[size_t(s.index)].get();
  const bool mask_stops = ctx.num_output < rq.req.sampling.min_tokens && !rq.stop_ids.empty();
  if (proc || mask_stops) {
    const size_t off = dsamp.masks.size();
    if (off / mask_words >= size_t(Model::kMaxMaskRows)) return false;
    dsamp.masks.resize(off + mask_words, proc ? 0u : ~0u);
    if (proc) {  // filled with the step's other constrained rows (launch_next)
      masks.add(proc, off, mask_stops ? &rq.stop_ids : nullptr);
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

// d. Step N+1: build its batch (every token is known now), launch it, commit it at once.
void Engine::Impl::launch_next(bool async_scheduling) {
  Tracer* const tr = trace.get();  // null: every TraceSpan below is a no-op
  const int lane = trace_lane;
  Batch& b = batch;
  b.tokens.clear();
  b.logit_rows.clear();
  b.seqs.resize(chunks.size());
  rows.clear();
  step_slots.clear();
  bool greedy = true;  // all rows greedy on raw logits: sample on the device
  // Every row within the device sampler's reach (sampler.h: samples_on_device): sample them there,
  // constrained rows with the mask filled now (their processor has seen every token up to N).
  bool device = device_sampling && !spec;
  dsamp.clear();
  masks.clear();
  TraceSpan build(tr, lane, "build batch");
  // Speculation needs a distribution each row fixes alone: nothing edits the logits as tokens come.
  auto spec_ok = [&](const Request& rq, const Seq& s) {
    return rq.procs.empty() &&
           samples_speculatively(SampleContext{&rq.req.sampling, &rq.req.prompt, &s.output_counts,
                                               s.num_output(), &rq.stop_ids, rq.seed, s.index});
  };
  if (spec) {  // the gate: which drafts this step verifies
    spec_eligible.clear();
    for (const Chunk& c : chunks) {
      const Request& rq = requests.at(c.seq->request);
      spec_eligible.push_back(spec_ok(rq, *c.seq) ? &rq.req.sampling : nullptr);
    }
    spec->begin_step(chunks, spec_eligible);
  }
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    const Seq* s = c.seq;
    BELUGA_ASSERT(c.start + c.len <= int(s->tokens.size()));
    b.seqs[i].context_len = c.start;
    b.seqs[i].query_len = c.len;
    b.seqs[i].block_table.assign(s->blocks.begin(), s->blocks.end());
    const int base = int(b.tokens.size()) - c.start;  // row of position c.start + k: base + c.start + k
    b.tokens.insert(b.tokens.end(), s->tokens.begin() + c.start, s->tokens.begin() + c.start + c.len);
    Request& rq = requests.at(s->request);
    if (rq.prompt_lps_pending) {
      // The prompt positions of this chunk no row has asked for yet; position p's logits score
      // prompt token p + 1 (the last prompt position's are the sample row below). Every step
      // before this one has been applied, so prompt_lp_next counts rows exactly.
      BELUGA_ASSERT(c.start <= rq.prompt_lp_next || c.start >= s->num_prompt - 1);  // prefix_cap
      const int from = std::max(c.start, rq.prompt_lp_next);
      const int to = std::min(c.start + c.len, s->num_prompt - 1);
      for (int p = from; p < to; ++p) {
        b.logit_rows.push_back(base + p);
        rows.push_back({s->request, s->index, p});
      }
      if (from < to) {
        rq.prompt_lp_next = to;
        greedy = false;  // these rows need the logits themselves
        device = false;
      }
    }
    const SampleContext ctx{&rq.req.sampling, &rq.req.prompt, &s->output_counts, s->num_output(),
                            &rq.stop_ids,     rq.seed,        s->index};
    const bool eligible = spec ? spec_eligible[i] != nullptr : spec_ok(rq, *s);
    const bool raw_argmax = eligible && rq.req.sampling.temperature <= 0.0f;
    if (c.sample) {
      b.logit_rows.push_back(int(b.tokens.size()) - 1);
      rows.push_back({s->request, s->index, -1});
      greedy = greedy && raw_argmax;
      if (device) device = add_device_row(rq, *s);
    }
    if (spec) {  // this sequence's drafts, verified as extra rows
      const int k =
          spec->plan_chunk(int(i), *c.seq, c, eligible ? &ctx : nullptr, int(b.logit_rows.size()) - 1, b);
      if (spec->verifies(int(i))) rows.back().bseq = int(i);  // its sample row: the verifier's token
      for (int j = 1; j <= k; ++j) rows.push_back({s->request, s->index, -1, j, int(i)});
    }
    step_slots.push_back(s->request);
  }
  std::sort(step_slots.begin(), step_slots.end());
  step_slots.erase(std::unique(step_slots.begin(), step_slots.end()), step_slots.end());
  build.end();
  TraceSpan launch(tr, lane, "launch");
  published.clear();
  published_keys.clear();
  published_classes.clear();
  scheduler.commit(chunks, &published, &published_keys, &published_classes);
  KvStepCopies* copies = nullptr;
  if (kv_connector) {  // this step's loads and the saves of the blocks it fills
    copies = &kv_copies;
    scheduler.take_loads(copies->loads);
    copies->saves.clear();
    for (size_t i = 0; i < published.size(); ++i)
      if (std::byte* host = kv_connector->start_save(published_keys[i], *published_classes[i]))
        copies->saves.push_back({published[i], host});
  }
  // All raw argmax: argmax_rows is the cheaper device path.
  device = device && !greedy && !b.logit_rows.empty() && dsamp.rows.size() == b.logit_rows.size();
  // Constrained rows' masks: filled while the forward runs (the runner waits for them before it
  // samples), or with --no-async-scheduling before the launch; a mask that cannot go up sends the
  // step to the host sampler.
  const bool masks_later = device && !masks.empty() && async_scheduling;
  if (device && !masks.empty() && !masks_later) {
    TraceSpan masks_span(tr, lane, "masks");
    masks.fill(dsamp.masks.data(), vocab);
    device = masks.all_usable();
  }
  // b, copies, dsamp: swapped for older ones (capacity)
  runner.launch(b, greedy && !b.logit_rows.empty(), copies, device ? &dsamp : nullptr, masks_later);
  if (masks_later) {
    TraceSpan masks_span(tr, lane, "masks (beside the forward)");
    bool usable = false;
    try {
      masks.fill(runner.pending_masks(), vocab);
      usable = masks.all_usable();
    } catch (...) {
      runner.release_masks(false);  // the runner must not wait for masks that will never come
      throw;
    }
    runner.release_masks(usable);
  }
  if (kv_connector) kv_connector->step_launched();
  for (const Chunk& c : chunks)
    if (c.sample) c.seq->pending = 1;
  // Speculating, the next schedule runs after this step's results: its chunks (whose Seqs an abort
  // may free meanwhile) are the SpecDecoder's business until then.
  if (spec) chunks.clear();
}

}  // namespace beluga
