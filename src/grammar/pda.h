// Running the pushdown automaton: a set of threads, each a node with byte edges plus a call stack.
// Stacks are persistent and hash-consed in a StackArena (equal stacks are the same id), so a thread is
// one 64-bit key and thread sets deduplicate exactly. This is the one stepping routine both the matcher
// (real stacks) and the mask precompute (stacks local to one rule, see compiled.h) use.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "grammar/automaton.h"

namespace beluga::grammar {

constexpr int32_t kEmptyStack = -1;

inline uint64_t thread_key(int32_t node, int32_t stack) {
  return (uint64_t(uint32_t(stack + 1)) << 32) | uint32_t(node);
}
inline int32_t thread_node(uint64_t k) {
  return int32_t(uint32_t(k));
}
inline int32_t thread_stack(uint64_t k) {
  return int32_t(uint32_t(k >> 32)) - 1;
}

class StackArena {
 public:
  struct Frame {
    int32_t ret, parent;
  };
  int32_t push(int32_t ret, int32_t parent);
  const Frame& frame(int32_t id) const { return frames_[id]; }
  void clear() {
    frames_.clear();
    index_.clear();
  }
  size_t size() const { return frames_.size(); }

 private:
  std::vector<Frame> frames_;
  std::unordered_map<uint64_t, int32_t> index_;
};

// A set of 64-bit keys cleared in O(1) (generation stamps); no allocation once grown.
class KeySet {
 public:
  void clear();
  bool insert(uint64_t k);  // false if already present

 private:
  void grow();
  std::vector<uint64_t> keys_ = std::vector<uint64_t>(64);
  std::vector<uint32_t> gen_ = std::vector<uint32_t>(64, 0);
  uint32_t cur_ = 1;
  size_t count_ = 0;
};

// Closure and stepping over one automaton; the caller owns the arena and output vectors.
class Stepper {
 public:
  Stepper(const Automaton& a, StackArena& arena) : a_(a), arena_(arena) {}

  // Appends to `out` the threads reachable from (node, stack) without consuming a byte, and returns
  // true if the end of the rule at the bottom of the stack is reachable (a pop of the empty stack:
  // for real stacks, the whole grammar accepts).
  bool closure(int32_t node, int32_t stack, std::vector<uint64_t>& out);
  // Threads after consuming byte b from threads [in, in + n); returns the same end flag as closure.
  bool step(const uint64_t* in, size_t n, uint8_t b, std::vector<uint64_t>& out);
  // Starts a closure group: threads added until the next begin() are deduplicated together.
  void begin() { seen_.clear(); }

 private:
  bool add(int32_t node, int32_t stack, std::vector<uint64_t>& out);
  const Automaton& a_;
  StackArena& arena_;
  KeySet seen_;
  std::vector<uint64_t> work_;
};

}  // namespace beluga::grammar
