// The incremental matcher of one generation: feeds tokens (or bytes) through a compiled grammar, keeps
// every earlier state so rollback(n) undoes the last n tokens (speculative decoding), and fills the
// token mask of the current state. Not thread-safe; one per sequence. It shares the compiled grammar.
//
// fill_mask writes a bitmask over the vocabulary (bit id%32 of word id/32; set = allowed): a token is
// allowed iff its bytes extend the output to a prefix of some sentence of the grammar; special tokens
// never are; end-of-sequence ids are allowed exactly when the output so far is a complete sentence.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "grammar/compiled.h"
#include "grammar/pda.h"

namespace beluga::grammar {

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Feeds one token; returns false and leaves the state unchanged if the grammar does not allow it.
  // An end-of-sequence id is accepted (and consumes nothing) in an accepting state.
  bool accept_token(int id);
  // Feeds raw bytes as one step (rolled back as one token); same contract as accept_token.
  bool accept_bytes(std::string_view bytes);
  void rollback(int n_tokens);
  int num_tokens() const { return int(token_pos_.size()) - 1; }

  bool is_accepting() const { return accepting_[pos()]; }
  bool is_dead() const { return set_begin_[pos() + 1] == set_begin_[pos()]; }  // nothing can follow

  // The current thread set, sorted and without repeats: within one matcher, equal keys are equal
  // states (stacks are hash-consed), which lets a front end explore a grammar as a DFA.
  std::vector<uint64_t> state_key() const;

  // Writes vocab().mask_words() words at `mask`.
  void fill_mask(uint32_t* mask);
  // The slow reference for one token (feeds it, then rolls back); tests compare fill_mask to it.
  bool allows(int id);

  const TokenVocab& vocab() const { return *g_->vocab; }
  const CompiledGrammar& grammar() const { return *g_; }

 private:
  size_t pos() const { return set_begin_.size() - 2; }  // index of the current byte position
  bool push_byte(uint8_t b);                            // false (nothing pushed) if b is rejected
  void pop_bytes(size_t n);
  bool check(int32_t stack, int32_t token, int32_t offset);

  std::shared_ptr<const CompiledGrammar> g_;
  StackArena arena_;
  Stepper stepper_;
  // Thread sets per byte position: threads_[set_begin_[p], set_begin_[p + 1]).
  std::vector<uint64_t> threads_;
  std::vector<size_t> set_begin_;
  std::vector<uint8_t> accepting_;
  std::vector<size_t> token_pos_;  // byte position at each token boundary
  // Scratch for masks and checks.
  std::vector<uint64_t> scratch_a_, scratch_b_;
  std::vector<uint32_t> tmp_mask_;
  std::vector<int32_t> seen_nodes_;  // mask indices already applied this fill
};

}  // namespace beluga::grammar
