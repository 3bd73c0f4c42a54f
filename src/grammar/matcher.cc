#include "grammar/matcher.h"

#include <algorithm>
#include <cstring>

#include "util/error.h"

namespace beluga::grammar {

namespace {
// A guard against pathological ambiguity: more live threads than this fails the generation.
constexpr size_t kMaxThreads = 1 << 16;
}  // namespace

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar)
    : g_(std::move(grammar)), stepper_(g_->automaton, arena_) {
  set_begin_.push_back(0);
  const Automaton& a = g_->automaton;
  bool end = false;
  stepper_.begin();
  if (a.rule_start[a.root] >= 0) end = stepper_.closure(a.rule_start[a.root], kEmptyStack, threads_);
  set_begin_.push_back(threads_.size());
  accepting_.push_back(end);
  token_pos_.push_back(0);
}

bool Matcher::push_byte(uint8_t b) {
  size_t lo = set_begin_[pos()], hi = set_begin_[pos() + 1];
  if (lo == hi) return false;
  scratch_a_.assign(threads_.begin() + lo, threads_.begin() + hi);
  size_t before = threads_.size();
  stepper_.begin();
  bool end = stepper_.step(scratch_a_.data(), scratch_a_.size(), b, threads_);
  if (threads_.size() == before && !end) return false;
  BELUGA_CHECK(threads_.size() - before <= kMaxThreads, "grammar matcher: the grammar is too ambiguous here");
  set_begin_.push_back(threads_.size());
  accepting_.push_back(end);
  return true;
}

void Matcher::pop_bytes(size_t n) {
  for (size_t i = 0; i < n; ++i) {
    set_begin_.pop_back();
    accepting_.pop_back();
  }
  threads_.resize(set_begin_.back());
}

bool Matcher::accept_bytes(std::string_view bytes) {
  size_t start = pos();
  for (unsigned char c : bytes) {
    if (!push_byte(c)) {
      pop_bytes(pos() - start);
      return false;
    }
  }
  token_pos_.push_back(pos());
  return true;
}

bool Matcher::accept_token(int id) {
  const TokenVocab& v = *g_->vocab;
  if (id < 0 || size_t(id) >= v.size()) return false;
  if (std::find(v.eos().begin(), v.eos().end(), id) != v.eos().end()) {
    if (!is_accepting()) return false;
    token_pos_.push_back(pos());
    return true;
  }
  if (!v.allowed(id)) return false;
  return accept_bytes(v.bytes(id));
}

void Matcher::rollback(int n) {
  BELUGA_CHECK(n >= 0 && n <= num_tokens(), "grammar matcher: cannot roll back ", n, " tokens (have ",
               num_tokens(), ")");
  for (int i = 0; i < n; ++i) token_pos_.pop_back();
  pop_bytes(pos() - token_pos_.back());
}

bool Matcher::allows(int id) {
  if (!accept_token(id)) return false;
  rollback(1);
  return true;
}

// Does the token's rest (from `offset`) fit after the rule whose caller stack is `stack` ends?
bool Matcher::check(int32_t stack, int32_t token, int32_t offset) {
  if (stack == kEmptyStack) return false;  // the whole grammar ended, and bytes remain
  const std::string& bytes = g_->vocab->bytes(token);
  const StackArena::Frame& f = arena_.frame(stack);
  scratch_a_.clear();
  stepper_.begin();
  stepper_.closure(f.ret, f.parent, scratch_a_);
  for (size_t i = size_t(offset); i < bytes.size(); ++i) {
    if (scratch_a_.empty()) return false;
    scratch_b_.clear();
    stepper_.begin();
    bool end = stepper_.step(scratch_a_.data(), scratch_a_.size(), uint8_t(bytes[i]), scratch_b_);
    if (end && i + 1 == bytes.size()) return true;
    scratch_a_.swap(scratch_b_);
  }
  return !scratch_a_.empty();
}

void Matcher::fill_mask(uint32_t* mask) {
  const TokenVocab& v = *g_->vocab;
  size_t words = v.mask_words();
  std::memset(mask, 0, words * sizeof(uint32_t));
  size_t lo = set_begin_[pos()], hi = set_begin_[pos() + 1];
  // Context-independent parts, once per distinct mask (nodes may share one).
  seen_nodes_.clear();
  for (size_t i = lo; i < hi; ++i) {
    int32_t mi = g_->mask_of_node[thread_node(threads_[i])];
    if (std::find(seen_nodes_.begin(), seen_nodes_.end(), mi) != seen_nodes_.end()) continue;
    seen_nodes_.push_back(mi);
    const NodeMask& m = g_->masks[mi];
    if (!m.complement) {
      for (int32_t t : m.ids) mask[t >> 5] |= uint32_t(1) << (t & 31);
    } else {
      tmp_mask_.assign(v.valid_mask().begin(), v.valid_mask().end());
      for (int32_t t : m.ids) tmp_mask_[t >> 5] &= ~(uint32_t(1) << (t & 31));
      for (size_t w = 0; w < words; ++w) mask[w] |= tmp_mask_[w];
    }
  }
  // Tokens that cross the end of a rule: decided by the real stack.
  for (size_t i = lo; i < hi; ++i) {
    uint64_t k = threads_[i];
    const NodeMask& m = g_->masks[g_->mask_of_node[thread_node(k)]];
    for (const auto& [t, off] : m.uncertain) {
      if ((mask[t >> 5] >> (t & 31)) & 1) continue;
      if (check(thread_stack(k), t, off)) mask[t >> 5] |= uint32_t(1) << (t & 31);
    }
  }
  if (is_accepting())
    for (int id : v.eos()) mask[id >> 5] |= uint32_t(1) << (id & 31);
}

std::vector<uint64_t> Matcher::state_key() const {
  std::vector<uint64_t> k(threads_.begin() + set_begin_[pos()], threads_.begin() + set_begin_[pos() + 1]);
  std::sort(k.begin(), k.end());
  k.erase(std::unique(k.begin(), k.end()), k.end());
  return k;
}

}  // namespace beluga::grammar
