#include "engine/model_runner.h"

#include <chrono>
#include <utility>

#include "engine/spec_decode.h"
#include "util/error.h"

namespace beluga {

ModelRunner::ModelRunner(Model& model, KvCache& kv, StepHook hook, Tracer* trace, SpecDecoder* spec,
                         MlaMode mla_mode, int poll_micros)
    : model_(model),
      kv_(kv),
      hook_(std::move(hook)),
      trace_(trace),
      spec_(spec),
      mla_mode_(mla_mode),
      poll_micros_(poll_micros),
      vocab_(model.config().vocab_size),
      block_layers_(kv.layers) {
  if (spec_ && spec_->mtp_kv())  // the block image's last layer (kv_connector.h)
    block_layers_.insert(block_layers_.end(), spec_->mtp_kv()->layers.begin(), spec_->mtp_kv()->layers.end());
  if (trace_) {
    trace_lane_ = trace_->add_lane("model runner");
    queue_lane_ = trace_->add_lane("runner queue");
  }
  thread_ = std::thread([this] { run(); });
}

ModelRunner::~ModelRunner() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();  // run() finishes the steps launched before it looks at stop_
}

void ModelRunner::launch(Batch& b, bool greedy, KvStepCopies* copies, DeviceSampling* sampling,
                         bool masks_later, bool saves_later, bool speculative) {
  BELUGA_ASSERT(launched_ - waited_ < 2);
  Slot& s = slots_[launched_ % 2];
  std::swap(s.batch, b);
  if (copies)
    std::swap(s.copies, *copies);
  else
    s.copies.clear();
  s.device_sampled = sampling != nullptr;
  if (sampling)
    std::swap(s.sampling, *sampling);
  else
    s.sampling.clear();
  s.greedy = greedy && !s.device_sampled;
  s.masks_later = masks_later && s.device_sampled;
  s.saves_later = saves_later;
  s.speculative = speculative && spec_;
  s.skipped = false;
  s.masks_refused = false;
  s.fell_back = false;
  if (trace_) s.launched_ns = Tracer::now_ns();
  // Sized here, not on the thread: logits() stays valid for the caller between wait() and the launch
  // that reuses the slot. A step whose masks come later may fall back to the host: it needs room for
  // its logits too.
  const size_t rows = s.batch.logit_rows.size();
  if (s.device_sampled) s.sampled.resize(rows * size_t(kSampleOutCols));
  if (s.greedy)
    s.greedy_tokens.resize(rows);
  else if (!s.device_sampled || s.masks_later)
    s.logits.resize(rows * size_t(vocab_));
  {
    std::lock_guard<std::mutex> lk(mu_);
    s.done = false;
    s.masks_released = false;
    s.masks_usable = false;
    s.saves_released = false;
    s.error = nullptr;
    queued_ = ++launched_;
  }
  cv_.notify_all();
}

void ModelRunner::release_masks(bool usable) {
  Slot& s = last_launched();
  BELUGA_ASSERT(in_flight() && s.masks_later);
  s.masks_refused = !usable;
  {
    std::lock_guard<std::mutex> lk(mu_);
    s.masks_released = true;
    s.masks_usable = usable;
  }
  cv_.notify_all();
}

void ModelRunner::release_saves(std::vector<KvCopy>& saves) {
  Slot& s = last_launched();
  BELUGA_ASSERT(in_flight() && s.saves_later);
  {
    std::lock_guard<std::mutex> lk(mu_);
    std::swap(s.copies.saves, saves);
    s.saves_released = true;
  }
  cv_.notify_all();
}

void ModelRunner::wait() {
  BELUGA_ASSERT(in_flight());
  Slot& s = slots_[waited_ % 2];
  std::exception_ptr err;
  poll_for([&] { return completed_.load(std::memory_order_acquire) > waited_; });
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return s.done; });
    err = std::exchange(s.error, nullptr);
  }
  ++waited_;
  if (err) std::rethrow_exception(err);
}

bool ModelRunner::resolve_future(Batch& b) const {
  for (int& t : b.tokens) {
    if (t >= 0) continue;
    const size_t r = size_t(-(int64_t(t) + 1));
    if (r >= last_ids_.size()) return false;
    t = last_ids_[r];
  }
  return true;
}

void ModelRunner::run_step(Slot& s) {
  std::exception_ptr err;
  const auto started = std::chrono::steady_clock::now();
  if (!resolve_future(s.batch) || (s.device_sampled && !s.sampling.resolve_pending(last_ids_))) {
    s.skipped = true;
    last_ids_.clear();
  } else {
    if (trace_) trace_->record(queue_lane_, "queued", s.launched_ns, Tracer::now_ns(), step_);
    TraceSpan span(trace_, trace_lane_, "forward", step_);
    try {
      if (hook_) hook_(step_);
      ForwardOptions opt;
      opt.mla_mode = mla_mode_;
      if (s.greedy) opt.greedy_tokens = s.greedy_tokens.data();
      if (s.device_sampled) {
        opt.sampling = &s.sampling;
        opt.sampled = s.sampled.data();
      }
      bool usable = true;
      if (s.masks_later)
        opt.before_sampling = [&] {
          std::unique_lock<std::mutex> lk(mu_);
          cv_.wait(lk, [&] { return s.masks_released || stop_; });
          usable = s.masks_released && s.masks_usable;
          return usable;
        };
      Ops& ops = model_.ops();
      StepPeers* peers = model_.step_peers();
      const bool with_mtp = block_layers_.size() > kv_.layers.size();
      // With step peers, the group's ranks do their parts of the copies (StepPeers::copy_blocks).
      const auto move = [&](std::span<const KvCopy> c, bool to_host) {
        if (c.empty()) return;
        if (peers) c = peers->copy_blocks(c, to_host, kv_.num_blocks, with_mtp);
        if (to_host)
          ops.kv_blocks_to_host(block_layers_, c);
        else
          ops.kv_blocks_from_host(block_layers_, c);
      };
      move(s.copies.saves_first, true);
      move(s.copies.loads, false);
      if (s.speculative)
        spec_->run_step(s.batch, kv_, s.logits.data(), opt, trace_, trace_lane_);
      else
        model_.forward(s.batch, kv_, s.logits.data(), opt);
      span.set_step_args(int32_t(s.batch.tokens.size()), model_.last_forward_graphed() ? 1 : 0);
      if (s.saves_later) {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return s.saves_released || stop_; });
      }
      move(s.copies.saves, true);
      if (!s.copies.empty()) ops.synchronize();
      if (!usable) s.fell_back = true;  // the logits came back instead (read after wait())
    } catch (...) {
      err = std::current_exception();
    }
    // The ids the next step's future tokens name.
    const size_t rows = s.batch.logit_rows.size();
    last_ids_.clear();
    if (!err && s.device_sampled && !s.fell_back) {
      for (size_t r = 0; r < rows; ++r) last_ids_.push_back(s.sampled[r * size_t(kSampleOutCols)]);
    } else if (!err && s.greedy) {
      last_ids_.assign(s.greedy_tokens.begin(), s.greedy_tokens.begin() + int64_t(rows));
    }
  }
  ++step_;
  std::lock_guard<std::mutex> lk(mu_);
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  s.tokens = int(s.batch.tokens.size());
  // Moved, not copied: the engine thread then owns the only reference, so the exception is freed
  // on the thread that read it (libstdc++'s uninstrumented refcount looks like a race to TSan).
  s.error = std::move(err);
  s.done = true;
}

void ModelRunner::run() {
  // A backend that cannot bind this thread fails every step with that error instead of crashing.
  std::exception_ptr bind_error;
  try {
    model_.ops().bind_thread();
  } catch (...) {
    bind_error = std::current_exception();
  }
  int64_t next = 0;  // the next step to run
  for (;;) {
    // A serial step (speculating, or not launched early) comes tens of microseconds after the step
    // ahead ended: polled for, it starts without a wake-up's latency.
    poll_for([&] { return queued_.load(std::memory_order_acquire) > next; });
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return queued_ > next || stop_; });
      if (queued_ <= next) return;  // stopping with nothing launched
    }
    Slot& s = slots_[next % 2];
    if (bind_error) {
      ++step_;
      last_ids_.clear();
      std::lock_guard<std::mutex> lk(mu_);
      s.error = bind_error;
      s.done = true;
    } else {
      run_step(s);
    }
    ++next;
    completed_.store(next, std::memory_order_release);
    cv_.notify_all();
  }
}

template <typename Ready>
void ModelRunner::poll_for(Ready ready) const {
  if (poll_micros_ <= 0) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(poll_micros_);
  while (!ready() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
}

}  // namespace beluga
