// ModelRunner: runs Model::forward on a thread of its own, one step at a time, so that the engine
// thread can prepare the next step (schedule, emit outputs) while the model computes the current one.
//
// Contract:
//   - launch(b) hands one step to the thread; at most one step is in flight (launch after launch
//     without wait() in between is a bug).
//   - wait() blocks until that step is done and rethrows the exception its forward threw, if any;
//     otherwise logits() holds [b.logit_rows.size(), vocab] F32 rows in b.logit_rows order.
//   - Steps run in launch order on one thread, so a step sees the KV cache writes of every earlier
//     step. The engine relies on this to reuse blocks and to schedule ahead of the results.
//   - The thread calls model.ops().bind_thread() once before its first step; only that thread issues
//     ops, so the model and `kv` must not be used from elsewhere while the runner lives.
//   - A step's KV copies (KvStepCopies) run on the same thread, around its forward.
//   - Destruction waits for a step in flight (its result is dropped) and joins the thread.
//   - With a Tracer, each step is a "forward" span (KV copies included) on a lane of its own.
//   - A step launched with masks_later waits, after its forward and before sampling, for
//     release_masks(): the engine fills the constrained rows' masks while the device computes.
//   - After wait(), last_seconds() is that step's duration on the thread (KV copies and forward, the
//     results on the host) and last_tokens() its batch tokens: the samples of the step cost model.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/kv_connector.h"
#include "model/model.h"
#include "util/trace.h"

namespace beluga {

class SpecDecoder;

class ModelRunner {
 public:
  // Called on the runner's thread before each step's forward with the step's number (0, 1, ...);
  // an exception it throws fails that step like a forward error. A testing aid; empty by default.
  using StepHook = std::function<void(int64_t step)>;

  // `trace` (may be null) must outlive the runner. With `spec`, each step runs through
  // SpecDecoder::run_step (forward, verification, MTP proposals). `mla_mode` goes to every step's
  // ForwardOptions (kAbsorbed: one attention form whatever the step's query lengths).
  ModelRunner(Model& model, KvCache& kv, StepHook hook = {}, Tracer* trace = nullptr,
              SpecDecoder* spec = nullptr, MlaMode mla_mode = MlaMode::kAuto);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Starts one step. Swaps `b` with the runner's previous batch, so the caller gets vectors back whose
  // capacity it can reuse for the next step instead of allocating. With `greedy`, the step samples
  // each logit row's argmax on the device (ForwardOptions::greedy_tokens): greedy_tokens() holds the
  // ids and logits() is not written.
  // `copies` (swapped like `b`, may be null): the step's KV connector copies; loads run before the
  // forward, saves after it (none when it fails), and their host memory is not touched after the step.
  // `sampling` (swapped like `b`, may be null; the model needs a sampler): the step samples each logit
  // row on the device (ForwardOptions::sampling): sampled() holds [rows, kSampleOutCols] and logits()
  // is not written. Takes precedence over `greedy`.
  // `masks_later` (with `sampling`): the step's masks are filled after launch(), into
  // pending_masks(), while the forward runs; the step samples once release_masks() is called, on the
  // device when the masks are usable, else its logits come back (device_sampled() false after wait()).
  void launch(Batch& b, bool greedy = false, KvStepCopies* copies = nullptr,
              DeviceSampling* sampling = nullptr, bool masks_later = false);
  // After launch(..., masks_later): the step's mask buffer (DeviceSampling::masks, as handed in), to
  // be written until release_masks(); then release_masks exactly once (also when filling failed).
  uint32_t* pending_masks() { return sampling_.masks.data(); }
  void release_masks(bool usable);
  // Waits for the step in flight; rethrows its exception.
  void wait();
  bool in_flight() const { return in_flight_; }
  // The last finished step's logits. Mutable: the caller may use the rows as scratch until the next
  // launch() (the sampler works on them in place).
  float* logits() { return logits_.data(); }
  const int32_t* greedy_tokens() const { return greedy_tokens_.data(); }
  bool greedy() const { return greedy_; }
  // The last step's device-sampled rows (token, logprob bits, rank, 0 per row), when device_sampled().
  const int32_t* sampled() const { return sampled_.data(); }
  bool device_sampled() const { return device_sampled_; }
  double last_seconds() const { return last_seconds_; }
  int last_tokens() const { return last_tokens_; }

 private:
  void run();

  Model& model_;
  KvCache& kv_;
  StepHook hook_;
  Tracer* trace_;
  int trace_lane_ = 0;
  SpecDecoder* spec_;
  MlaMode mla_mode_;
  const int vocab_;
  Batch batch_;                // the step in flight (owned by the thread between launch and done)
  KvStepCopies copies_;        // its KV connector copies
  std::vector<float> logits_;  // sized by launch(), written by the thread
  std::vector<int32_t> greedy_tokens_;
  bool greedy_ = false;
  DeviceSampling sampling_;
  std::vector<int32_t> sampled_;
  bool device_sampled_ = false;  // set by launch(); cleared by the thread when masks were unusable
  bool masks_later_ = false;
  bool masks_released_ = false, masks_usable_ = false;  // guarded by mu_
  bool in_flight_ = false;                              // engine thread only
  double last_seconds_ = 0;  // written by the thread before done_, read after wait()
  int last_tokens_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  bool has_work_ = false, done_ = false, stop_ = false;
  int64_t step_ = 0;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts after everything above is initialised
};

}  // namespace beluga
