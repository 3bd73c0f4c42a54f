// uniqueItems over finite item domains: when every position's items come from a small finite set of
// values (enum/const, boolean, null, or arrays of those with a bounded length), the array is an
// automaton over the subset of values written so far: an item may be any value of its position's
// domain not yet in the subset. Values are compared as JSON (1 equals 1.0: value_expr spells every
// canonical form of a value, so each value's spellings are one language, disjoint from the others'),
// and since items are distinct the subset's size is the item count, so minItems/maxItems and prefix
// positions need no state of their own. Domains over kMaxValues values or automata over kMaxStates
// subsets are refused.
#include <bit>

#include "grammar/json_schema_compiler.h"
#include "util/error.h"

namespace beluga::grammar::detail {

namespace {
constexpr size_t kMaxValues = 16;
constexpr size_t kMaxStates = 4096;
constexpr size_t kMaxArrays = 64;  // candidate arrays when a domain is "arrays of ..."
}  // namespace

// The values s accepts when there are finitely many of the kinds above; nullopt otherwise.
std::optional<std::vector<Json>> SchemaCompiler::finite_values(const Json& s0, const std::string& path,
                                                               int depth) {
  tick();
  if (depth > 8) return std::nullopt;
  Json s = lower(deref(s0, path), path);
  if (s.is_boolean())
    return s.get<bool>() ? std::nullopt : std::optional<std::vector<Json>>(std::vector<Json>());
  if (!s.is_object() || s.contains("allOf") || s.contains("anyOf") || s.contains("oneOf"))
    return std::nullopt;
  // Candidates (a superset), then the ones s's own grammar accepts.
  std::vector<Json> cands;
  if (s.contains("enum") || s.contains("const")) {
    if (s.contains("enum") && s["enum"].is_array()) cands.assign(s["enum"].begin(), s["enum"].end());
    if (s.contains("const")) cands.push_back(s["const"]);
  } else {
    for (const std::string& t : types_of(s, path)) {
      if (t == "null") {
        cands.push_back(nullptr);
      } else if (t == "boolean") {
        cands.push_back(true), cands.push_back(false);
      } else if (t == "array") {
        if (!s.contains("maxItems") || !s.contains("items") || s["items"].is_array() ||
            s.contains("prefixItems"))
          return std::nullopt;
        auto items = finite_values(s["items"], join_path(path, "items"), depth + 1);
        if (!items) return std::nullopt;
        int64_t max = count_value(s["maxItems"].get<double>(), false);
        std::vector<Json> level = {Json::array()};
        for (int64_t len = 0; len <= max; ++len) {
          for (auto& a : level) cands.push_back(a);
          if (len == max) break;
          std::vector<Json> longer;
          for (auto& a : level)
            for (auto& v : *items) {
              Json b = a;
              b.push_back(v);
              longer.push_back(b);
            }
          if (cands.size() + longer.size() > kMaxArrays) return std::nullopt;
          level = std::move(longer);
        }
      } else {
        return std::nullopt;  // numbers, strings, objects: infinitely many
      }
    }
  }
  if (cands.size() > kMaxArrays) return std::nullopt;
  std::vector<std::string> texts;
  for (auto& v : cands) texts.push_back(v.dump());
  std::vector<bool> ok = accepts(gen(s, path, depth + 1), texts);
  std::vector<Json> out;
  for (size_t i = 0; i < cands.size(); ++i) {
    bool dup = false;
    for (auto& x : out) dup = dup || json_equal(x, cands[i]);
    if (ok[i] && !dup) out.push_back(cands[i]);
  }
  return out;
}

int SchemaCompiler::gen_unique(const std::vector<const Json*>& prefix, const Json& rest, int64_t min,
                               int64_t max, const std::string& path, int depth) {
  // Each position's domain as a mask over the union of the values.
  std::vector<Json> values;
  auto domain = [&](const Json& s, const std::string& p) -> uint32_t {
    auto vs = finite_values(s, p, depth + 1);
    if (!vs)
      refuse("uniqueItems", path,
             "uniqueItems needs items from a finite domain (enum, const, boolean, null or arrays of those)");
    uint32_t mask = 0;
    for (auto& v : *vs) {
      size_t i = 0;
      while (i < values.size() && !json_equal(values[i], v)) ++i;
      if (i == values.size()) {
        if (values.size() >= kMaxValues)
          refuse("uniqueItems", path,
                 "uniqueItems over more than " + std::to_string(kMaxValues) + " values is not supported");
        values.push_back(v);
      }
      mask |= uint32_t(1) << i;
    }
    return mask;
  };
  size_t p = prefix.size();
  std::vector<uint32_t> at;  // domain of position i (i < p), then of the rest
  for (size_t i = 0; i < p; ++i) at.push_back(domain(*prefix[i], join_path(path, std::to_string(i))));
  at.push_back(max >= 0 && size_t(max) <= p ? 0 : domain(rest, join_path(path, "items")));
  auto allowed = [&](uint32_t set) { return at[std::min<size_t>(std::popcount(set), p)] & ~set; };
  auto room = [&](uint32_t set) { return max < 0 || std::popcount(set) < max; };
  std::vector<int> val;
  for (auto& v : values) {
    int e = value_expr(v, path);
    if (expr_size(e, 200) >= 200) {  // shared by many states: one copy
      int r = g_.add_rule(join_path(path, "uniqueItems") + ":" + std::to_string(val.size()));
      g_.define(r, e);
      e = g_.ref(r);
    }
    val.push_back(e);
  }
  // R(set): after the items in `set` (at least one), the rest of the array.
  std::map<uint32_t, int> rule;
  std::vector<uint32_t> work;
  auto rule_of = [&](uint32_t set) {
    auto [it, fresh] = rule.try_emplace(set, -1);
    if (fresh) {
      if (rule.size() > kMaxStates)
        refuse("uniqueItems", path, "uniqueItems needs over " + std::to_string(kMaxStates) + " states");
      it->second = g_.add_rule(join_path(path, "uniqueItems") + "{" + std::to_string(set) + "}");
      work.push_back(set);
    }
    return it->second;
  };
  int comma = tokws(","), close = wstok("]");
  std::vector<int> first;
  if (min <= 0) first.push_back(close);
  if (max != 0)
    for (uint32_t a = allowed(0), i = 0; a; a >>= 1, ++i)
      if (a & 1) first.push_back(g_.seq({val[i], g_.ref(rule_of(uint32_t(1) << i))}));
  while (!work.empty()) {
    tick();
    uint32_t set = work.back();
    work.pop_back();
    std::vector<int> alts;
    if (std::popcount(set) >= min) alts.push_back(close);
    if (room(set))
      for (uint32_t a = allowed(set), i = 0; a; a >>= 1, ++i)
        if (a & 1) alts.push_back(g_.seq({comma, val[i], g_.ref(rule_of(set | (uint32_t(1) << i)))}));
    g_.define(rule[set], g_.choice(std::move(alts)));
  }
  return g_.seq({tokws("["), g_.choice(std::move(first))});
}

}  // namespace beluga::grammar::detail
