#include "grammar/mask_classes.h"

#include <algorithm>
#include <cstring>

namespace beluga::grammar {

namespace {

// Interns signatures (sequences of int32) as dense ids: hashed, then compared exactly, so two nodes
// share a class only when their signatures are equal.
class SignatureTable {
 public:
  void reset(size_t expected) {
    size_t cap = 16;
    while (cap < 2 * expected) cap *= 2;
    slots_.assign(cap, -1);
    hashes_.clear();
    store_.clear();
    begin_.assign(1, 0);
  }
  int32_t intern(const std::vector<int32_t>& sig) {
    uint64_t h = 0x84222325cbf29ce4ULL;
    for (int32_t v : sig) h = (h ^ uint32_t(v)) * 0x100000001b3ULL;
    size_t mask = slots_.size() - 1;
    for (size_t s = (h ^ (h >> 29)) & mask;; s = (s + 1) & mask) {
      int32_t c = slots_[s];
      if (c < 0) {
        c = int32_t(hashes_.size());
        slots_[s] = c;
        hashes_.push_back(h);
        store_.insert(store_.end(), sig.begin(), sig.end());
        begin_.push_back(uint32_t(store_.size()));
        return c;
      }
      if (hashes_[c] == h && begin_[c + 1] - begin_[c] == sig.size() &&
          std::memcmp(store_.data() + begin_[c], sig.data(), sig.size() * sizeof(int32_t)) == 0)
        return c;
    }
  }
  int32_t size() const { return int32_t(hashes_.size()); }

 private:
  std::vector<int32_t> slots_;
  std::vector<uint64_t> hashes_;
  std::vector<int32_t> store_;
  std::vector<uint32_t> begin_;
};

// Rules whose nodes are DFA states: byte edges only, sorted and disjoint (one thread per input).
std::vector<uint8_t> plain_rules(const Automaton& a) {
  std::vector<uint8_t> plain(a.rule_start.size(), 1);
  for (const auto& n : a.nodes) {
    if (n.rule < 0) continue;
    bool ok = n.eps_end == n.eps_begin && n.call < 0;
    for (uint32_t e = n.edge_begin + 1; ok && e < n.edge_end; ++e) ok = a.edges[e].lo > a.edges[e - 1].hi;
    if (!ok) plain[n.rule] = 0;
  }
  return plain;
}

}  // namespace

MaskClasses mask_classes(const Automaton& a, size_t depth) {
  size_t n = a.nodes.size();
  std::vector<uint8_t> plain_rule = plain_rules(a);
  auto plain = [&](size_t i) { return a.nodes[i].rule >= 0 && plain_rule[a.nodes[i].rule]; };
  std::vector<int32_t> cls(n), next(n), sig;
  SignatureTable table;
  // Round 0: what a node does with the empty string (ends its rule or not), and whether it has edges.
  table.reset(n);
  for (size_t i = 0; i < n; ++i) {
    const auto& nd = a.nodes[i];
    if (plain(i))
      sig = {0, nd.rule, nd.final, nd.has_edges()};
    else
      sig = {1, int32_t(i)};
    cls[i] = table.intern(sig);
  }
  // Round r: the same on every string of up to r bytes. Stops early once a round splits nothing.
  for (size_t r = 0; r < depth; ++r) {
    int32_t before = table.size();
    table.reset(n);
    for (size_t i = 0; i < n; ++i) {
      const auto& nd = a.nodes[i];
      sig.clear();
      sig.push_back(cls[i]);
      if (plain(i)) {
        // Adjacent ranges into one class are one range: equal behaviour, however the edges were cut.
        for (uint32_t e = nd.edge_begin; e < nd.edge_end; ++e) {
          const auto& ed = a.edges[e];
          int32_t to = cls[ed.to];
          size_t k = sig.size();
          if (k > 1 && sig[k - 1] == to && sig[k - 2] + 1 == ed.lo)
            sig[k - 2] = ed.hi;
          else
            sig.insert(sig.end(), {int32_t(ed.lo), int32_t(ed.hi), to});
        }
      }
      next[i] = table.intern(sig);
    }
    cls.swap(next);
    if (table.size() == before) break;
  }
  // Dense ids over the nodes that have byte edges (the ones with masks).
  MaskClasses out;
  out.of_node.assign(n, -1);
  std::vector<int32_t> dense(table.size(), -1);
  for (size_t i = 0; i < n; ++i) {
    if (!a.nodes[i].has_edges()) continue;
    int32_t& d = dense[cls[i]];
    if (d < 0) d = out.count++;
    out.of_node[i] = d;
  }
  return out;
}

}  // namespace beluga::grammar
