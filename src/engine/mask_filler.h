// Fills the token masks of many constrained sequences at once. At batch 64 with structured outputs
// the masks are most of a step's host time, and each sequence's processor is its own (its matcher
// over a shared, immutable compiled grammar), so the jobs of one step run in parallel: on `workers`
// threads this object owns plus the calling thread. With 0 workers, few jobs, or jobs the last fills
// found cheap (the whole fill under ~150 us on one thread: waking workers would cost more), the
// calling thread fills them alone.
//
// Contract: fill() returns when every job is done; a processor that throws fails its job alone
// (`error` holds the message, the mask is left as the processor left it). Processors of one fill()
// must be distinct. fill() is called from one thread at a time.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/logits_processor.h"

namespace beluga {

class MaskFiller {
 public:
  struct Job {
    LogitsProcessor* proc = nullptr;
    uint32_t* mask = nullptr;  // ceil(vocab / 32) words
    std::string error;         // set when fill_mask threw
  };

  // The workers a default engine starts on a machine with `cores` cores: none on small machines (the
  // engine, model runner and I/O threads need them), up to 7 on large ones.
  static int default_workers(unsigned cores);

  explicit MaskFiller(int workers);
  ~MaskFiller();
  MaskFiller(const MaskFiller&) = delete;
  MaskFiller& operator=(const MaskFiller&) = delete;

  void fill(std::span<Job> jobs, int vocab);
  int workers() const { return int(threads_.size()); }

 private:
  size_t work();  // runs jobs of the current fill until none is left; how many it ran
  void loop();

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  uint64_t generation_ = 0;  // one per fill(): wakes the workers once
  int busy_ = 0;             // workers inside the current fill
  bool stop_ = false;
  std::span<Job> jobs_;
  int vocab_ = 0;
  std::atomic<size_t> next_{0};
  double us_per_job_ = -1;  // the caller's recent cost per job (fill()'s thread only); -1: none yet
};

}  // namespace beluga
