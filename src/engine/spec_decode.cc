#include "engine/spec_decode.h"

#include <algorithm>
#include <bit>
#include <unordered_map>

#include "engine/draft_verifier.h"
#include "engine/ngram_proposer.h"
#include "util/error.h"

namespace beluga {

namespace {
// A verified row's sampler reads no prompt, counts or stop ids (samples_speculatively).
const std::vector<int> kNone;
const std::unordered_map<int, int> kNoCounts;
}  // namespace

SpecDecoder::SpecDecoder(Model& model, const SpecConfig& cfg, int num_blocks, int max_rows, bool mtp_ahead)
    : model_(model),
      cfg_(cfg),
      gate_(cfg.num_speculative_tokens, cfg.gating, model.replays_graphs()),
      allow_ahead_(mtp_ahead) {
  BELUGA_CHECK(cfg.enabled(), "speculative decoding is not configured");
  stats_.accepted_per_position.assign(size_t(cfg.num_speculative_tokens), 0);
  if (cfg.method == SpecConfig::Method::kNgram) return;  // drafts from the tokens: no MTP state
  BELUGA_CHECK(model.has_mtp(), "--speculative-config: method \"mtp\" needs a model with an MTP module ",
               "(num_nextn_predict_layers > 0 and its weights in the checkpoint); this model has none; ",
               "method \"ngram\" (prompt lookup) needs none");
  Ops& ops = model.ops();
  const int64_t D = model.config().hidden_size;
  mtp_kv_ = model.make_mtp_kv_cache(num_blocks);
  // Graph-replayed steps compute padded rows (up to DecodeGraphs::kMaxTokens) into these too.
  const int64_t rows = std::max<int64_t>(max_rows, DecodeGraphs::kMaxTokens);
  hidden_ = ops.alloc_persistent(ops.act_dtype(), {rows, D});
  mtp_out_ = ops.alloc_persistent(ops.act_dtype(), {rows, D});
  chain_ = ops.alloc_persistent(DType::kI32, {2 * int64_t(cfg.num_speculative_tokens) * rows});
  verify_ids_ = ops.alloc_persistent(DType::kI32, {rows});
  verify_ids_host_ = static_cast<int32_t*>(ops.host_alloc(size_t(rows) * sizeof(int32_t)));
  BELUGA_CHECK(verify_ids_host_, "speculative decoding: no host memory for the verify step's ids");
}

SpecDecoder::~SpecDecoder() {
  if (verify_ids_host_) model_.ops().host_free(verify_ids_host_);
}

bool SpecDecoder::mtp_ahead(const Batch& b, const ForwardOptions& opt) const {
  if (!allow_ahead_ || ngram() || !plan_mtp_ || cfg_.synthetic_acceptance >= 0 || !opt.greedy_tokens ||
      opt.sampled || opt.sampling || model_.has_step_peers() || b.logit_rows.size() != b.tokens.size())
    return false;
  const int depth = propose_depth();
  int row0 = 0;
  for (size_t i = 0; i < plan_.size(); ++i) {
    const Plan& p = plan_[i];
    const SeqChunk& sc = b.seqs[i];
    // A decode verifying its drafts, its logit rows its token rows, drafting `depth` however many of
    // its drafts are accepted.
    if (!p.mtp || !p.decode || p.sample_row != row0 || sc.query_len != 1 + p.num_rows ||
        p.max_length - (p.length + p.num_draft + 1) < depth)
      return false;
    row0 += sc.query_len;
  }
  return row0 == int(b.tokens.size());
}

int64_t SpecDecoder::greedy_rows(const Batch& b) const {
  int q = 1;
  for (const SeqChunk& sc : b.seqs) q = std::max(q, sc.query_len);
  return std::min(DecodeGraphs::logit_rows_bound(int(b.seqs.size()), q), hidden_.shape[0]);
}

void SpecDecoder::run_mtp_on_every_row(const Batch& b) {
  const int T = int(b.tokens.size());
  mb_.tokens.assign(b.tokens.begin(), b.tokens.end());  // placeholders: the ids are the verify step's
  mb_.seqs.clear();
  for (const SeqChunk& sc : b.seqs) mb_.seqs.push_back({sc.context_len, sc.query_len, sc.block_table});
  mb_.logit_rows.resize(size_t(T));
  for (int r = 0; r < T; ++r) mb_.logit_rows[size_t(r)] = r;
  const Tensor y = verify_ids_.rows(0, T);
  ForwardOptions mo;
  mo.final_hidden = &mtp_out_;
  mo.device_ids = &y;
  const int64_t R = greedy_rows(b);  // run_mtp_chain_on_device's first-pass layout
  mo.device_greedy = chain_.rows(0, R);
  mo.device_greedy_probs = chain_.rows(R, 2 * R);
  mo.device_greedy_probs.dtype = DType::kF32;  // same 4 bytes an element
  model_.mtp_forward(mb_, hidden_, mtp_kv_, nullptr, mo);
}

void SpecDecoder::begin_step(const std::vector<Chunk>& chunks,
                             const std::vector<const SamplingParams*>& eligible) {
  BELUGA_ASSERT(eligible.size() == chunks.size());
  const int K = cfg_.num_speculative_tokens;
  scores_.clear();
  score_seq_.clear();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    Seq& s = *c.seq;
    const int length = int(s.tokens.size()) + s.pending;
    if (!eligible[i] || !is_decode(c, s)) continue;
    // Prompt lookup proposes here, from the tokens so far (the engine runs speculating steps one
    // after another, so `tokens` is complete); s.draft is the buffer (its capacity is kept).
    if (ngram() && s.pending == 0) {  // (a pending token: an early step, which never drafts)
      s.draft.resize(size_t(K));
      s.draft.resize(
          size_t(propose_ngram(s.tokens, cfg_.prompt_lookup_min, cfg_.prompt_lookup_max, K, s.draft)));
      s.draft_q.clear();
    }
    const int max_length = s.max_length > 0 ? s.max_length : model_.max_positions();
    const int n = std::min({int(s.draft.size()), K, std::max(0, max_length - length)});
    scores_.push_back({n, int(s.draft_q.size()) >= n && n > 0 ? s.draft_q.data() : nullptr,
                       eligible[i]->temperature > 0.0f});
    score_seq_.push_back(int(i));
  }
  step_k_ = gate_.plan(int(chunks.size()), scores_, admit_scores_);
  step_mtp_ = gate_.drafting();
  step_explored_ = gate_.explored();
  admit_.assign(chunks.size(), 0);
  held_.assign(chunks.size(), 0);
  for (size_t t = 0; t < score_seq_.size(); ++t) {
    admit_[size_t(score_seq_[t])] = admit_scores_[t];
    held_[size_t(score_seq_[t])] = scores_[t].num_drafts;
  }
}

bool SpecDecoder::plain_next(const std::vector<Chunk>& chunks,
                             const std::vector<const SamplingParams*>& eligible) const {
  bool decodes = false;
  for (size_t i = 0; i < chunks.size() && !decodes; ++i)
    decodes = eligible[i] && is_decode(chunks[i], *chunks[i].seq);
  return !gate_.would_draft(int(chunks.size()), decodes);
}

int SpecDecoder::plan_chunk(int i, Seq& s, const Chunk& c, const SampleContext* sampling, int sample_row,
                            Batch& b) {
  const bool eligible = sampling != nullptr;
  if (i == 0) {
    plan_.clear();
    plan_k_ = step_k_;
    plan_mtp_ = step_mtp_;
    plan_explored_ = step_explored_;
  }
  BELUGA_ASSERT(int(plan_.size()) == i);
  Plan& p = plan_.emplace_back();
  p.slot = s.request;
  p.index = s.index;
  p.mtp = eligible;
  p.length = int(s.tokens.size()) + s.pending;
  p.max_length = s.max_length > 0 ? s.max_length : model_.max_positions();
  if (eligible) {
    const SamplingParams& sp = *sampling->params;
    p.sampling.temperature = sp.temperature;
    p.sampling.top_p = sp.top_p;
    p.sampling.top_k = sp.top_k;
    p.sampling.min_p = sp.min_p;
    p.seed = sampling->seed;
    p.num_output = sampling->num_output;
  }
  int k = 0, rows = 0;
  p.decode = eligible && is_decode(c, s);
  if (eligible && !step_mtp_) {
    // Drafting off: a plain step, prompt chunks included (no MTP pass, so the step overlaps as a plain
    // one; the MTP KV of these positions stays stale).
    p.mtp = false;
    s.draft.clear();
    s.draft_q.clear();
    return 0;
  }
  if (eligible && !c.sample) {
    p.next_token = s.tokens[size_t(c.start + c.len)];
  } else if (eligible) {
    p.sample_row = sample_row;
    p.sampled = sampling->params->temperature > 0.0f;
    // Drafts follow the token they were proposed after: only for the decode of the last token, as
    // many as the gate admitted; on a padded backend the rest of the step's depth is filler rows
    // (computed, never verified), so the step keeps its uniform shape.
    if (p.decode) {
      k = admit_[size_t(i)];
      p.held = held_[size_t(i)];
      rows = gate_.padded() ? std::min(step_k_, std::max(0, p.max_length - p.length)) : k;
      rows = std::max(rows, k);
    }
    b.tokens.insert(b.tokens.end(), s.draft.begin(), s.draft.begin() + k);
    b.tokens.insert(b.tokens.end(), size_t(rows - k), s.tokens.back());
    p.q.assign(s.draft_q.begin(), s.draft_q.begin() + std::min<int64_t>(k, int64_t(s.draft_q.size())));
    const int last = b.logit_rows.back();
    for (int j = 1; j <= rows; ++j) b.logit_rows.push_back(last + j);
    b.seqs[size_t(i)].query_len += rows;
  }
  p.num_draft = k;
  p.num_rows = rows;
  s.draft.clear();
  s.draft_q.clear();
  return rows;
}

void SpecDecoder::run_step(const Batch& b, KvCache& kv, float* logits, const ForwardOptions& opt,
                           Tracer* trace, int lane) {
  BELUGA_CHECK(ngram() || int64_t(b.tokens.size()) <= hidden_.shape[0], "speculative step of ",
               b.tokens.size(), " tokens exceeds its buffers");
  ForwardOptions o = opt;
  // A plain step (drafting off) runs no MTP pass: no hidden states to keep, and the plain decode graphs.
  if (!ngram() && plan_mtp_) o.final_hidden = &hidden_;
  const bool ahead = mtp_ahead(b, opt);
  {
    TraceSpan span(trace, lane, "spec: verify forward");
    const auto t0 = std::chrono::steady_clock::now();
    if (ahead) {
      // Every row's argmax stays on the device: the MTP pass over every verify row, whose token is
      // that argmax (for the accepted rows and the correction: the token after each row), is queued
      // behind the forward before the host waits for the argmaxes.
      const Tensor y = verify_ids_.rows(0, int64_t(b.tokens.size()));
      o.greedy_tokens = nullptr;
      o.greedy_probs = nullptr;
      o.device_greedy = verify_ids_.rows(0, greedy_rows(b));  // a replayed step writes its padding rows
      model_.forward(b, kv, logits, o);
      model_.ops().copy_to_host_async(y, verify_ids_host_);
      run_mtp_on_every_row(b);
      model_.ops().wait_host_copies();
      // The caller's buffer too, as a synchronous forward fills it (the runner reads it after the step).
      std::copy_n(verify_ids_host_, b.tokens.size(), opt.greedy_tokens);
    } else {
      model_.forward(b, kv, logits, o);  // synchronous: its ids or logits are on the host after it
    }
    forward_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  TraceSpan verify_span(trace, lane, "spec: verification");

  const int S = int(b.seqs.size()), K = cfg_.num_speculative_tokens;
  BELUGA_ASSERT(int(plan_.size()) == S);
  accepted_.assign(size_t(S), 0);
  tokens_.resize(size_t(S) * size_t(K + 1));
  draft_len_.assign(size_t(S), 0);
  drafts_.resize(size_t(S) * size_t(K));
  draft_q_.resize(size_t(S) * size_t(K));
  mb_.tokens.clear();
  mb_.seqs.clear();
  mb_.logit_rows.clear();
  gather_.clear();
  seq_of_.clear();
  last_pos_.clear();
  std::bernoulli_distribution synthetic(std::max(0.0, cfg_.synthetic_acceptance));
  // The MTP rows of each sequence: every position of its chunk whose next token is known now, i.e.
  // the chunk's tokens and the accepted drafts, the last one followed by the target's bonus token.
  int qs = 0;
  for (int i = 0; i < S; ++i) {
    const SeqChunk& sc = b.seqs[size_t(i)];
    const Plan& p = plan_[size_t(i)];
    const int row0 = qs;
    qs += sc.query_len;
    if (!p.mtp) continue;
    const int k = p.num_draft, chunk_len = sc.query_len - p.num_rows;
    int a = 0, next = p.next_token;
    if (p.sample_row >= 0) {
      const int* draft = b.tokens.data() + row0 + chunk_len;
      int* out = tokens_.data() + size_t(i) * size_t(K + 1);
      // The sequence's sampler at row j (sampler.h; nothing but these fields: samples_speculatively).
      const SampleContext ctx{&p.sampling, &kNone, &kNoCounts, p.num_output, &kNone, p.seed, p.index};
      // Verification of `n` drafts from row j on: rows j..j+n's tokens into out[j..], the drafts accepted.
      auto verify = [&](int j, int n) {
        // On the device (every row greedy: argmaxes; else every row sampled there): row r drew y_r
        // with the uniform of its output position, so the drafts are accepted while equal to the
        // draws and the first other draw is the correction (draft_verifier.h's coupled rule).
        if (opt.greedy_tokens || opt.sampled) {
          auto drawn = [&](int r) {
            return opt.greedy_tokens ? opt.greedy_tokens[r] : opt.sampled[size_t(r) * kSampleOutCols];
          };
          int m = 0;
          for (; m < n && draft[j + m] == drawn(p.sample_row + j + m); ++m) out[j + m] = draft[j + m];
          out[j + m] = drawn(p.sample_row + j + m);
          return m;
        }
        SampleContext at = ctx;
        at.num_output += j;
        return verify_drafts(logits + size_t(p.sample_row + j) * size_t(model_.config().vocab_size),
                             model_.config().vocab_size, at, draft + j, n, out + j, scratch_, index_scratch_);
      };
      if (cfg_.synthetic_acceptance >= 0) {  // accepted at the synthetic rate; the target's token after
        for (; a < k && synthetic(rng_); ++a) out[a] = draft[a];
        verify(a, 0);
      } else {
        a = verify(0, k);
      }
      next = out[a];
    }
    accepted_[size_t(i)] = a;
    if (ngram()) continue;      // no MTP pass: the next drafts come from the tokens at the next plan
    int valid = chunk_len + a;  // rows whose next token is known
    if (next < 0) --valid;      // defensive: no known successor for the last position
    if (valid <= 0) continue;
    // A sampled chunk's MTP rows are all its verify rows, so the MTP step's shape does not depend on
    // acceptance (graphs); rows past `valid` write MTP KV at positions the next step rewrites first.
    const int rows = p.sample_row >= 0 ? sc.query_len : valid;
    const int first = int(mb_.tokens.size());
    for (int r = 0; r < rows; ++r) {
      // x_{i+1} of row r; rows past the known ones take their own token (any id: never read).
      mb_.tokens.push_back(r >= valid              ? b.tokens[size_t(row0 + r)]
                           : r + 1 < chunk_len + a ? b.tokens[size_t(row0 + r + 1)]
                                                   : next);
      gather_.push_back(row0 + r);
    }
    mb_.seqs.push_back({sc.context_len, rows, sc.block_table});
    // Proposals: propose_depth(), as many as fit before the sequence's maximum length.
    const int propose = p.sample_row >= 0 ? std::min(propose_depth(), p.max_length - (p.length + a + 1)) : 0;
    if (propose > 0 && next >= 0) {
      mb_.logit_rows.push_back(first + valid - 1);
      seq_of_.push_back(i);
      last_pos_.push_back(sc.context_len + valid - 1);
      draft_len_[size_t(i)] = propose;
    }
  }
  verify_span.end();
  if (mb_.tokens.empty()) return;
  // Every proposer drafting equally deep (all but those near their maximum length) chains on the
  // device; expert-parallel peers take each pass's ids from the host.
  int depth = seq_of_.empty() ? 0 : draft_len_[size_t(seq_of_[0])];
  for (int i : seq_of_)
    if (draft_len_[size_t(i)] != depth) depth = 0;
  BELUGA_ASSERT(!ahead || (depth > 0 && int(seq_of_.size()) == S));
  if (depth > 0 && !model_.has_step_peers()) {
    TraceSpan span(trace, lane, "spec: mtp chain");
    run_mtp_chain_on_device(b, depth, ahead ? int(b.tokens.size()) : 0);
    return;
  }
  run_mtp_chain(b, trace, lane);
}

void SpecDecoder::run_mtp_chain_on_device(const Batch& b, int depth, int every_row) {
  const int K = cfg_.num_speculative_tokens, P = int(seq_of_.size());
  // The first pass's argmaxes: one a proposer, or (`every_row`) one a verify row, proposer t's at its
  // row mb_.logit_rows[t]. Pass j >= 1 leaves P after them.
  // Each pass's region holds the rows its step may write (a replayed step's padding rows too): the
  // first pass's bound for its batch (the verify step's with every_row, else mb_ as planned), then
  // P sequences of one row.
  const int64_t R0 = every_row > 0 ? greedy_rows(b) : greedy_rows(mb_),
                RP = std::min(DecodeGraphs::logit_rows_bound(P, 1), hidden_.shape[0]);
  BELUGA_ASSERT(depth <= K && 2 * R0 + int64_t(2) * (depth - 1) * RP <= chain_.numel());
  auto at = [&](int j) { return j == 0 ? int64_t(0) : 2 * R0 + int64_t(2) * (j - 1) * RP; };
  auto ids = [&](int j) { return chain_.rows(at(j), at(j) + (j == 0 ? R0 : RP)); };
  auto probs = [&](int j) {
    const int64_t n = j == 0 ? R0 : RP;
    Tensor t = chain_.rows(at(j) + n, at(j) + 2 * n);
    t.dtype = DType::kF32;  // same 4 bytes an element
    return t;
  };
  // Each pass gathers its h rows inside its own step (graph): the first from the verify forward's
  // rows, the second from the proposers' rows of the first's output, later ones read the previous
  // pass's output in place (proposer t at row t).
  ForwardOptions mo;
  mo.final_hidden = &mtp_out_;
  if (every_row == 0) {
    mo.device_greedy = ids(0);
    mo.device_greedy_probs = probs(0);
    mo.hidden_rows = gather_;
    model_.mtp_forward(mb_, hidden_, mtp_kv_, nullptr, mo);
  }
  // Chained passes: proposer t's row is row t, its token the previous pass's draft (on the device;
  // the batch's ids are placeholders), one position further on.
  gather_.assign(mb_.logit_rows.begin(), mb_.logit_rows.end());  // each proposer's row in mtp_out_
  Tensor prev;
  for (int j = 1; j < depth; ++j) {
    if (j == 1) {
      mb_.tokens.assign(size_t(P), 0);
      mb_.seqs.clear();
      mb_.logit_rows.clear();
      for (int t = 0; t < P; ++t) {
        mb_.seqs.push_back({last_pos_[size_t(t)] + 1, 1, b.seqs[size_t(seq_of_[size_t(t)])].block_table});
        mb_.logit_rows.push_back(t);
      }
      mo.hidden_rows = gather_;
      // After a pass over every row, proposer t's draft is that pass's argmax at its row.
      mo.ids_from_hidden_rows = every_row > 0;
    } else {
      for (SeqChunk& sc : mb_.seqs) ++sc.context_len;
      mo.hidden_rows = {};
      mo.ids_from_hidden_rows = false;
    }
    prev = ids(j - 1);
    mo.device_ids = &prev;
    mo.device_greedy = ids(j);
    mo.device_greedy_probs = probs(j);
    model_.mtp_forward(mb_, mtp_out_, mtp_kv_, nullptr, mo);
  }
  chain_host_.resize(size_t(at(depth)));
  model_.ops().copy_to_host(chain_.rows(0, int64_t(chain_host_.size())), chain_host_.data());
  for (int t = 0; t < P; ++t) {
    const size_t first = size_t(seq_of_[size_t(t)]) * size_t(K);
    const size_t r = every_row > 0 ? size_t(gather_[size_t(t)]) : size_t(t);
    drafts_[first] = chain_host_[r];
    draft_q_[first] = std::bit_cast<float>(chain_host_[size_t(R0) + r]);
    for (int j = 1; j < depth; ++j) {
      drafts_[first + size_t(j)] = chain_host_[size_t(at(j)) + size_t(t)];
      draft_q_[first + size_t(j)] = std::bit_cast<float>(chain_host_[size_t(at(j) + RP) + size_t(t)]);
    }
  }
}

void SpecDecoder::run_mtp_chain(const Batch& b, Tracer* trace, int lane) {
  const int K = cfg_.num_speculative_tokens;
  TraceSpan mtp_span(trace, lane, "spec: mtp pass");
  ForwardOptions mo;
  mo.final_hidden = &mtp_out_;
  mo.hidden_rows = gather_;  // each pass gathers its h rows itself
  ids_.resize(mb_.logit_rows.size());
  probs_.resize(mb_.logit_rows.size());
  mo.greedy_tokens = ids_.data();
  mo.greedy_probs = probs_.data();
  const Model::MtpPeerRows rows{gather_, false};  // expert-parallel peers gather their own
  model_.mtp_forward(mb_, hidden_, mtp_kv_, nullptr, mo, &rows);
  for (size_t t = 0; t < seq_of_.size(); ++t) {
    drafts_[size_t(seq_of_[t]) * size_t(K)] = ids_[t];
    draft_q_[size_t(seq_of_[t]) * size_t(K)] = probs_[t];
  }

  mtp_span.end();
  // Chained drafts: the module applied to its own output, one row per sequence still proposing.
  TraceSpan chain_span(K > 1 ? trace : nullptr, lane, "spec: chained mtp");
  out_row_.assign(mb_.logit_rows.begin(), mb_.logit_rows.end());  // each proposer's row in mtp_out_
  for (int j = 1; j < K; ++j) {
    mb_.tokens.clear();
    mb_.seqs.clear();
    mb_.logit_rows.clear();
    gather_.clear();
    size_t n = 0;
    for (size_t t = 0; t < seq_of_.size(); ++t) {
      const int i = seq_of_[t];
      if (draft_len_[size_t(i)] <= j) continue;
      seq_of_[n] = i;
      last_pos_[n] = last_pos_[t] + 1;
      gather_.push_back(out_row_[t]);
      mb_.tokens.push_back(drafts_[size_t(i) * size_t(K) + size_t(j - 1)]);
      mb_.seqs.push_back({last_pos_[n], 1, b.seqs[size_t(i)].block_table});
      mb_.logit_rows.push_back(int(n));
      ++n;
    }
    seq_of_.resize(n);
    last_pos_.resize(n);
    if (n == 0) break;
    ids_.resize(n);
    probs_.resize(n);
    mo.greedy_probs = probs_.data();
    mo.hidden_rows = gather_;  // rows of the previous pass's output, which this pass overwrites
    const Model::MtpPeerRows chained{gather_, true};
    model_.mtp_forward(mb_, mtp_out_, mtp_kv_, nullptr, mo, &chained);
    out_row_.resize(n);
    for (size_t t = 0; t < n; ++t) {
      drafts_[size_t(seq_of_[t]) * size_t(K) + size_t(j)] = ids_[t];
      draft_q_[size_t(seq_of_[t]) * size_t(K) + size_t(j)] = probs_[t];
      out_row_[t] = int32_t(t);
    }
  }
}

int SpecDecoder::steady_shape() const {
  if (plan_.empty()) return -1;
  // Prompt lookup finds fewer than k drafts (or none) for some sequences: its step's shape is the
  // gate's choice, and the step's cost, whatever was found, is what choosing k costs.
  int rows = 0;
  for (const Plan& p : plan_) {
    if (!p.decode || p.mtp != plan_mtp_ || (plan_mtp_ && p.sample_row < 0)) return -1;
    rows += p.num_rows;
  }
  // Ragged admissions (an eager backend) verify different counts: the step's mean depth, rounded.
  return ngram() || !plan_mtp_ ? plan_k_ : (2 * rows + int(plan_.size())) / (2 * int(plan_.size()));
}

void SpecDecoder::after_apply(const SpecStep& step, const std::function<Seq*(int slot, int index)>& find,
                              Scheduler& scheduler, std::vector<int>* published,
                              std::vector<BlockHash>* published_keys,
                              std::vector<const std::string*>* published_classes) {
  const int K = cfg_.num_speculative_tokens;
  // The period since the previous step's results is this step's cost: a steady decode step was
  // launched in the iteration that applied the previous one, so idle time rarely falls inside (the
  // gate drops outliers).
  const auto now = std::chrono::steady_clock::now();
  const double period = std::chrono::duration<double>(now - last_apply_).count();
  const bool timed = last_apply_.time_since_epoch().count() != 0;
  last_apply_ = now;
  if (!step.drafting) {  // plain: one token per sequence; plan_ may be the next step's already
    if (timed && step.steady >= 0) gate_.observe_step(step.batch, false, step.steady, step.batch, period);
    return;
  }
  BELUGA_ASSERT(step.batch == int(plan_.size()) && plan_mtp_);  // drafting steps never overlap
  if (timed && step.steady >= 0) {
    int tokens = 0;
    for (size_t i = 0; i < plan_.size(); ++i) tokens += 1 + accepted_[i];
    gate_.observe_step(step.batch, true, step.steady, tokens, period, forward_seconds_, plan_explored_);
  }
  commit_.clear();
  for (size_t i = 0; i < plan_.size(); ++i) {
    const Plan& p = plan_[i];
    if (!p.mtp || p.sample_row < 0) continue;
    Seq* s = find(p.slot, p.index);
    if (!s) continue;  // aborted while the step ran
    const int a = accepted_[i];
    // Prompt lookup: a decode whose lookup found fewer drafts than the step's depth, all verified,
    // counts the first missing one as rejected, so the gate's acceptance includes how often a
    // lookup finds nothing.
    const int missing = ngram() && p.decode && p.num_draft == p.held && p.held < plan_k_ ? 1 : 0;
    if (p.num_draft + missing > 0)
      gate_.observe_acceptance(p.num_draft + missing, a,
                               !ngram() && p.q.size() >= size_t(p.num_draft) ? p.q.data() : nullptr,
                               p.sampled);
    if (p.num_draft > 0) {
      stats_.drafts++;
      stats_.draft_tokens += p.num_draft;
      stats_.accepted_tokens += a;
      for (int j = 0; j < a; ++j) stats_.accepted_per_position[size_t(j)]++;
    }
    if (s->finish != FinishReason::kNone) continue;  // its blocks are released already
    BELUGA_ASSERT(int(s->tokens.size()) == p.length + a + 1);
    if (a > 0) commit_.push_back({s, p.length, a, false});
    s->draft.assign(drafts_.begin() + int64_t(i) * K, drafts_.begin() + int64_t(i) * K + draft_len_[i]);
    s->draft_q.assign(draft_q_.begin() + int64_t(i) * K, draft_q_.begin() + int64_t(i) * K + draft_len_[i]);
  }
  // The accepted drafts' KV is valid now: count it computed and publish the blocks it fills.
  if (!commit_.empty()) scheduler.commit(commit_, published, published_keys, published_classes);
}

}  // namespace beluga
