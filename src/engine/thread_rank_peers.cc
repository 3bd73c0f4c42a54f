#include "engine/thread_rank_peers.h"

#include <algorithm>

#include "util/error.h"

namespace beluga {

ThreadRankPeers::ThreadRankPeers(LocalGroup& group, std::vector<std::unique_ptr<Ops>> ops,
                                 const RankLoader& load, RankSplit split, LiveExpertPlacement* live,
                                 InjectedRankFault fault)
    : group_(group),
      live_(live),
      fault_(fault),
      data_parallel_(split == RankSplit::kDataParallel),
      sharded_caches_(split == RankSplit::kTensorShardedCache),
      kind_(split == RankSplit::kTensorReplicatedCache || split == RankSplit::kTensorShardedCache
                ? "tensor-parallel"
                : "expert-parallel") {
  BELUGA_CHECK(int(ops.size()) == group.size() - 1, "thread ranks: ", ops.size(), " backends for ",
               group.size() - 1, " peer ranks");
  for (int r = 1; r < group.size(); ++r) {
    auto p = std::make_unique<Peer>();
    p->rank = r;
    p->ops = std::move(ops[size_t(r - 1)]);
    p->ops->bind_thread();  // its weights go to its device
    p->model = load(r, *p->ops);
    peers_.push_back(std::move(p));
  }
  for (auto& p : peers_) p->thread = std::thread([this, q = p.get()] { run(*q); });
}

ThreadRankPeers::ThreadRankPeers(const ModelConfig& cfg, WeightSource& src, int max_positions,
                                 LocalGroup& group, const ExpertSharding& sharding,
                                 std::vector<std::unique_ptr<Ops>> ops, LiveExpertPlacement* live,
                                 InjectedRankFault fault, bool data_parallel)
    : ThreadRankPeers(
          group, std::move(ops),
          [&](int r, Ops& o) {
            const ExpertParallelism ep{&group.communicator(r), &sharding, !data_parallel, live};
            return load_model(cfg, src, o, max_positions, &ep);
          },
          data_parallel ? RankSplit::kDataParallel : RankSplit::kExpertReplicated, live, fault) {}

ThreadRankPeers::~ThreadRankPeers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& p : peers_) p->thread.join();
}

std::optional<RankFailure> ThreadRankPeers::failure() const {
  std::lock_guard<std::mutex> lock(failure_mu_);
  return failure_;
}

void ThreadRankPeers::note_failure(int rank, const std::exception_ptr& error) {
  if (group_.failed_rank() != rank) return;  // this rank's error follows from another's
  RankFailure f{rank, "unknown error"};
  try {
    if (error) std::rethrow_exception(error);
  } catch (const std::exception& e) {
    f.cause = e.what();
  } catch (...) {
  }
  std::lock_guard<std::mutex> lock(failure_mu_);
  if (failure_) return;
  failure_ = f;
  if (on_failure_) on_failure_(f);
}

void ThreadRankPeers::on_failure(std::function<void(const RankFailure&)> f) {
  std::lock_guard<std::mutex> lock(failure_mu_);
  on_failure_ = std::move(f);
}

void ThreadRankPeers::throw_if_down() const {
  // A failed group stays failed: every later job fails at once, with the first failure's cause.
  if (const auto f = failure())
    throw Unavailable(str(kind_, " rank ", f->rank, " failed (", f->cause, "); the group is down"));
}

void ThreadRankPeers::post(const Batch& b, int num_blocks, const std::function<void()>& set_job) {
  throw_if_down();
  // Every rank waits for this step's job (rank 0 begins its own layers after this returns).
  if (live_) live_->before_step();
  std::lock_guard<std::mutex> lock(mu_);
  batch_.tokens = b.tokens;
  batch_.seqs = b.seqs;
  batch_.logit_rows.clear();
  num_blocks_ = num_blocks;
  set_job();
  done_ = 0;
  ++step_;
  ++compute_steps_;
  cv_.notify_all();
}

void ThreadRankPeers::begin(const Batch& b, int num_blocks, bool keep_hidden) {
  BELUGA_CHECK(!data_parallel_,
               "attention data parallel: a step is split into the ranks' parts (begin_parts)");
  post(b, num_blocks, [&] {
    job_ = Job::kForward;
    keep_hidden_ = keep_hidden;
  });
}

void ThreadRankPeers::begin_mtp(const Batch& b, int num_blocks, std::span<const int32_t> rows, bool chained) {
  BELUGA_CHECK(!data_parallel_, "attention data parallel: no MTP steps in this build");
  post(b, num_blocks, [&] {
    job_ = Job::kMtp;
    chained_ = chained;
    rows_.assign(rows.begin(), rows.end());
  });
}

const RankPart& ThreadRankPeers::post_parts(const PartOutputs& out, int num_blocks, Job job) {
  // Under the lock: the peers read parts_ only once the step count moves.
  part_out_ = out;
  num_blocks_ = num_blocks;
  job_ = job;
  done_ = 0;
  ++step_;
  ++compute_steps_;
  cv_.notify_all();
  return parts_[0];
}

std::mutex& ThreadRankPeers::split_step(const Batch& b, int num_blocks) {
  BELUGA_CHECK(data_parallel_, "a step split into parts: the ranks step replicated tokens");
  throw_if_down();
  if (live_) live_->before_step();
  // The peers are between jobs (the last one ended), so parts_ is the caller's to rewrite.
  parts_.resize(size_t(group_.size()));
  split_by_rank(b, num_blocks, parts_);
  return mu_;
}

void ThreadRankPeers::note_homes(std::vector<RowHome>& homes, size_t rows) const {
  homes.assign(rows, {});
  for (size_t r = 0; r < parts_.size(); ++r)
    for (size_t t = 0; t < parts_[r].token_rows.size(); ++t)
      homes[size_t(parts_[r].token_rows[t])] = {int(r), int(t)};
}

const RankPart& ThreadRankPeers::begin_parts(const Batch& b, int num_blocks, const PartOutputs& out,
                                             bool keep_hidden) {
  std::lock_guard<std::mutex> lock(split_step(b, num_blocks));
  note_homes(forward_rows_, b.tokens.size());
  keep_hidden_ = keep_hidden;
  return post_parts(out, num_blocks, Job::kPart);
}

const RankPart& ThreadRankPeers::begin_mtp_parts(const Batch& b, int num_blocks,
                                                 std::span<const int32_t> hidden_rows, bool chained,
                                                 const PartOutputs& out) {
  std::lock_guard<std::mutex> lock(split_step(b, num_blocks));
  BELUGA_CHECK(hidden_rows.empty() || hidden_rows.size() == b.tokens.size(), "an MTP step's ",
               hidden_rows.size(), " hidden rows for ", b.tokens.size(), " tokens");
  const std::vector<RowHome>& homes = chained ? mtp_rows_ : forward_rows_;
  for (size_t r = 0; r < parts_.size(); ++r)
    for (int g : parts_[r].token_rows) {
      const size_t src = hidden_rows.empty() ? size_t(g) : size_t(hidden_rows[size_t(g)]);
      BELUGA_CHECK(src < homes.size() && homes[src].rank == int(r), "an MTP row reads hidden row ", src,
                   " of ", chained ? "the last MTP step" : "the last forward", ", which rank ", r,
                   " does not hold");
      parts_[r].source_rows.push_back(homes[src].row);
    }
  note_homes(mtp_rows_, b.tokens.size());
  chained_ = chained;
  return post_parts(out, num_blocks, Job::kMtpPart);
}

void ThreadRankPeers::ensure_caches(Peer& p, bool mtp) const {
  if (p.kv.num_blocks != num_blocks_) p.kv = p.model->make_kv_cache(num_blocks_);
  if (mtp && p.mtp_kv.num_blocks != num_blocks_) p.mtp_kv = p.model->make_mtp_kv_cache(num_blocks_);
}

std::span<const KvBlockCopy> ThreadRankPeers::copy_blocks(std::span<const KvBlockCopy> copies, bool to_host,
                                                          int num_blocks, bool with_mtp) {
  throw_if_down();
  if (sharded_caches_) {
    // Each rank's cache holds its own heads: rank r's slice of an image starts r slices in (every
    // rank's slice is as long as the caller's: same layers, same number of heads).
    if (copies.empty()) return copies;
    const size_t slice = peers_[0]->model->kv_bytes_per_token() * kKvBlockSize;
    rank_copies_.resize(size_t(group_.size()));
    for (int r = 1; r < group_.size(); ++r) {
      auto& mine = rank_copies_[size_t(r)];
      mine.clear();
      for (const KvBlockCopy& c : copies) mine.push_back({c.block, c.host + size_t(r) * slice});
    }
    run_copies(to_host, num_blocks, with_mtp);
    return copies;  // the caller's slice is each image's first
  }
  if (!data_parallel_) {
    // Every rank holds the same blocks: the peers load each image too; a save reads the caller's.
    if (!to_host && !copies.empty()) {
      loads_ = copies;  // read by the peers once the job is posted; run_copies waits for them
      run_copies(false, num_blocks, with_mtp);
    }
    return copies;
  }
  const int P = num_blocks;
  rank_copies_.resize(size_t(group_.size()));
  for (auto& c : rank_copies_) c.clear();
  for (const KvBlockCopy& c : copies) {
    const int r = c.block / P;
    BELUGA_CHECK(r >= 0 && r < group_.size(), "copy_blocks: block ", c.block, " is past ", group_.size(),
                 " ranks of ", P, " blocks");
    rank_copies_[size_t(r)].push_back({c.block - r * P, c.host});
  }
  if (std::any_of(rank_copies_.begin() + 1, rank_copies_.end(), [](const auto& c) { return !c.empty(); }))
    run_copies(to_host, num_blocks, with_mtp);
  return rank_copies_[0];
}

void ThreadRankPeers::run_copies(bool to_host, int num_blocks, bool with_mtp) {
  // Between steps, on the peers' own threads (a GPU rank's copies run where its device is bound).
  {
    std::lock_guard<std::mutex> lock(mu_);
    load_mtp_ = with_mtp;
    to_host_ = to_host;
    num_blocks_ = num_blocks;
    job_ = Job::kLoad;
    done_ = 0;
    ++step_;
    cv_.notify_all();
  }
  wait_done();
}

void ThreadRankPeers::wait_done() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ == int(peers_.size()); });
  if (const auto f = failure()) throw Unavailable(str(kind_, " rank ", f->rank, " failed: ", f->cause));
  for (auto& p : peers_)
    if (p->error) std::rethrow_exception(p->error);
}

void ThreadRankPeers::end() {
  wait_done();
  // Rank 0's layers are done too (Model::with_peers ends them first): the step is closed everywhere.
  if (live_) live_->after_step();
}

void ThreadRankPeers::abort() {
  // Called while rank 0's step unwinds (Model::with_peers): its exception is the current one.
  group_.communicator(0).abort();
  note_failure(0, std::current_exception());
}

void ThreadRankPeers::run(Peer& p) {
  p.ops->bind_thread();
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || step_ != seen; });
      if (stop_) return;
      seen = step_;
    }
    // The job's fields do not change until every peer is done (end() comes first).
    if (!p.error) {
      try {
        step(p);
      } catch (...) {
        p.error = std::current_exception();
        group_.communicator(p.rank).abort();
        note_failure(p.rank, p.error);
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++done_;
    cv_.notify_all();
  }
}

void ThreadRankPeers::step(Peer& p) {
  if (job_ == Job::kLoad) {
    ensure_caches(p, load_mtp_);
    std::vector<Tensor> layers = p.kv.layers;  // the image's layers (kv_connector.h)
    if (load_mtp_) layers.insert(layers.end(), p.mtp_kv.layers.begin(), p.mtp_kv.layers.end());
    if (!data_parallel_ && !sharded_caches_)
      p.ops->kv_blocks_from_host(layers, loads_);
    else if (to_host_)
      p.ops->kv_blocks_to_host(layers, rank_copies_[size_t(p.rank)]);
    else
      p.ops->kv_blocks_from_host(layers, rank_copies_[size_t(p.rank)]);
    p.ops->synchronize();  // the caller may reuse (or read) the host images once the job returns
    return;
  }
  if (p.rank == fault_.rank && compute_steps_ >= fault_.at_step)
    throw Error(str("injected failure of rank ", p.rank, " at its step ", compute_steps_));
  if (job_ == Job::kPart || job_ == Job::kMtpPart) {
    const bool mtp = job_ == Job::kMtpPart;
    ensure_caches(p, mtp);
    const RankPart& part = parts_[size_t(p.rank)];
    const int64_t T = int64_t(part.batch.tokens.size()), D = p.model->config().hidden_size;
    // Persistent buffers grow to the largest part seen; a chained MTP step reads the rows its output
    // overwrites, and has no more rows than the step before it, so mtp_out is not reallocated then.
    auto fit = [&](Tensor& t) {
      if (t.empty() || t.shape[0] < T)
        t = p.ops->alloc_persistent(p.ops->act_dtype(), {std::max<int64_t>(T, 256), D});
    };
    if (!mtp) {
      if (keep_hidden_) fit(p.hidden);
      p.model->forward_part(part, p.kv, part_out_, keep_hidden_ ? &p.hidden : nullptr);
      return;
    }
    BELUGA_CHECK(!(chained_ ? p.mtp_out : p.hidden).empty() || T == 0, "an MTP step on rank ", p.rank,
                 " before any hidden states were kept");
    if (!chained_) fit(p.mtp_out);
    p.model->mtp_forward_part(part, chained_ ? p.mtp_out : p.hidden, p.mtp_kv, part_out_, &p.mtp_out);
    return;
  }
  const bool mtp = job_ == Job::kMtp;
  ensure_caches(p, mtp);
  Ops& ops = *p.ops;
  const int64_t T = int64_t(batch_.tokens.size()), D = p.model->config().hidden_size;
  // Persistent buffers grow to the largest step seen (the first ones are the largest: prompts).
  auto fit = [&](Tensor& t) {
    if (t.empty() || t.shape[0] < T)
      t = ops.alloc_persistent(ops.act_dtype(), {std::max<int64_t>(T, 256), D});
  };
  if (!mtp) {
    ForwardOptions opt;
    if (keep_hidden_) {
      fit(p.hidden);
      opt.final_hidden = &p.hidden;
    }
    p.model->forward(batch_, p.kv, nullptr, opt);
    return;
  }
  fit(p.mtp_in);
  fit(p.mtp_out);
  Tensor idx = ops.scratch(DType::kI32, {T});
  ops.copy_from_host(idx, rows_.data());
  ops.gather_rows(p.mtp_in.rows(0, T), chained_ ? p.mtp_out : p.hidden, idx);
  ForwardOptions opt;
  opt.final_hidden = &p.mtp_out;
  p.model->mtp_forward(batch_, p.mtp_in, p.mtp_kv, nullptr, opt);
}

std::vector<std::unique_ptr<Ops>> cpu_peer_ops(int ranks, const CpuOptions& cpu) {
  std::vector<std::unique_ptr<Ops>> ops;
  for (int r = 1; r < ranks; ++r) ops.push_back(std::make_unique<CpuOps>(cpu));
  return ops;
}

}  // namespace beluga
