// The keys of an object's unnamed members split by which patterns (patternProperties) match them:
// the string grammars of the patterns, of "any string" and of the named keys are explored together as
// one product DFA (each through its own matcher; a matcher's sorted thread set is its state), and each
// class of keys (exactly the patterns in a set match, no named key) becomes right-linear rules over
// that DFA. Complement and intersection come free this way, so a key that matches no pattern (it takes
// additionalProperties) and a key that matches two (it takes both schemas) are both exact.
#include <map>
#include <memory>
#include <set>

#include "grammar/automaton.h"
#include "grammar/compiled.h"
#include "grammar/json_schema_compiler.h"
#include "grammar/matcher.h"
#include "util/error.h"

namespace beluga::grammar::detail {

namespace {
constexpr size_t kMaxKeyStates = 3000;
}

std::map<uint32_t, int> SchemaCompiler::key_classes(const std::vector<std::string>& patterns,
                                                    const std::vector<std::string>& named_texts,
                                                    const std::string& path) {
  // Machines: 0 = any string, 1 = the named keys, 2.. = the patterns.
  std::vector<int> exprs = {string_expr(0, -1)};
  std::vector<int> names;
  for (auto& t : named_texts) names.push_back(lit(t));
  exprs.push_back(g_.choice(std::move(names)));
  for (auto& p : patterns)
    exprs.push_back(gen_string(Json{{"pattern", p}}, join_path(path, "patternProperties")));
  std::vector<std::unique_ptr<Matcher>> m;
  // Each machine also takes the byte 0x01, which no key starts with, so none derives nothing.
  for (int e : exprs) m.push_back(std::make_unique<Matcher>(probe_grammar(g_.choice({e, lit("\x01")}))));
  size_t k = m.size();
  // A product state: per machine, its thread set and whether it is accepting (empty: dead).
  using Key = std::vector<std::vector<uint64_t>>;
  std::map<Key, int> id;
  std::vector<std::string> rep;
  std::vector<std::map<int, ByteSet>> next;  // per state: target -> bytes
  std::vector<int64_t> cls;                  // accepting class (pattern bit set), -1 if not a key
  auto key_now = [&](const std::vector<bool>& alive) {
    Key key(k);
    for (size_t i = 0; i < k; ++i) {
      if (!alive[i]) continue;  // dead: empty
      key[i] = m[i]->state_key();
      key[i].push_back(m[i]->is_accepting() ? ~uint64_t(0) : ~uint64_t(1));  // threads hold no "end"
    }
    return key;
  };
  auto cls_now = [&](const std::vector<bool>& alive) -> int64_t {
    if (!(alive[0] && m[0]->is_accepting()) || (alive[1] && m[1]->is_accepting())) return -1;
    int64_t c = 0;
    for (size_t i = 2; i < k; ++i)
      if (alive[i] && m[i]->is_accepting()) c |= int64_t(1) << (i - 2);
    return c;
  };
  std::vector<std::vector<bool>> alive_of;
  std::vector<bool> all(k, true);
  id[key_now(all)] = 0;
  rep.push_back("");
  alive_of.push_back(all);
  cls.push_back(cls_now(all));
  next.emplace_back();
  for (size_t s = 0; s < rep.size(); ++s) {
    tick();
    for (size_t i = 0; i < k; ++i) {
      m[i]->rollback(m[i]->num_tokens());
      if (alive_of[s][i] && !rep[s].empty()) BELUGA_CHECK(m[i]->accept_bytes(rep[s]), "key automaton replay");
    }
    for (int b = 0; b < 256; ++b) {
      std::string byte(1, char(b));
      std::vector<bool> alive(k);
      for (size_t i = 0; i < k; ++i) alive[i] = alive_of[s][i] && m[i]->accept_bytes(byte);
      if (alive[0]) {
        Key key = key_now(alive);
        int64_t c = cls_now(alive);
        auto [it, fresh] = id.try_emplace(key, int(rep.size()));
        if (fresh) {
          if (rep.size() >= kMaxKeyStates)
            refuse("patternProperties", path, "the key languages of the patterns need too many states");
          rep.push_back(rep[s] + byte);
          alive_of.push_back(alive);
          cls.push_back(c);
          next.emplace_back();
        }
        next[s][it->second].set(unsigned(b));
      }
      for (size_t i = 0; i < k; ++i)
        if (alive[i]) m[i]->rollback(1);
    }
  }
  // One copy of the DFA per class that some state accepts.
  std::map<uint32_t, int> out;
  std::set<int64_t> classes(cls.begin(), cls.end());
  classes.erase(-1);
  for (int64_t c : classes) {
    std::vector<int> rules(rep.size());
    for (size_t s = 0; s < rep.size(); ++s)
      rules[s] = g_.add_rule(join_path(path, "keys") + ":" + std::to_string(c) + ":" + std::to_string(s));
    for (size_t s = 0; s < rep.size(); ++s) {
      std::vector<int> alts;
      if (cls[s] == c) alts.push_back(g_.empty());
      for (auto& [t, set] : next[s]) alts.push_back(g_.seq({g_.bytes(set), g_.ref(rules[t])}));
      g_.define(rules[s], g_.choice(std::move(alts)));
    }
    out[uint32_t(c)] = g_.ref(rules[0]);
  }
  return out;
}

}  // namespace beluga::grammar::detail
