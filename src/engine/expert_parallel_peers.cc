#include "engine/expert_parallel_peers.h"

#include "util/error.h"

namespace beluga {

ExpertParallelPeers::ExpertParallelPeers(const ModelConfig& cfg, WeightSource& src, int max_positions,
                                         LocalGroup& group, const ExpertSharding& sharding, CpuOptions cpu)
    : group_(group) {
  for (int r = 1; r < group.size(); ++r) {
    auto p = std::make_unique<Peer>();
    p->ops = std::make_unique<CpuOps>(cpu);
    p->ep = std::make_unique<ExpertParallelism>(ExpertParallelism{&group.communicator(r), &sharding, true});
    p->model = load_model(cfg, src, *p->ops, max_positions, p->ep.get());
    peers_.push_back(std::move(p));
  }
  for (auto& p : peers_) p->thread = std::thread([this, q = p.get()] { run(*q); });
}

ExpertParallelPeers::~ExpertParallelPeers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& p : peers_) p->thread.join();
}

void ExpertParallelPeers::begin(const Batch& b, int num_blocks) {
  std::lock_guard<std::mutex> lock(mu_);
  batch_.tokens = b.tokens;
  batch_.seqs = b.seqs;
  batch_.logit_rows.clear();
  num_blocks_ = num_blocks;
  done_ = 0;
  ++step_;
  cv_.notify_all();
}

void ExpertParallelPeers::load_blocks(std::span<const KvBlockCopy> loads, int num_blocks) {
  // Between steps (the last one's end() has returned): the peers' threads wait for the next begin(),
  // so their caches are the caller's to write.
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& p : peers_) {
    if (p->kv.num_blocks != num_blocks) p->kv = p->model->make_kv_cache(num_blocks);
    p->ops->kv_blocks_from_host(p->kv.layers, loads);
  }
}

void ExpertParallelPeers::end() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ == int(peers_.size()); });
  for (auto& p : peers_)
    if (p->error) std::rethrow_exception(p->error);
}

void ExpertParallelPeers::abort() {
  group_.communicator(0).abort();
}

void ExpertParallelPeers::run(Peer& p) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || step_ != seen; });
      if (stop_) return;
      seen = step_;
    }
    // batch_ and num_blocks_ do not change until every peer is done (end() comes first).
    if (!p.error) {
      try {
        if (p.kv.num_blocks != num_blocks_) p.kv = p.model->make_kv_cache(num_blocks_);
        p.model->forward(batch_, p.kv, nullptr);
      } catch (...) {
        p.error = std::current_exception();
        p.ep->comm->abort();
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++done_;
    cv_.notify_all();
  }
}

}  // namespace beluga
