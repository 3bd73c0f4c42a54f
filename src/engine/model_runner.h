// ModelRunner: runs Model::forward on a thread of its own, one step at a time, so that the engine
// thread can prepare the next step (schedule, emit outputs) while the model computes the current one.
//
// Contract:
//   - launch(b) hands one step to the thread. Up to two steps may be launched and not yet waited:
//     the one running and the next, which the thread starts the moment the first is done (the
//     engine's early launch: step N+1 is built before step N's tokens reach the engine).
//   - wait() blocks until the oldest launched step is done and rethrows the exception its forward
//     threw, if any; the accessors below then describe that step: logits() holds
//     [b.logit_rows.size(), vocab] F32 rows in b.logit_rows order (unless it sampled ids).
//   - Steps run in launch order on one thread, so a step sees the KV cache writes of every earlier
//     step. The engine relies on this to reuse blocks and to schedule ahead of the results.
//   - Future tokens: a token id t < 0 in a batch stands for the id step N-1 sampled at its logit row
//     -t-1 (greedy or device-sampled). The thread resolves them before the forward from the previous
//     step's ids, which it keeps; when that step failed or sampled nothing (its logits came back
//     instead) the step is skipped: wait() returns normally and skipped() is true.
//   - The thread calls model.ops().bind_thread() once before its first step; only that thread issues
//     ops, so the model and `kv` must not be used from elsewhere while the runner lives.
//   - A step's KV copies (KvStepCopies) run on the same thread, around its forward.
//   - Destruction waits for the steps launched (their results are dropped) and joins the thread.
//   - With a Tracer, each step is a "forward" span (KV copies included) on a lane of its own, and a
//     "queued" span on another, from launch() to the forward's start (where the device waited for the
//     runner thread rather than for the engine).
//   - A step launched with masks_later waits, after its forward and before sampling, for
//     release_masks(): the engine fills the constrained rows' masks while the device computes.
//   - After wait(), last_seconds() is that step's duration on the thread (KV copies and forward, the
//     results on the host) and last_tokens() its batch tokens: the samples of the step cost model.
#pragma once

#include <atomic>
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

  // `trace` (may be null) must outlive the runner. With `spec`, each step launched `speculative` runs
  // through SpecDecoder::run_step (forward, verification, MTP proposals). `mla_mode` goes to every step's
  // ForwardOptions (kAbsorbed: one attention form whatever the step's query lengths).
  // `poll_micros` > 0: each thread polls (yielding) for the other this long before it blocks on the
  // condition variable: the engine in wait(), the thread for the next launch. A blocked thread's
  // wake-up costs tens of microseconds on virtual machines, a step's worth of a small model's graph.
  ModelRunner(Model& model, KvCache& kv, StepHook hook = {}, Tracer* trace = nullptr,
              SpecDecoder* spec = nullptr, MlaMode mla_mode = MlaMode::kAuto, int poll_micros = 0);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Starts one step (queues it behind the one running, if any). Swaps `b` with an older batch of the
  // runner's, so the caller gets vectors back whose capacity it can reuse instead of allocating. With
  // `greedy`, the step samples each logit row's argmax on the device (ForwardOptions::greedy_tokens):
  // greedy_tokens() holds the ids and logits() is not written.
  // `copies` (swapped like `b`, may be null): the step's KV connector copies over the block image's
  // layers (kv's, then the MTP layer's when `spec` drafts with it); saves_first, then loads, run
  // before the forward, saves after it (none when it fails), and their host memory is not touched
  // after the step.
  // `sampling` (swapped like `b`, may be null; the model needs a sampler): the step samples each logit
  // row on the device (ForwardOptions::sampling): sampled() holds [rows, kSampleOutCols] and logits()
  // is not written. Takes precedence over `greedy`.
  // `masks_later` (with `sampling`): the step's masks are filled after launch(), into
  // pending_masks(), while the forward runs; the step samples once release_masks() is called, on the
  // device when the masks are usable, else its logits come back (device_sampled() false after wait()).
  // `saves_later` (with `copies`): the step's KV saves are handed over after launch(), by
  // release_saves(), which the thread waits for after the forward (an early step's commit comes
  // once the step ahead of it is applied).
  // `speculative` (with `spec`): the step runs through SpecDecoder::run_step; otherwise, a plain
  // step, through Model::forward (it may run while the engine plans the next one).
  void launch(Batch& b, bool greedy = false, KvStepCopies* copies = nullptr,
              DeviceSampling* sampling = nullptr, bool masks_later = false, bool saves_later = false,
              bool speculative = false);
  // After launch(..., masks_later): the last launched step's mask buffer (DeviceSampling::masks, as
  // handed in), to be written until release_masks(); then release_masks exactly once (also when
  // filling failed).
  uint32_t* pending_masks() { return last_launched().sampling.masks.data(); }
  void release_masks(bool usable);
  // After launch(..., saves_later): the last launched step's saves (swapped in), exactly once.
  void release_saves(std::vector<KvCopy>& saves);
  // Waits for the oldest step launched; rethrows its exception.
  void wait();
  bool in_flight() const { return launched_ > waited_; }
  int num_in_flight() const { return int(launched_ - waited_); }
  // Whether the last launched step returns ids (greedy or device-sampled): a step launched behind it
  // may name them as future tokens (its masks may still send it to the host: see skipped()).
  bool last_launch_samples_ids() const {
    const Slot& s = last_launched();
    return s.greedy || (s.device_sampled && !s.masks_refused);
  }
  // The last waited step's results. logits() is mutable: the caller may use the rows as scratch
  // until the step after next is launched (the sampler works on them in place).
  float* logits() { return done_slot().logits.data(); }
  const int32_t* greedy_tokens() const { return done_slot().greedy_tokens.data(); }
  bool greedy() const { return done_slot().greedy; }
  // The last waited step's device-sampled rows (token, logprob bits, rank, 0 per row), when
  // device_sampled().
  const int32_t* sampled() const { return done_slot().sampled.data(); }
  bool device_sampled() const { return done_slot().device_sampled && !done_slot().fell_back; }
  // The last waited step named future tokens that its predecessor did not sample: it did not run.
  bool skipped() const { return done_slot().skipped; }
  double last_seconds() const { return done_slot().seconds; }
  int last_tokens() const { return done_slot().tokens; }

 private:
  // One step's inputs and results. Step k uses slots_[k % 2].
  struct Slot {
    Batch batch;
    KvStepCopies copies;
    DeviceSampling sampling;
    std::vector<float> logits;  // sized by launch(), written by the thread
    std::vector<int32_t> greedy_tokens, sampled;
    bool greedy = false;
    bool device_sampled = false;  // set by launch()
    bool masks_later = false;
    bool saves_later = false;
    bool speculative = false;
    bool masks_refused = false;  // release_masks(false): the step's logits will come back (engine thread)
    bool fell_back = false;      // the thread found the masks unusable (read after wait())
    bool skipped = false;        // written by the thread before `done`
    // Guarded by mu_:
    bool masks_released = false, masks_usable = false, saves_released = false, done = false;
    int64_t launched_ns = 0;  // launch()'s time (traced runners)
    double seconds = 0;       // written by the thread before `done`
    int tokens = 0;
    std::exception_ptr error;
  };
  Slot& last_launched() { return slots_[(launched_ - 1) % 2]; }
  const Slot& last_launched() const { return slots_[(launched_ - 1) % 2]; }
  const Slot& done_slot() const { return slots_[(waited_ + 1) % 2]; }  // step waited_ - 1
  Slot& done_slot() { return slots_[(waited_ + 1) % 2]; }
  // Returns once ready() or after poll_micros_ (at once when polling is off).
  template <typename Ready>
  void poll_for(Ready ready) const;
  void run();
  void run_step(Slot& s);
  // Replaces the batch's future tokens with the previous step's ids; false when it has none.
  bool resolve_future(Batch& b) const;

  Model& model_;
  KvCache& kv_;
  StepHook hook_;
  Tracer* trace_;
  int trace_lane_ = 0, queue_lane_ = 0;
  SpecDecoder* spec_;
  MlaMode mla_mode_;
  const int poll_micros_;
  const int vocab_;
  std::vector<Tensor> block_layers_;  // a KV block's image: kv_'s layers, then the MTP layer's if any
  Slot slots_[2];
  int64_t launched_ = 0, waited_ = 0;  // engine thread only
  // The thread's: the ids the last step sampled per logit row (empty: it sampled none or failed).
  std::vector<int32_t> last_ids_;

  std::mutex mu_;
  std::condition_variable cv_;
  // Steps launched (the thread's view of launched_; written under mu_) and steps done (stored once
  // the step's slot says done); read without the lock while polling.
  std::atomic<int64_t> queued_ = 0, completed_ = 0;
  bool stop_ = false;
  int64_t step_ = 0;    // the thread's next step
  std::thread thread_;  // last: starts after everything above is initialised
};

}  // namespace beluga
