#include "grammar/pda.h"

namespace beluga::grammar {

int32_t StackArena::push(int32_t ret, int32_t parent) {
  uint64_t key = (uint64_t(uint32_t(ret)) << 32) | uint32_t(parent + 1);
  auto [it, fresh] = index_.try_emplace(key, int32_t(frames_.size()));
  if (fresh) frames_.push_back({ret, parent});
  return it->second;
}

void KeySet::clear() {
  if (++cur_ == 0) {
    std::fill(gen_.begin(), gen_.end(), 0);
    cur_ = 1;
  }
  count_ = 0;
}

bool KeySet::insert(uint64_t k) {
  if ((count_ + 1) * 2 > keys_.size()) grow();
  size_t mask = keys_.size() - 1;
  for (size_t i = (k * 0x9E3779B97F4A7C15ull) >> 20 & mask;; i = (i + 1) & mask) {
    if (gen_[i] != cur_) {
      gen_[i] = cur_;
      keys_[i] = k;
      ++count_;
      return true;
    }
    if (keys_[i] == k) return false;
  }
}

void KeySet::grow() {
  std::vector<uint64_t> live;
  for (size_t i = 0; i < keys_.size(); ++i)
    if (gen_[i] == cur_) live.push_back(keys_[i]);
  size_t n = keys_.size() * 2;
  keys_.assign(n, 0);
  gen_.assign(n, 0);
  cur_ = 1;
  count_ = 0;
  for (uint64_t k : live) insert(k);
}

bool Stepper::add(int32_t node0, int32_t stack0, std::vector<uint64_t>& out) {
  bool end = false;
  work_.clear();
  work_.push_back(thread_key(node0, stack0));
  while (!work_.empty()) {
    uint64_t k = work_.back();
    work_.pop_back();
    if (!seen_.insert(k)) continue;
    int32_t node = thread_node(k), stack = thread_stack(k);
    const Automaton::Node& n = a_.nodes[node];
    if (n.has_edges()) out.push_back(k);
    if (n.final) {
      if (stack == kEmptyStack) {
        end = true;
      } else {
        const StackArena::Frame& f = arena_.frame(stack);
        work_.push_back(thread_key(f.ret, f.parent));
      }
    }
    if (n.call >= 0) {
      int32_t start = a_.rule_start[n.call];
      if (start >= 0) work_.push_back(thread_key(start, arena_.push(n.ret, stack)));
    }
    for (uint32_t e = n.eps_begin; e < n.eps_end; ++e) work_.push_back(thread_key(a_.eps[e], stack));
  }
  return end;
}

bool Stepper::closure(int32_t node, int32_t stack, std::vector<uint64_t>& out) {
  return add(node, stack, out);
}

bool Stepper::step(const uint64_t* in, size_t n, uint8_t b, std::vector<uint64_t>& out) {
  if (n == 1) {
    // Fast path (one thread, as in a DFA lexeme): a target without epsilon edges, call or end is the
    // whole next set, no deduplication needed.
    const Automaton::Node& nd = a_.nodes[thread_node(in[0])];
    for (uint32_t e = nd.edge_begin; e < nd.edge_end; ++e) {
      const Automaton::Edge& ed = a_.edges[e];
      if (b < ed.lo) return false;
      if (b <= ed.hi) {
        const Automaton::Node& t = a_.nodes[ed.to];
        if (t.eps_begin == t.eps_end && t.call < 0 && !t.final) {
          if (t.has_edges()) out.push_back(thread_key(ed.to, thread_stack(in[0])));
          return false;
        }
        break;
      }
    }
  }
  bool end = false;
  for (size_t i = 0; i < n; ++i) {
    const Automaton::Node& nd = a_.nodes[thread_node(in[i])];
    int32_t stack = thread_stack(in[i]);
    for (uint32_t e = nd.edge_begin; e < nd.edge_end; ++e) {
      const Automaton::Edge& ed = a_.edges[e];
      if (b < ed.lo) break;  // edges are sorted by lo and disjoint
      if (b <= ed.hi) end |= add(ed.to, stack, out);
    }
  }
  return end;
}

}  // namespace beluga::grammar
