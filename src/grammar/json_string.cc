#include "grammar/json_string.h"

#include <functional>
#include <map>

#include <nlohmann/json.hpp>

namespace beluga::grammar {

namespace {

// A DFA over the bytes of string content: state 0 is a character boundary.
enum State { B, C1, C2, C3, E0, ED, F0, F4, ESC, U1, U2, U3, U4A, U4B, kStates };

struct Move {
  ByteSet bytes;
  int to;
};

const std::vector<Move>& moves(int q) {
  static const std::vector<std::vector<Move>> table = [] {
    std::vector<std::vector<Move>> t(kStates);
    ByteSet plain = ByteSet::range(0x20, 0x7f);
    plain.clear('"');
    plain.clear('\\');
    t[B] = {{plain, B},
            {ByteSet::of("\\"), ESC},
            {ByteSet::range(0xc2, 0xdf), C1},
            {ByteSet::range(0xe0, 0xe0), E0},
            {[] {
               ByteSet s = ByteSet::range(0xe1, 0xec);
               s.set_range(0xee, 0xef);
               return s;
             }(),
             C2},
            {ByteSet::range(0xed, 0xed), ED},
            {ByteSet::range(0xf0, 0xf0), F0},
            {ByteSet::range(0xf1, 0xf3), C3},
            {ByteSet::range(0xf4, 0xf4), F4}};
    t[C1] = {{ByteSet::range(0x80, 0xbf), B}};
    t[C2] = {{ByteSet::range(0x80, 0xbf), C1}};
    t[C3] = {{ByteSet::range(0x80, 0xbf), C2}};
    t[E0] = {{ByteSet::range(0xa0, 0xbf), C1}};
    t[ED] = {{ByteSet::range(0x80, 0x9f), C1}};
    t[F0] = {{ByteSet::range(0x90, 0xbf), C2}};
    t[F4] = {{ByteSet::range(0x80, 0x8f), C2}};
    t[ESC] = {{ByteSet::of("\"\\bfnrt"), B}, {ByteSet::of("u"), U1}};
    t[U1] = {{ByteSet::of("0"), U2}};
    t[U2] = {{ByteSet::of("0"), U3}};
    t[U3] = {{ByteSet::of("0"), U4A}, {ByteSet::of("1"), U4B}};
    t[U4A] = {{ByteSet::of("01234567bef"), B}};
    t[U4B] = {{ByteSet::of("0123456789abcdef"), B}};
    return t;
  }();
  return table[q];
}

// The rest of the current character from state q.
int complete(Grammar& g, int q, std::map<int, int>& memo) {
  if (q == B) return g.empty();
  auto it = memo.find(q);
  if (it != memo.end()) return it->second;
  std::vector<int> alts;
  for (const Move& m : moves(q)) alts.push_back(g.seq({g.bytes(m.bytes), complete(g, m.to, memo)}));
  int e = g.choice(std::move(alts));
  memo[q] = e;
  return e;
}

struct Trie {
  struct Node {
    std::map<uint8_t, int> next;
    bool terminal = false;
  };
  std::vector<Node> nodes{Node{}};
  void add(const std::string& s) {
    int u = 0;
    for (unsigned char c : s) {
      auto it = nodes[u].next.find(c);
      if (it == nodes[u].next.end()) {
        nodes.push_back({});
        int v = int(nodes.size()) - 1;
        nodes[u].next[c] = v;
        u = v;
      } else {
        u = it->second;
      }
    }
    nodes[u].terminal = true;
  }
};

}  // namespace

int json_string_char(Grammar& g) {
  std::map<int, int> memo;
  std::vector<int> alts;
  for (const Move& m : moves(B)) alts.push_back(g.seq({g.bytes(m.bytes), complete(g, m.to, memo)}));
  return g.choice(std::move(alts));
}

int json_string_not_in(Grammar& g, const std::vector<std::string>& excluded, int rest) {
  Trie trie;
  for (const auto& s : excluded) {
    std::string d = nlohmann::json(s).dump();
    trie.add(d.substr(1, d.size() - 2));
  }
  std::map<int, int> memo;
  int quote = g.literal("\"");
  int any_rest = rest;
  // A string that has left the trie: finish the character, then anything.
  auto free_from = [&](int q) { return g.seq({complete(g, q, memo), any_rest}); };
  std::function<int(int, int)> not_in = [&](int u, int q) -> int {
    std::vector<int> alts;
    const Trie::Node& node = trie.nodes[u];
    if (q == B && !node.terminal) alts.push_back(quote);
    for (const Move& m : moves(q)) {
      ByteSet off = m.bytes;
      for (auto [b, v] : node.next) {
        if (!m.bytes.has(b)) continue;
        off.clear(b);
        alts.push_back(g.seq({g.byte(b), not_in(v, m.to)}));
      }
      if (!off.empty()) alts.push_back(g.seq({g.bytes(off), free_from(m.to)}));
    }
    return g.choice(std::move(alts));
  };
  return g.seq({quote, not_in(0, B)});
}

}  // namespace beluga::grammar
