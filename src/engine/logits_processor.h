// The engine <-> grammar seam (DESIGN.md §3): a per-sequence constraint on which tokens may come
// next. Before sampling the engine asks for a bitmask over the vocabulary (bit id%32 of word id/32;
// set = allowed); after sampling it reports the token; speculative decoding rolls back rejected
// tokens. Implementations throw beluga::Error on a broken state, which fails that request alone.
// The processors of different sequences may be called at the same time (engine/mask_filler.h fills a
// step's masks on several threads): they must share no mutable state; one processor is never called
// from two threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace beluga {

class LogitsProcessor {
 public:
  virtual ~LogitsProcessor() = default;
  // Writes ceil(vocab / 32) words; ids the processor does not know (padding rows) must be cleared.
  virtual void fill_mask(uint32_t* bitmask, int vocab) = 0;
  virtual void accept(int token) = 0;
  virtual void rollback(int n) = 0;
  virtual bool is_accepting() const = 0;
};

// Makes one processor per sequence of a request (n > 1 gets n independent ones).
using LogitsProcessorFactory = std::function<std::unique_ptr<LogitsProcessor>()>;

}  // namespace beluga
