#include "engine/scheduler.h"

#include <algorithm>

#include "model/batch.h"
#include "util/error.h"

namespace beluga {

Scheduler::Scheduler(BlockManager& blocks, int max_num_seqs, int max_num_batched_tokens, KvConnector* kv,
                     int lookahead, const LatencyPolicy* policy)
    : bm_(blocks),
      max_seqs_(max_num_seqs),
      max_tokens_(max_num_batched_tokens),
      lookahead_(lookahead),
      policy_(policy),
      kv_(kv) {
  BELUGA_CHECK(max_seqs_ > 0 && max_tokens_ > 0, "max_num_seqs and max_num_batched_tokens must be positive");
}

void Scheduler::add(Seq* s) {
  waiting_.push_back(s);
}

bool Scheduler::grow(Seq* s, int tokens) {
  if (lookahead_ > 0) {
    const int extra = tokens + lookahead_;
    tokens = std::max(tokens, s->max_length > 0 ? std::min(extra, s->max_length) : extra);
  }
  return bm_.grow(s->blocks, tokens);
}

void Scheduler::remove(Seq* s) {
  if (s->kv_load >= 0) {
    kv_->cancel_load(s->kv_load);
    s->kv_load = -1;
    loading_.erase(std::remove(loading_.begin(), loading_.end(), s), loading_.end());
  }
  bm_.release(s->blocks);
  s->hashes.clear();
  running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), s), waiting_.end());
}

void Scheduler::preempt(Seq* s) {
  bm_.release(s->blocks);
  s->hashes.clear();
  s->num_computed = 0;
  running_.erase(std::remove(running_.begin(), running_.end(), s), running_.end());
  waiting_.push_front(s);
  ++preemptions_;
}

bool Scheduler::start_load(Seq* s, const std::vector<BlockHash>& hashes) {
  const int have = int(s->blocks.size());
  const int rest = int(hashes.size()) - have;
  if (!kv_) return false;
  if (have > 0) kv_->touch(hashes.data(), have, *s->traffic_class);
  if (rest <= 0) return false;
  const int n = kv_->lookup(hashes.data() + have, rest, nullptr);
  // No room for the blocks now: compute them instead (the queue does not wait for a load).
  if (n <= 0 || !bm_.grow(s->blocks, (have + n) * kKvBlockSize)) return false;
  s->kv_load = kv_->start_load(hashes.data() + have, s->blocks.data() + have, n, *s->traffic_class);
  s->kv_load_first = have;
  waiting_.pop_front();
  loading_.push_back(s);
  return true;
}

void Scheduler::finish_loads() {
  size_t ready = 0;  // loaded sequences go back to the front of the queue, in admission order
  for (size_t i = 0; i < loading_.size(); ++i) {
    Seq* s = loading_[i];
    if (!kv_->load_ready(s->kv_load)) {
      loading_[i - ready] = s;
      continue;
    }
    load_tiers_.resize(std::max(load_tiers_.size(), s->blocks.size()));
    const int got = kv_->finish_load(s->kv_load, loads_, load_tiers_.data());
    s->kv_load = -1;
    // Blocks past what was found stay in the table, to be computed.
    s->num_computed = (s->kv_load_first + got) * kKvBlockSize;
    if (!s->admitted_once) {
      s->num_cached = s->num_computed;
      s->num_cached_below = got * kKvBlockSize;
      s->num_cached_disk =
          int(std::count(load_tiers_.begin(), load_tiers_.begin() + got, KvTier::kDisk)) * kKvBlockSize;
    }
    waiting_.insert(waiting_.begin() + int64_t(ready), s);
    ++ready;
  }
  loading_.resize(loading_.size() - ready);
}

void Scheduler::take_loads(std::vector<KvCopy>& out) {
  out.swap(loads_);
  loads_.clear();
}

bool Scheduler::schedule_running(Seq* s, std::vector<Chunk>& chunks, int& budget, bool& preempted) {
  if (s->max_length > 0 && s->length() >= s->max_length) return true;  // its pending token ends it
  const int n = std::min(s->length() - s->num_computed, budget);
  if (n <= 0) return true;
  // The youngest makes room unless it has a chunk in this step already (decodes go first under the
  // policy; in arrival order the youngest is never scheduled before s).
  const auto scheduled = [&](const Seq* y) {
    return std::any_of(chunks.begin(), chunks.end(), [&](const Chunk& c) { return c.seq == y; });
  };
  // Only a sequence whose blocks share s's partition makes room for it (attention data parallelism:
  // each rank's cache is its own); with one partition that is the youngest.
  const auto victim = [&]() -> Seq* {
    for (auto it = running_.rbegin(); it != running_.rend() && *it != s; ++it) {
      Seq* y = *it;
      if (bm_.num_partitions() > 1 &&
          (y->blocks.empty() || s->blocks.empty() ||
           bm_.partition_of(y->blocks.front()) != bm_.partition_of(s->blocks.front())))
        continue;
      return scheduled(y) ? nullptr : y;
    }
    return nullptr;
  };
  bool fits = grow(s, s->num_computed + n);
  for (Seq* y; !fits && (y = victim()) != nullptr;) {
    preempt(y);
    preempted = true;
    fits = grow(s, s->num_computed + n);
  }
  if (!fits) {
    preempt(s);
    preempted = true;
    return false;
  }
  chunks.push_back({s, s->num_computed, n, s->num_computed + n == s->length()});
  budget -= n + int(s->draft.size());
  return true;
}

void Scheduler::order_waiting(double now) {
  // Sequences that ran before keep the front, in their order; the rest in the policy's order.
  const auto fresh =
      std::stable_partition(waiting_.begin(), waiting_.end(), [](const Seq* s) { return s->admitted_once; });
  std::stable_sort(fresh, waiting_.end(), [&](const Seq* a, const Seq* b) {
    return policy_->admits_before(now - a->arrival, int(a->tokens.size()), now - b->arrival,
                                  int(b->tokens.size()));
  });
}

void Scheduler::schedule(std::vector<Chunk>& chunks, Seq** stuck, double now) {
  *stuck = nullptr;
  chunks.clear();
  if (kv_ && !loading_.empty()) finish_loads();
  int budget = max_tokens_;
  bool preempted = false;
  if (policy_ && policy_->config().budget_on()) {
    // Decodes first (every running sequence past its prompt), then the policy's prefill budget for the
    // running prompts' next chunks and the waiting prompts.
    bool go = true;
    for (size_t i = 0; i < running_.size() && budget > 0 && go; ++i)
      if (running_[i]->num_computed >= running_[i]->num_prompt)
        go = schedule_running(running_[i], chunks, budget, preempted);
    budget = std::min(budget, policy_->prefill_budget(max_tokens_ - budget, max_tokens_));
    for (size_t i = 0; i < running_.size() && budget > 0 && go; ++i)
      if (running_[i]->num_computed < running_[i]->num_prompt)
        go = schedule_running(running_[i], chunks, budget, preempted);
  } else {
    for (size_t i = 0; i < running_.size() && budget > 0; ++i)
      if (!schedule_running(running_[i], chunks, budget, preempted)) break;
  }
  if (!preempted && policy_ && policy_->config().admission_on()) order_waiting(now);
  // New work only when nothing had to give way this step.
  while (!preempted && !waiting_.empty() && budget > 0 &&
         int(running_.size() + loading_.size()) < max_seqs_) {
    Seq* s = waiting_.front();
    // Preempted while its sample was in flight: wait (in order) until the engine has applied it.
    if (s->pending > 0) break;
    if (s->num_computed == 0 && s->blocks.empty()) {
      // Share the longest cached prefix, but compute at least the last token (its logits are needed)
      // and every position from the prefix cap on.
      size_t cacheable = s->tokens.size() - 1;
      if (s->prefix_cap) cacheable = std::min(cacheable, size_t(std::max(0, *s->prefix_cap)));
      const auto hashes = block_hashes(s->tokens, *s->salt, cacheable / kKvBlockSize);
      s->blocks = bm_.acquire_prefix(hashes, int(s->tokens.size()));
      s->num_computed = int(s->blocks.size()) * kKvBlockSize;
      s->hashes.assign(hashes.begin(), hashes.begin() + int64_t(s->blocks.size()));
      if (!s->admitted_once) {
        s->num_cached = s->num_computed;
        s->num_cached_below = 0;
        s->num_cached_disk = 0;
      }
      if (start_load(s, hashes)) continue;  // it waits in the loading list; the next one's turn
    }
    const int n = std::min(int(s->tokens.size()) - s->num_computed, budget);
    if (!grow(s, s->num_computed + n)) {
      // Nothing will ever free more blocks.
      if (running_.empty() && chunks.empty() && loading_.empty()) *stuck = s;
      bm_.release(s->blocks);
      s->hashes.clear();
      s->num_computed = 0;
      break;
    }
    if (!s->admitted_once) {
      cache_queries_ += s->num_prompt;
      cache_hits_ += s->num_cached;
      cache_hits_below_ += s->num_cached_below;
    }
    s->admitted_once = true;
    waiting_.pop_front();
    running_.push_back(s);
    chunks.push_back({s, s->num_computed, n, s->num_computed + n == int(s->tokens.size())});
    budget -= n;
  }
}

void Scheduler::commit(const std::vector<Chunk>& chunks, std::vector<int>* published,
                       std::vector<BlockHash>* published_keys,
                       std::vector<const std::string*>* published_classes) {
  for (const Chunk& c : chunks) {
    Seq* s = c.seq;
    BELUGA_ASSERT(c.start + c.len <= int(s->tokens.size()));
    s->num_computed = c.start + c.len;
    const int full = s->num_computed / kKvBlockSize;
    for (int b = int(s->hashes.size()); b < full; ++b) {
      const BlockHash prev = b == 0 ? BlockHash{} : s->hashes.back();
      s->hashes.push_back(chain_hash(prev, s->tokens.data() + int64_t(b) * kKvBlockSize, *s->salt));
      bm_.publish(s->blocks[size_t(b)], s->hashes.back());
      if (published) published->push_back(s->blocks[size_t(b)]);
      if (published_keys) published_keys->push_back(s->hashes.back());
      if (published_classes) published_classes->push_back(s->traffic_class);
    }
  }
}

}  // namespace beluga
