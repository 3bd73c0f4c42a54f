// Scheduler: decides each step's work under a token budget and a sequence cap. Running sequences
// go first (oldest first: decodes and unfinished prefill chunks), then waiting ones in arrival order,
// each reusing its longest cached prefix. When blocks run out the youngest running sequence is
// preempted: its blocks are released and it is recomputed later from its tokens so far. With a
// partitioned block manager (attention data parallelism) only sequences of the same partition give
// way: freeing another rank's blocks would not make room.
//
// With a KV connector, a waiting sequence whose prefix continues below the device pool (host memory,
// files) gets device blocks for it and waits in a loading list, not scheduled and not blocking the
// queue, until the connector has fetched the blocks; then it goes back to the front of the queue with
// those blocks computed (their host -> device copies run before the step's forward: take_loads()).
//
// With a LatencyPolicy (latency_policy.h) whose ITL target is on, decodes are scheduled first and
// prefill chunks (running ones, then waiting prompts) share the budget the policy gives for this step;
// with its TTFT SLO on, waiting prompts are admitted in the policy's order rather than by arrival.
//
// The engine schedules step N+1 while step N is still running, before N's samples are known. A
// sequence's length is therefore tokens.size() + pending: a decode chunk may cover a token that step N
// is still sampling; the engine appends it before it builds the batch.
#pragma once

#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/block_manager.h"
#include "engine/kv_connector.h"
#include "engine/latency_policy.h"
#include "engine/request.h"

namespace beluga {

struct Seq {
  int64_t order = 0;  // admission order; larger is younger
  int request = 0;    // the engine's request slot
  int index = 0;      // 0..n-1 within the request
  const std::string* salt = nullptr;
  const std::string* traffic_class = nullptr;  // the request's (KV connector retention)
  // When set: at most this many leading tokens may come from the prefix cache (prompt logprobs need
  // the logits of the positions from there on). Owned by the engine's request; read at admission.
  const int* prefix_cap = nullptr;
  std::vector<int> tokens;  // prompt, then generated tokens
  int pending = 0;          // tokens sampled by the step in flight, not yet in `tokens` (0 or 1)
  int pending_row = -1;     // the logit row of the step that samples it (a future token's name)
  int max_length = 0;       // length at which it finishes for sure (max_tokens, max_model_len); 0: none
  int num_prompt = 0;
  int num_computed = 0;      // tokens whose KV is in the cache
  int num_cached = 0;        // prompt tokens found in the prefix cache at first admission (every tier)
  int num_cached_below = 0;  // of which loaded from below the device pool
  int num_cached_disk = 0;   // of those, read from the file tier (the rest: host memory)
  bool admitted_once = false;
  double arrival = 0;     // seconds on the engine's clock when it entered the queue (admission order)
  int64_t kv_load = -1;   // the connector's load in progress (the sequence is in the loading list)
  int kv_load_first = 0;  // the first block it loads
  std::vector<int> blocks;
  std::vector<BlockHash> hashes;  // keys of the leading full blocks already published
  std::unordered_map<int, int> output_counts;
  std::vector<int> draft;      // speculative decoding: tokens proposed to follow `tokens`, verified next step
  std::vector<float> draft_q;  // and the proposer's score of each (SpecGate's confidence; none for ngram)
  FinishReason finish = FinishReason::kNone;
  int num_output() const { return int(tokens.size()) - num_prompt; }
  int length() const { return int(tokens.size()) + pending; }  // what the scheduler plans with
};

struct Chunk {
  Seq* seq;
  int start, len;
  bool sample;  // the chunk ends at the sequence's length(): its logits give the next token
};

class Scheduler {
 public:
  // `lookahead`: KV slots each sequence reserves past its length (speculative decoding writes the
  // draft tokens and the MTP chain there), capped at its max_length. Its drafts count in the budget.
  // `policy` (may be null: today's order and budget) must outlive the scheduler.
  Scheduler(BlockManager& blocks, int max_num_seqs, int max_num_batched_tokens, KvConnector* kv = nullptr,
            int lookahead = 0, const LatencyPolicy* policy = nullptr);

  void add(Seq* s);     // to the back of the waiting queue
  void remove(Seq* s);  // finished or aborted: releases its blocks
  // This step's chunks (into `chunks`, cleared first); `stuck` is set when a waiting sequence can never
  // fit in the whole cache. A waiting sequence with a pending token is not admitted until the token is
  // applied (its prefix lookup needs all its tokens); a running one whose pending token is its last
  // (length() >= max_length) is not scheduled: it finishes when the token is applied.
  // `now`: seconds on the clock of Seq::arrival (the policy's aging); unused without a TTFT SLO.
  void schedule(std::vector<Chunk>& chunks, Seq** stuck, double now = 0);
  // Once the step is launched (steps run in order, so the next one sees this one's KV): advances
  // num_computed and publishes newly full blocks to the prefix index; appends those blocks to
  // `published` when given. Every chunk's tokens must be known by then.
  // `published_keys`, when given, gets each published block's key beside it, and `published_classes`
  // its sequence's traffic class.
  void commit(const std::vector<Chunk>& chunks, std::vector<int>* published = nullptr,
              std::vector<BlockHash>* published_keys = nullptr,
              std::vector<const std::string*>* published_classes = nullptr);
  // The host -> device copies of loads finished by schedule() calls since the last take (they must
  // run with the next step launched); swaps them into `out`.
  void take_loads(std::vector<KvCopy>& out);
  bool has_loads() const { return !loads_.empty(); }

  int num_running() const { return int(running_.size()); }
  int num_waiting() const { return int(waiting_.size() + loading_.size()); }
  int num_loading() const { return int(loading_.size()); }
  int64_t preemptions() const { return preemptions_; }
  int64_t cache_queries() const { return cache_queries_; }
  int64_t cache_hits() const { return cache_hits_; }              // every tier
  int64_t cache_hits_below() const { return cache_hits_below_; }  // of which loaded from below

 private:
  void preempt(Seq* s);
  // Running sequence s's next chunk of at most `budget` tokens, preempting younger unscheduled ones
  // (or s) when blocks run out (setting `preempted`: the step takes no new work then); false when s
  // itself was preempted.
  bool schedule_running(Seq* s, std::vector<Chunk>& chunks, int& budget, bool& preempted);
  void order_waiting(double now);
  void finish_loads();
  bool grow(Seq* s, int tokens);  // the table for `tokens` plus the lookahead
  // For a waiting sequence that just took its device prefix: starts loading what continues below;
  // true when it went to the loading list.
  bool start_load(Seq* s, const std::vector<BlockHash>& hashes);

  BlockManager& bm_;
  int max_seqs_, max_tokens_, lookahead_;
  const LatencyPolicy* policy_;
  std::vector<Seq*> running_;  // admission order
  std::deque<Seq*> waiting_;
  KvConnector* kv_;
  std::vector<Seq*> loading_;       // admission order
  std::vector<KvCopy> loads_;       // finished loads' copies, for the next step
  std::vector<KvTier> load_tiers_;  // finish_load's tiers (kept: no allocation per load)
  std::vector<KvTier> tiers_;       // scratch
  int64_t preemptions_ = 0, cache_queries_ = 0, cache_hits_ = 0, cache_hits_below_ = 0;
};

}  // namespace beluga
