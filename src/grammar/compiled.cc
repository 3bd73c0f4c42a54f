#include "grammar/compiled.h"

#include <algorithm>

#include "grammar/mask_classes.h"
#include "grammar/pda.h"
#include "grammar/refused.h"

namespace beluga::grammar {

namespace {

// Walks the vocabulary trie from one node's threads (stack local to the node's rule) and classifies
// every allowed token; see compiled.h.
class MaskBuilder {
 public:
  MaskBuilder(const Automaton& a, const TokenVocab& v) : a_(a), v_(v), stepper_(a, arena_) {}

  NodeMask build(int32_t node) {
    arena_.clear();
    accepted_.clear();
    uncertain_.clear();
    bool root_alone = a_.nodes[node].rule == a_.root && !a_.root_called;
    escapes_matter_ = !root_alone;
    sets_.clear();
    sets_.push_back(thread_key(node, kEmptyStack));
    escapes_.clear();
    walk(0, 0, 1, 0);

    NodeMask m;
    size_t n_valid = v_.sorted().size();
    std::sort(uncertain_.begin(), uncertain_.end());
    uncertain_.erase(std::unique(uncertain_.begin(), uncertain_.end()), uncertain_.end());
    // An accepted token needs no check.
    acc_bits_.assign(v_.mask_words(), 0);
    size_t n_acc = 0;
    for (int32_t t : accepted_) {
      uint32_t bit = uint32_t(1) << (t & 31);
      if (!(acc_bits_[t >> 5] & bit)) acc_bits_[t >> 5] |= bit, ++n_acc;
    }
    auto accepted = [&](int32_t t) { return (acc_bits_[t >> 5] >> (t & 31)) & 1; };
    for (auto& u : uncertain_)
      if (!accepted(u.first)) m.uncertain.push_back(u);
    if (n_acc * 2 <= n_valid) {
      for (int32_t t : accepted_)
        if (accepted(t)) m.ids.push_back(t), acc_bits_[t >> 5] &= ~(uint32_t(1) << (t & 31));  // once each
    } else {
      m.complement = true;
      for (int32_t t : v_.sorted())
        if (!accepted(t)) m.ids.push_back(t);
    }
    return m;
  }

 private:
  // Trie node `tn` at depth `depth`; its threads are sets_[lo, hi); escapes_[0, n_esc) are the depths
  // at which the rule ended on the way here.
  void walk(uint32_t tn, uint32_t depth, size_t hi, size_t lo) {
    const auto& trie = v_.trie();
    const auto& node = trie[tn];
    size_t n_esc = escapes_.size();
    for (uint32_t c = node.child_begin; c < node.child_end; ++c) {
      const auto& ch = v_.children()[c];
      const auto& child = trie[ch.node];
      size_t out_lo = sets_.size();
      stepper_.begin();
      std::vector<uint64_t>& out = sets_;
      // step() reads from sets_ while appending to it: copy the input range first.
      bool end;
      if (hi - lo == 1) {
        uint64_t one = sets_[lo];
        end = stepper_.step(&one, 1, ch.byte, out);
      } else {
        in_.assign(sets_.begin() + lo, sets_.begin() + hi);
        end = stepper_.step(in_.data(), in_.size(), ch.byte, out);
      }
      size_t out_hi = sets_.size();
      uint32_t d = depth + 1;
      bool alive = out_hi > out_lo;
      // Tokens ending here.
      for (uint32_t i = child.tok_lo; i < child.tok_lo + child.n_end; ++i) {
        int32_t t = v_.sorted()[i];
        if (alive || end)
          accepted_.push_back(t);
        else
          for (size_t e = 0; e < escapes_.size(); ++e) uncertain_.emplace_back(t, escapes_[e]);
      }
      if (end && escapes_matter_) escapes_.push_back(int32_t(d));
      if (child.tok_hi > child.tok_lo + child.n_end) {
        if (alive) {
          walk(ch.node, d, out_hi, out_lo);
        } else if (!escapes_.empty()) {
          for (uint32_t i = child.tok_lo + child.n_end; i < child.tok_hi; ++i)
            for (size_t e = 0; e < escapes_.size(); ++e) uncertain_.emplace_back(v_.sorted()[i], escapes_[e]);
        }
      }
      escapes_.resize(n_esc);
      sets_.resize(out_lo);
    }
  }

  const Automaton& a_;
  const TokenVocab& v_;
  StackArena arena_;
  Stepper stepper_;
  bool escapes_matter_ = true;
  std::vector<uint64_t> sets_, in_;
  std::vector<int32_t> escapes_;
  std::vector<int32_t> accepted_;
  std::vector<uint32_t> acc_bits_;
  std::vector<std::pair<int32_t, int32_t>> uncertain_;
};

}  // namespace

std::shared_ptr<const CompiledGrammar> compile_until(const Grammar& g,
                                                     std::shared_ptr<const TokenVocab> vocab,
                                                     std::chrono::steady_clock::time_point deadline,
                                                     const CompileLimits& limits, bool share_equal_masks) {
  auto t0 = std::chrono::steady_clock::now();
  auto cg = std::make_shared<CompiledGrammar>();
  CompileLimits bounded = limits;
  bounded.deadline = std::min(limits.deadline, deadline);
  cg->automaton = compile_automaton(g, bounded);
  cg->vocab = std::move(vocab);
  const Automaton& a = cg->automaton;
  // Masks differ only through what happens within a token's length (mask_classes.h).
  MaskClasses classes;
  if (share_equal_masks) {
    classes = mask_classes(a, cg->vocab->max_token_bytes());
  } else {  // every node its own class
    classes.of_node.assign(a.nodes.size(), -1);
    for (size_t n = 0; n < a.nodes.size(); ++n)
      if (a.nodes[n].has_edges()) classes.of_node[n] = classes.count++;
  }
  // Class ids are numbered in node order, so a class's first node is met when its id comes next.
  cg->masks.reserve(size_t(classes.count));
  MaskBuilder mb(a, *cg->vocab);
  for (size_t n = 0; n < a.nodes.size(); ++n) {
    if (classes.of_node[n] != int32_t(cg->masks.size())) continue;
    if ((cg->masks.size() & 15) == 0 && std::chrono::steady_clock::now() > deadline)
      throw Refused("compile-time", "compiling the grammar exceeded the compile time limit");
    cg->masks.push_back(mb.build(int32_t(n)));
  }
  cg->mask_of_node = std::move(classes.of_node);
  cg->compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return cg;
}

std::shared_ptr<const CompiledGrammar> compile(const Grammar& g, std::shared_ptr<const TokenVocab> vocab,
                                               const CompileOptions& options) {
  return compile_until(g, std::move(vocab), std::chrono::steady_clock::now() + options.timeout,
                       options.limits, options.share_equal_masks);
}

}  // namespace beluga::grammar
