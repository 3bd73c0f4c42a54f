// SpecDecoder: speculative decoding with the model's MTP module as proposer, or prompt lookup
// (method "ngram", engine/ngram_proposer.h: drafts from the sequence's own tokens, no MTP pass; the
// rest below is the same) (DESIGN.md §3, the proposer/verifier seam). Each sequence that samples from raw
// logits (samples_speculatively: greedy or temperature > 0 with top_k / top_p / min_p) verifies the draft
// tokens proposed for it in the previous step as extra query tokens of its decode chunk (one batched
// forward, prefill-style rows) by speculative sampling (draft_verifier.h: greedy, the longest prefix equal
// to the target's argmaxes; sampled, rejection sampling with one-hot drafts), and gets the target's token
// after the accepted ones: 1 + accepted tokens per step, the tokens decoding without speculation gives
// (greedy; sampled with the same seed). The MTP module then runs over the step's accepted positions (its KV
// lives in a cache of its own that shares the main cache's block tables, so rolling back a sequence's length
// rolls back both) and, chained on its own output, proposes the next step's drafts (the chained passes
// read the previous pass's drafts on the device: the chain costs one host round trip, not one a pass).
// When every sequence is a greedy decode (argmaxes on the device), the first MTP pass does not wait for
// verification: its rows are all verify rows and row r's token is the target's argmax at r (for the
// accepted rows and the correction, the token that follows; later rows are never read), so it is
// queued behind the verify forward while the argmaxes come back (mtp_ahead), and the chained passes
// pick each proposer's row on the device.
//
// Gating (SpecGate): before each step the engine calls begin_step(); the gate decides whether the step
// drafts (the regime, by measured tokens per second: plain steps run no MTP pass and overlap as
// usual) and, if so, admits each decode sequence's drafts by their calibrated confidence (the MTP
// head's probability of each draft) and the measured cost of each depth (0: the MTP pass only). On a
// backend replaying graphs a sequence with fewer admitted drafts than the depth carries filler rows
// (computed, not verified). after_apply() feeds the gate each steady decode step's period, tokens and
// the drafts accepted. Positions decoded plainly get no MTP KV: drafts proposed later attend over
// those stale entries (acceptance may drop; output never changes, verification decides it).
// Verify and MTP steps of one uniform shape replay CUDA graphs (DecodeGraphs): every decode sequence
// verifies the same number of drafts, and the MTP pass runs over all verify rows of a decode sequence
// (rows past the accepted prefix write MTP KV at positions the next step overwrites before anything
// reads them), so its shape does not depend on acceptance.
//
// Threads: begin_step(), plan_chunk() and after_apply() run on the engine thread between steps, run_step() on
// the model runner's thread during one (ModelRunner calls it instead of Model::forward). The engine runs
// steps one after another while a step speculates (the next step's chunks depend on what it accepts);
// steps without speculating sequences overlap as usual.
//
// KV rollback: the scheduler commits a verify chunk as one token; after_apply() commits the accepted
// drafts' positions (publishing full blocks to the prefix index only then), so rejected positions are
// never counted, never published, and are overwritten by the next step. Sequences reserve
// `lookahead()` slots past their length for the draft and MTP-chain positions (Scheduler).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/spec_config.h"
#include "engine/spec_gate.h"
#include "model/model.h"
#include "util/trace.h"

namespace beluga {

// What the engine keeps of a planned step until it is applied (a plain step may be applied after the
// next one was planned: it was launched early behind it).
struct SpecStep {
  int batch = 0;          // sequences
  bool drafting = false;  // runs the MTP pass / verifies drafts: SpecDecoder::run_step, never early
  int steady = -1;        // the depth if a steady decode step (SpecDecoder::steady_shape), else -1
};

struct SpecStats {
  int64_t drafts = 0;        // sequence-steps that verified at least one draft token
  int64_t draft_tokens = 0;  // draft tokens verified
  int64_t accepted_tokens = 0;
  std::vector<int64_t> accepted_per_position;  // [K]: drafts accepted at position k (0-based)
};

class SpecDecoder {
 public:
  // `max_rows`: the most tokens one step can hold (the scheduler's budget plus every sequence's drafts).
  // `mtp_ahead`: whether steps that allow it queue their first MTP pass before verifying (mtp_ahead()).
  SpecDecoder(Model& model, const SpecConfig& cfg, int num_blocks, int max_rows, bool mtp_ahead);
  ~SpecDecoder();
  SpecDecoder(const SpecDecoder&) = delete;
  SpecDecoder& operator=(const SpecDecoder&) = delete;

  const SpecConfig& config() const { return cfg_; }
  int lookahead() const { return 2 * cfg_.num_speculative_tokens; }

  // Engine thread, building a step: called for batch sequence `i` (in order, i = 0 first) right after
  // its chunk's tokens and sample row (logit row `sample_row`, -1 when the chunk does not sample) went
  // into `b`. `sampling`: the sequence's context if it is eligible (samples_speculatively() and no
  // logits processor), else null; what verification needs of it is copied. For an eligible sequence
  // whose chunk is the decode of its last token, appends its drafts to the chunk's query and their
  // logit rows; returns how many.
  int plan_chunk(int i, Seq& s, const Chunk& c, const SampleContext* sampling, int sample_row, Batch& b);
  // Engine thread, before plan_chunk() for the step's `chunks`: eligible[i] is chunk i's sampling
  // parameters if its sequence may speculate (as plan_chunk's `sampling`), else null. Prompt lookup
  // proposes here; the gate admits drafts.
  // A sequence with a token pending (a step launched early) counts it as known.
  void begin_step(const std::vector<Chunk>& chunks, const std::vector<const SamplingParams*>& eligible);
  // Whether the next begin_step() with these arguments will plan a plain step (the gate will not
  // draft): such a step may be launched early, before the step ahead is applied, as without
  // speculation (engine_launch.cc).
  bool plain_next(const std::vector<Chunk>& chunks, const std::vector<const SamplingParams*>& eligible) const;
  // The step planned last (after its plan_chunk() calls).
  SpecStep planned() const { return {int(plan_.size()), plan_mtp_, steady_shape()}; }
  int step_drafts() const { return step_k_; }
  bool ngram() const { return cfg_.method == SpecConfig::Method::kNgram; }
  const SpecGate& gate() const { return gate_; }
  // Runner thread: the step's forward, the verification and the MTP pass (proposals for the next step).
  // Only for a drafting step (planned().drafting); a plain one is Model::forward alone. With `trace`,
  // its phases (the verify forward, verification, MTP pass, chained MTP steps) are spans on `lane`.
  void run_step(const Batch& b, KvCache& kv, float* logits, const ForwardOptions& opt,
                Tracer* trace = nullptr, int lane = 0);
  // Whether batch sequence i (of the step planned last) is sampled by the verifier: its rows' tokens
  // are token(i, j), not the engine's sampler's.
  bool verifies(int i) const { return plan_[size_t(i)].mtp && plan_[size_t(i)].sample_row >= 0; }
  // Engine thread, after the step ran: drafts accepted by batch sequence i (its rows past 1 + accepted
  // must be skipped), and the token its row j (0..accepted) emits.
  int accepted(int i) const { return accepted_[size_t(i)]; }
  int token(int i, int j) const {
    return tokens_[size_t(i) * size_t(cfg_.num_speculative_tokens + 1) + size_t(j)];
  }
  // Engine thread, after the rows of `step` (its planned()) were applied: feeds the gate its period;
  // for a drafting step (the one planned last) commits the accepted positions of the step's
  // sequences that are still running (`find` maps a (request slot, index) to its Seq, or null once
  // aborted), stores the next drafts in each Seq, counts the statistics. The blocks this commit
  // publishes are appended to `published` (with their keys and traffic classes, as
  // Scheduler::commit gives them) when it is given.
  void after_apply(const SpecStep& step, const std::function<Seq*(int slot, int index)>& find,
                   Scheduler& scheduler, std::vector<int>* published = nullptr,
                   std::vector<BlockHash>* published_keys = nullptr,
                   std::vector<const std::string*>* published_classes = nullptr);
  // The MTP module's KV cache (its layer goes into the KV connector's block images), or null
  // (prompt lookup).
  const KvCache* mtp_kv() const { return ngram() ? nullptr : &mtp_kv_; }
  const SpecStats& stats() const { return stats_; }
  // Whether the step last planned has a sequence whose results feed the next step's plan (it samples
  // and is eligible): the engine then applies it before scheduling the next one.
  bool speculating() const {
    return std::any_of(plan_.begin(), plan_.end(), [](const Plan& p) { return p.mtp && p.sample_row >= 0; });
  }

 private:
  struct Plan {
    int slot = 0, index = 0;
    bool mtp = false;      // eligible: MTP rows for this sequence
    int num_draft = 0;     // drafts appended to its query and verified
    int num_rows = 0;      // rows appended (num_draft, then filler rows up to the step's depth)
    int held = 0;          // drafts it held when the gate planned
    std::vector<float> q;  // the verified drafts' scores (MTP)
    bool sampled = false;
    int sample_row = -1;  // its first logit row (-1: not sampled)
    int next_token = -1;  // not sampled: the token after the chunk
    int length = 0;       // the sequence's tokens before this step
    int max_length = 0;
    bool decode = false;  // the chunk decodes the sequence's last token and samples
    // What its rows sample from (eligible sequences: samples_speculatively, so only these fields).
    SamplingParams sampling;
    uint64_t seed = 0;
    int num_output = 0;
  };
  // The depth of the step just applied if it was a steady decode step (every sequence a decode, all
  // drafting or all plain: 0): the drafts its sequences verified, their mean rounded; else -1.
  int steady_shape() const;
  // The MTP pass over mb_ (its proposers seq_of_, their rows in mtp_out_ mb_.logit_rows) and the
  // chained passes after it, drafts into drafts_ / draft_q_.
  // `b` is the verify step's batch (the proposers' block tables).
  void run_mtp_chain(const Batch& b, Tracer* trace, int lane);
  // The passes of one proposal chain when every proposer drafts `depth` tokens: each reads the
  // previous pass's drafts on the device, one read-back at the end. With `every_row` > 0 the first
  // pass ran already (run_mtp_on_every_row, over that many rows).
  void run_mtp_chain_on_device(const Batch& b, int depth, int every_row);
  // Whether the step's MTP pass can be queued behind its verify forward, before the host has
  // verified anything: every sequence a decode verifying on the device by argmax (greedy), its rows
  // all logit rows, drafting as deep whatever it accepts; no peers, no synthetic acceptance.
  bool mtp_ahead(const Batch& b, const ForwardOptions& opt) const;
  // Drafts a sequence proposes for the next step, room allowing: one past the step's depth (so the
  // gate can go deeper), up to K.
  int propose_depth() const { return std::min(cfg_.num_speculative_tokens, step_k_ + 1); }
  // That first MTP pass: every verify row, its token the forward's argmax left in verify_ids_ (row r
  // of an accepted prefix continues with the draft it accepted, the next with the correction; later
  // rows are never read), every row's argmax and probability into chain_.
  void run_mtp_on_every_row(const Batch& b);
  // Whether chunk c of sequence s decodes its last token (a pending one included).
  static bool is_decode(const Chunk& c, const Seq& s) {
    return c.sample && c.len == 1 && c.start + 1 == int(s.tokens.size()) + s.pending;
  }

  // The rows a device argmax buffer for `b`'s logit rows holds (DecodeGraphs::logit_rows_bound, at
  // most the buffers' rows: an eager step writes only its own, fewer).
  int64_t greedy_rows(const Batch& b) const;

  Model& model_;
  SpecConfig cfg_;
  KvCache mtp_kv_;
  Tensor hidden_;   // the step's final hidden states, every row
  Tensor mtp_out_;  // its own normed output (chained into the next MTP step)
  // The drafts of a chain kept on the device (run_mtp_chain_on_device): the first pass's ids and their
  // probabilities (F32 bits), R0 rows each (greedy_rows of its batch: P proposers or every verify row,
  // padded), then pass j's ids and probabilities (RP rows each: P, padded); read back once after the
  // last pass.
  Tensor chain_;
  std::vector<int32_t> chain_host_;
  Tensor verify_ids_;                   // the verify forward's argmaxes (MTP ahead)
  int32_t* verify_ids_host_ = nullptr;  // and their copy (Ops::host_alloc: page-locked on CUDA)
  std::vector<Plan> plan_;              // per batch sequence of the step being built / in flight
  // Runner-thread results, read by the engine after wait().
  std::vector<int> accepted_;
  std::vector<int> tokens_;     // [seq, K + 1] flat: the tokens each row emits, 1 + accepted_ of each valid
  std::vector<int> drafts_;     // [seq, K] flat: next drafts, draft_len_ of each valid
  std::vector<float> draft_q_;  // [seq, K] flat: their scores
  std::vector<int> draft_len_;
  // Runner-thread scratch, reused every step.
  Batch mb_;
  std::vector<int32_t> gather_, ids_, seq_of_, last_pos_, out_row_;
  std::vector<float> probs_;
  std::vector<Chunk> commit_;        // engine thread
  std::vector<DraftScores> scores_;  // begin_step's: the eligible decodes' drafts
  std::vector<int> score_seq_, admit_scores_;
  std::vector<int> admit_, held_;  // per chunk of the step being planned: drafts admitted / held
  std::vector<float> scratch_;     // the verifier's sampler (runner thread)
  std::vector<int> index_scratch_;
  std::mt19937_64 rng_{0x5eed};
  SpecStats stats_;
  SpecGate gate_;
  int step_k_ = 0;              // drafts of the step being planned / in flight (gate's choice)
  int plan_k_ = 0;              // the gate's choice for the step in plan_
  bool step_mtp_ = false;       // whether the step being planned drafts (runs the MTP pass)
  bool plan_mtp_ = false;       // and the step in plan_
  bool step_explored_ = false;  // whether the gate explored the depth of the step being planned
  bool plan_explored_ = false;  // and of the step in plan_
  bool allow_ahead_ = false;    // the constructor's mtp_ahead
  std::chrono::steady_clock::time_point last_apply_{};
  double forward_seconds_ = 0;  // the last drafting step's verify forward (runner thread; read after it)
};

}  // namespace beluga
