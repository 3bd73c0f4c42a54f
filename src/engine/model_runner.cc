#include "engine/model_runner.h"

#include <chrono>
#include <utility>

#include "engine/spec_decode.h"
#include "util/error.h"

namespace beluga {

ModelRunner::ModelRunner(Model& model, KvCache& kv, StepHook hook, Tracer* trace, SpecDecoder* spec,
                         MlaMode mla_mode)
    : model_(model),
      kv_(kv),
      hook_(std::move(hook)),
      trace_(trace),
      spec_(spec),
      mla_mode_(mla_mode),
      vocab_(model.config().vocab_size) {
  if (trace_) trace_lane_ = trace_->add_lane("model runner");
  thread_ = std::thread([this] { run(); });
}

ModelRunner::~ModelRunner() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();  // run() finishes a step in flight before it looks at stop_
}

void ModelRunner::launch(Batch& b, bool greedy, KvStepCopies* copies, DeviceSampling* sampling,
                         bool masks_later) {
  BELUGA_ASSERT(!in_flight_);
  std::swap(batch_, b);
  if (copies)
    std::swap(copies_, *copies);
  else
    copies_.clear();
  device_sampled_ = sampling != nullptr;
  if (sampling)
    std::swap(sampling_, *sampling);
  else
    sampling_.clear();
  greedy_ = greedy && !device_sampled_;
  masks_later_ = masks_later && device_sampled_;
  // Sized here, not on the thread: logits() stays valid for the caller between wait() and launch().
  // A step whose masks come later may fall back to the host: it needs room for its logits too.
  if (device_sampled_) sampled_.resize(batch_.logit_rows.size() * size_t(kSampleOutCols));
  if (greedy_)
    greedy_tokens_.resize(batch_.logit_rows.size());
  else if (!device_sampled_ || masks_later_)
    logits_.resize(batch_.logit_rows.size() * size_t(vocab_));
  {
    std::lock_guard<std::mutex> lk(mu_);
    has_work_ = true;
    done_ = false;
    masks_released_ = false;
    masks_usable_ = false;
  }
  in_flight_ = true;
  cv_.notify_all();
}

void ModelRunner::release_masks(bool usable) {
  BELUGA_ASSERT(in_flight_ && masks_later_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    masks_released_ = true;
    masks_usable_ = usable;
  }
  cv_.notify_all();
}

void ModelRunner::wait() {
  BELUGA_ASSERT(in_flight_);
  std::exception_ptr err;
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return done_; });
    err = std::exchange(error_, nullptr);
  }
  in_flight_ = false;
  if (err) std::rethrow_exception(err);
}

void ModelRunner::run() {
  // A backend that cannot bind this thread fails every step with that error instead of crashing.
  std::exception_ptr bind_error;
  try {
    model_.ops().bind_thread();
  } catch (...) {
    bind_error = std::current_exception();
  }
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return has_work_ || stop_; });
      if (!has_work_) return;  // stopping with nothing in flight
      has_work_ = false;
    }
    std::exception_ptr err = bind_error;
    const auto started = std::chrono::steady_clock::now();
    if (!err) {
      TraceSpan span(trace_, trace_lane_, "forward", step_);
      try {
        if (hook_) hook_(step_);
        ForwardOptions opt;
        opt.mla_mode = mla_mode_;
        if (greedy_) opt.greedy_tokens = greedy_tokens_.data();
        if (device_sampled_) {
          opt.sampling = &sampling_;
          opt.sampled = sampled_.data();
        }
        bool usable = true;
        if (masks_later_)
          opt.before_sampling = [&] {
            std::unique_lock<std::mutex> lk(mu_);
            cv_.wait(lk, [&] { return masks_released_ || stop_; });
            usable = masks_released_ && masks_usable_;
            return usable;
          };
        Ops& ops = model_.ops();
        if (!copies_.loads.empty()) ops.kv_blocks_from_host(kv_.layers, copies_.loads);
        if (spec_)
          spec_->run_step(batch_, kv_, logits_.data(), opt);
        else
          model_.forward(batch_, kv_, logits_.data(), opt);
        if (!copies_.saves.empty()) ops.kv_blocks_to_host(kv_.layers, copies_.saves);
        if (!copies_.empty()) ops.synchronize();
        if (!usable) device_sampled_ = false;  // the logits came back instead (read after wait())
      } catch (...) {
        err = std::current_exception();
      }
    }
    ++step_;
    {
      std::lock_guard<std::mutex> lk(mu_);
      last_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      last_tokens_ = int(batch_.tokens.size());
      // Moved, not copied: the engine thread then owns the only reference, so the exception is freed
      // on the thread that read it (libstdc++'s uninstrumented refcount looks like a race to TSan).
      error_ = std::move(err);
      done_ = true;
    }
    cv_.notify_all();
  }
}

}  // namespace beluga
