#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "grammar/json_schema_compiler.h"
#include "grammar/json_string.h"
#include "util/error.h"

namespace beluga::grammar::detail {

int SchemaCompiler::gen_array(const Json& s, const std::string& path, int depth) {
  std::vector<const Json*> prefix;
  Json true_schema = true;
  const Json* rest = &true_schema;
  std::string rest_path = path;
  if (draft_ == Draft::k2020) {
    if (s.contains("prefixItems")) {
      BELUGA_CHECK(s["prefixItems"].is_array(), "prefixItems at ", path, " must be an array");
      for (auto& x : s["prefixItems"]) prefix.push_back(&x);
    }
    if (s.contains("items")) {
      BELUGA_CHECK(!s["items"].is_array(), "items at ", path,
                   " must be a schema in draft 2020-12 (use prefixItems)");
      rest = &s["items"];
      rest_path = join_path(path, "items");
    }
  } else if (s.contains("items")) {
    if (s["items"].is_array()) {
      for (auto& x : s["items"]) prefix.push_back(&x);
      if (s.contains("additionalItems"))
        rest = &s["additionalItems"], rest_path = join_path(path, "additionalItems");
    } else {
      rest = &s["items"];
      rest_path = join_path(path, "items");
    }
  }
  int64_t min = 0, max = -1;
  if (s.contains("minItems")) min = count_value(s["minItems"].get<double>(), false);
  if (s.contains("maxItems")) max = count_value(s["maxItems"].get<double>(), false);
  bool unique = s.contains("uniqueItems") && s["uniqueItems"].is_boolean() && s["uniqueItems"].get<bool>();
  if (s.contains("contains")) {
    const Json& c = s["contains"];
    int64_t minc = 1, maxc = -1;
    if (s.contains("minContains")) minc = count_value(s["minContains"].get<double>(), true);
    if (s.contains("maxContains")) maxc = count_value(s["maxContains"].get<double>(), false);
    if (maxc >= 0 && minc > maxc) return g_.nothing();
    if (is_assertion_free(c)) {  // every item matches: the counts bound the length
      min = std::max(min, minc);
      if (maxc >= 0) max = max < 0 ? maxc : std::min(max, maxc);
    } else if (c.is_boolean()) {  // no item matches
      if (minc > 0) return g_.nothing();
    } else {
      if (unique) refuse("uniqueItems", path, "uniqueItems together with contains is not supported");
      if (!prefix.empty() || s.contains("minItems") || s.contains("maxItems"))
        refuse("contains", path, "contains together with prefix items or minItems/maxItems is not supported");
      return gen_contains(c, *rest, minc, maxc, path, depth);
    }
  }
  if (rest->is_boolean() && !rest->get<bool>())
    max = max < 0 ? int64_t(prefix.size()) : std::min<int64_t>(max, prefix.size());
  if (max >= 0 && max < min) return g_.nothing();
  if (min > 100000 || max > 100000)
    refuse(min > 100000 ? "minItems" : "maxItems", path, "item counts above 100000 are not supported");
  if (unique && !(max >= 0 && max <= 1)) return gen_unique(prefix, *rest, min, max, path, depth);
  int p = int(prefix.size());
  std::vector<int> items;
  for (int i = 0; i < p; ++i) items.push_back(gen(*prefix[i], join_path(path, std::to_string(i)), depth + 1));
  int rest_e = -1;
  auto rest_expr = [&] {
    if (rest_e < 0) rest_e = gen(*rest, rest_path, depth + 1);
    return rest_e;
  };
  auto item = [&](int64_t i) { return i < p ? items[i] : rest_expr(); };
  int comma = tokws(",");
  // tail(i): the items from index i on, i >= 1 already written.
  std::function<int(int64_t)> tail = [&](int64_t i) -> int {
    if (max >= 0 && i >= max) return g_.empty();
    if (i >= p) {
      int one = g_.seq({comma, rest_expr()});
      int need = int(std::max<int64_t>(min - i, 0));
      int extra = max < 0 ? -1 : int(max - std::max<int64_t>(i, min));
      return g_.seq({g_.repeat(one, need, need), g_.repeat(one, 0, extra)});
    }
    int here = g_.seq({comma, item(i), tail(i + 1)});
    return i < min ? here : g_.optional(here);
  };
  int body;
  if (max == 0) {
    body = g_.empty();
  } else {
    int first = g_.seq({item(0), tail(1)});
    body = min > 0 ? first : g_.optional(first);
  }
  return g_.seq({tokws("["), body, wstok("]")});
}

// contains whose subschema is a type test, integral numeric bounds or an integral const: items are
// "matching" (item schema and the subschema) or "non-matching" (item schema and the subschema's
// complement, written as a schema: the other types, numbers outside the bounds), two disjoint
// languages, so the array is N* (M N*){min,max} exactly.
int SchemaCompiler::gen_contains(const Json& c, const Json& item, int64_t minc, int64_t maxc,
                                 const std::string& path, int depth) {
  // The subschema's test: its types, plus integral numeric bounds or an integral const.
  Json fails = Json::array();  // number schemas that fail the test
  bool cval = false;
  for (auto& [k, v] : c.items()) {
    if (k == "type" || classify(k, draft_) == Kw::kIgnored) continue;
    bool bound = k == "minimum" || k == "maximum" ||
                 (draft_ != Draft::k4 && (k == "exclusiveMinimum" || k == "exclusiveMaximum"));
    if ((bound || k == "const") && v.is_number() && std::floor(v.get<double>()) == v.get<double>()) {
      // Its complement among numbers (integral bounds, as gen_number takes them).
      const Json& value = v;  // a structured binding cannot be captured (C++20 as clang 14 has it)
      auto num = [&](const char* kw) { return Json{{"type", "number"}, {kw, value}}; };
      if (k == "minimum") fails.push_back(num("exclusiveMaximum"));
      if (k == "exclusiveMinimum") fails.push_back(num("maximum"));
      if (k == "maximum") fails.push_back(num("exclusiveMinimum"));
      if (k == "exclusiveMaximum") fails.push_back(num("minimum"));
      if (k == "const")
        fails.push_back(num("exclusiveMaximum")), fails.push_back(num("exclusiveMinimum")), cval = true;
      continue;
    }
    refuse("contains", path,
           "contains is supported when its subschema tests the type, integral numeric bounds or an "
           "integral const (\"" +
               k + "\" is not)");
  }
  if (cval && c.size() > size_t(1 + c.contains("type")))
    refuse("contains", path, "contains with const and other keywords is not supported");
  std::set<std::string> t = types_of(c, path), other = types_of(Json::object(), path);
  if (t.count("number")) t.insert("integer");
  if (t.count("integer") && !t.count("number"))
    refuse("contains", path,
           "contains {\"type\": \"integer\"} is not supported (its complement is non-integral numbers)");
  if (cval && !t.count("number")) refuse("contains", path, "a const that the type excludes is not supported");
  for (auto& x : t) other.erase(x);
  if (cval) other = {"null", "boolean", "string", "array", "object"};  // const v: only v itself matches
  if (minc > 1000 || maxc > 1000)
    refuse("contains", path, "minContains/maxContains above 1000 are not supported");
  // Non-matching: the other types, or a number that fails the test (two disjoint languages).
  Json ty = Json::array();
  for (auto& x : other) ty.push_back(x);
  Json nonmatch = fails.empty() ? Json{{"type", ty}} : Json{{"anyOf", fails}};
  if (!fails.empty()) nonmatch["anyOf"].push_back(Json{{"type", ty}});
  auto as_rule = [&](const std::string& name, int e) {
    int r = g_.add_rule(join_path(path, name));
    g_.define(r, e);
    return g_.ref(r);
  };
  int m = as_rule("contains", gen(merge(item, c, path), join_path(path, "contains"), depth + 1));
  int nm = as_rule("contains:other", gen(merge(item, nonmatch, path), join_path(path, "items"), depth + 1));
  int comma = tokws(",");
  int more_nm = g_.repeat(g_.seq({comma, nm}), 0, -1);
  int64_t cap = maxc >= 0 ? maxc : minc;
  // after(k): the rest of the array after its first item, k matching items so far (k <= cap).
  std::vector<int> after(size_t(cap) + 1);
  for (int64_t k = cap; k >= 0; --k) {
    std::vector<int> alts;
    if (k >= minc) alts.push_back(g_.empty());
    if (k < cap) alts.push_back(g_.seq({comma, m, after[size_t(k + 1)]}));
    if (k == cap && maxc < 0) {  // unbounded: any items
      after[size_t(k)] = g_.repeat(g_.seq({comma, g_.choice({m, nm})}), 0, -1);
      continue;
    }
    after[size_t(k)] = g_.seq({more_nm, g_.choice(std::move(alts))});
  }
  std::vector<int> body;
  if (minc <= 0) body.push_back(g_.empty());
  body.push_back(g_.seq({nm, after[0]}));
  if (cap >= 1) body.push_back(g_.seq({m, after[std::min<int64_t>(1, cap)]}));
  return g_.seq({tokws("["), g_.choice(std::move(body)), wstok("]")});
}

int SchemaCompiler::gen_object(const Json& s, const std::string& path, int depth) {
  std::vector<std::string> keys;
  std::vector<Json> schemas;
  std::vector<bool> declared;  // in `properties` (else only named by required/dependencies)
  Json addl = s.contains("additionalProperties") ? s["additionalProperties"] : Json(true);
  if (s.contains("properties")) {
    BELUGA_CHECK(s["properties"].is_object(), "properties at ", path, " must be an object");
    for (auto& [k, v] : s["properties"].items())
      keys.push_back(k), schemas.push_back(v), declared.push_back(true);
  }
  auto index_of = [&](const std::string& k) -> size_t {
    auto it = std::find(keys.begin(), keys.end(), k);
    if (it != keys.end()) return size_t(it - keys.begin());
    keys.push_back(k);
    schemas.push_back(addl);
    declared.push_back(false);
    return keys.size() - 1;
  };
  std::vector<bool> req;
  if (s.contains("required")) {
    BELUGA_CHECK(s["required"].is_array(), "required at ", path, " must be an array");
    for (auto& r : s["required"]) {
      BELUGA_CHECK(r.is_string(), "required at ", path, " must list strings");
      size_t i = index_of(r.get<std::string>());
      req.resize(keys.size(), false);
      req[i] = true;
    }
  }
  // Dependencies: a present key requires others (dependentRequired, or the array form of draft 4-7
  // `dependencies`); a dependent schema is taken only when it is true/{} (no effect) or false (the
  // key cannot be present).
  std::vector<std::pair<size_t, std::vector<size_t>>> deps;
  std::vector<size_t> banned;
  for (const char* kw : {"dependencies", "dependentRequired", "dependentSchemas"}) {
    if (!s.contains(kw)) continue;
    BELUGA_CHECK(s[kw].is_object(), kw, " at ", path, " must be an object");
    for (auto& [k, v] : s[kw].items()) {
      if (v.is_array() && std::string(kw) != "dependentSchemas") {
        if (v.empty()) continue;
        size_t t = index_of(k);
        std::vector<size_t> need;
        for (auto& x : v) {
          BELUGA_CHECK(x.is_string(), kw, " at ", path, " must list strings");
          need.push_back(index_of(x.get<std::string>()));
        }
        deps.push_back({t, need});
      } else if (std::string(kw) != "dependentRequired" && is_assertion_free(v)) {
        continue;
      } else if (std::string(kw) != "dependentRequired" && v.is_boolean()) {
        banned.push_back(index_of(k));
      } else {
        refuse(kw, path, "a dependent schema other than true, {} or false is not supported");
      }
    }
  }
  req.resize(keys.size(), false);
  size_t n = keys.size();
  // patternProperties and propertyNames: a key's schema is the conjunction of what applies to it.
  std::vector<std::pair<std::string, Json>> pats;
  if (s.contains("patternProperties")) {
    BELUGA_CHECK(s["patternProperties"].is_object(), "patternProperties at ", path, " must be an object");
    for (auto& [k, v] : s["patternProperties"].items()) pats.push_back({k, v});
  }
  Json pn = s.contains("propertyNames") ? s["propertyNames"] : Json(true);
  bool pn_free = is_assertion_free(pn);
  bool pn_none = pn.is_boolean() && !pn.get<bool>();
  if ((!pn_free && pn.dump().find("\"$ref\"") != std::string::npos))
    refuse("propertyNames", path, "a propertyNames schema with $ref is not supported");
  // Which declared keys each pattern matches, and whether each key is a valid name.
  std::vector<std::string> key_texts;
  for (auto& k : keys) key_texts.push_back(Json(k).dump());
  std::vector<std::vector<bool>> matches;
  for (auto& [p, v] : pats)
    matches.push_back(
        n ? accepts(gen_string(Json{{"pattern", p}}, join_path(path, "patternProperties")), key_texts)
          : std::vector<bool>());
  std::vector<bool> name_ok(n, !pn_none);
  if (!pn_free && !pn_none && n)
    name_ok = accepts(gen(pn, join_path(path, "propertyNames"), depth + 1), key_texts);
  for (size_t i = 0; i < n; ++i) {
    Json parts = Json::array();
    if (declared[i]) parts.push_back(schemas[i]);
    for (size_t j = 0; j < pats.size(); ++j)
      if (matches[j][i]) parts.push_back(pats[j].second);
    if (parts.empty()) parts.push_back(addl);  // additionalProperties applies: no name nor pattern
    if (!name_ok[i]) parts = Json::array({false});
    for (size_t b : banned)
      if (b == i) parts = Json::array({false});
    schemas[i] = parts.size() == 1 ? parts[0] : Json{{"allOf", parts}};
  }
  // The members whose key is none of the named ones: their key language and value.
  int add_key = -1, add_val = -1, add_member = -1;
  bool addl_false = addl.is_boolean() && !addl.get<bool>();
  bool pats_free = true;
  for (auto& [p, v] : pats) pats_free = pats_free && is_assertion_free(v);
  bool same_schema = true, named_match = false;
  for (size_t j = 0; j < pats.size(); ++j) {
    same_schema = same_schema && pats[j].second == pats[0].second;
    for (size_t i = 0; i < n; ++i) named_match = named_match || matches[j][i];
  }
  if (!pats.empty() && !(pats_free && is_assertion_free(addl)) && !pn_free)
    refuse("patternProperties", path, "patternProperties together with propertyNames is not supported");
  if (!pats.empty() && !(pats_free && is_assertion_free(addl)) && addl_false && same_schema && !named_match) {
    // The keys matching some pattern (no named key can): one string language, one schema.
    std::vector<int> alts;
    for (auto& [p, v] : pats)
      alts.push_back(gen_string(Json{{"pattern", p}}, join_path(path, "patternProperties")));
    add_key = g_.choice(std::move(alts));
    add_val = gen(pats[0].second, join_path(join_path(path, "patternProperties"), pats[0].first), depth + 1);
  } else if (!pats.empty() && !(pats_free && is_assertion_free(addl))) {
    // Keys by the set of patterns they match: none (additionalProperties), one, or several (all
    // their schemas).
    if (pats.size() > 4) refuse("patternProperties", path, "more than 4 patterns are not supported");
    std::vector<std::string> ps;
    for (auto& [p, v] : pats) ps.push_back(p);
    std::vector<int> members;
    for (auto& [c, keyexpr] : key_classes(ps, key_texts, path)) {
      Json parts = Json::array();
      for (size_t j = 0; j < pats.size(); ++j)
        if ((c >> j) & 1) parts.push_back(pats[j].second);
      if (c == 0) parts.push_back(addl);
      Json vs = parts.size() == 1 ? parts[0] : Json{{"allOf", parts}};
      if (vs.is_boolean() && !vs.get<bool>()) continue;
      int v = is_assertion_free(vs)
                  ? any_value()
                  : gen(vs, join_path(path, "patternProperties:" + std::to_string(c)), depth + 1);
      members.push_back(g_.seq({keyexpr, tokws(":"), v}));
    }
    if (!members.empty()) {
      int r = g_.add_rule(join_path(path, "patternProperties"));
      g_.define(r, g_.choice(std::move(members)));
      add_member = g_.ref(r);
    }
  } else if (!addl_false && !pn_none) {
    if (pn_free) {
      add_key = json_string_not_in(g_, keys, string_rest());
    } else if (n == 0) {
      add_key = gen(merge(pn, Json{{"type", "string"}}, path), join_path(path, "propertyNames"), depth + 1);
    } else if (pn.is_object() && (pn.contains("enum") || pn.contains("const"))) {
      // A finite key language: its values that are valid names, less the named keys.
      Json values = pn.contains("const") ? Json::array({pn["const"]}) : pn["enum"];
      std::vector<std::string> texts;
      std::vector<Json> cands;
      for (auto& v : values)
        if (v.is_string() && std::find(keys.begin(), keys.end(), v.get<std::string>()) == keys.end())
          cands.push_back(v), texts.push_back(v.dump());
      std::vector<bool> ok = accepts(gen(pn, join_path(path, "propertyNames"), depth + 1), texts);
      std::vector<int> alts;
      for (size_t i = 0; i < cands.size(); ++i)
        if (ok[i]) alts.push_back(lit(texts[i]));
      add_key = g_.choice(std::move(alts));
    } else {
      refuse("propertyNames", path,
             "propertyNames (other than enum/const) together with named properties and additional "
             "properties is not supported");
    }
    add_val =
        is_assertion_free(addl) ? any_value() : gen(addl, join_path(path, "additionalProperties"), depth + 1);
  }
  ObjState st;
  st.n = n;
  st.subset = n <= 5;
  st.req = req;
  if (!deps.empty() && !st.subset)
    refuse(s.contains("dependentRequired") ? "dependentRequired" : "dependencies", path,
           "dependencies in objects with more than 5 named keys are not supported");
  st.dep_mask.assign(n, 0);
  for (auto& [t, need] : deps)
    for (size_t k : need) st.dep_mask[t] |= uint32_t(1) << k;
  auto count = [&](const char* kw) -> int64_t {
    if (!s.contains(kw)) return -1;
    BELUGA_CHECK(s[kw].is_number() && s[kw].get<double>() >= 0, kw, " at ", path, " must be a number >= 0");
    return count_value(s[kw].get<double>(), true);
  };
  int64_t minp = count("minProperties"), maxp = count("maxProperties");
  if (minp > 0 || maxp >= 0) {
    if (maxp >= 0 && minp > maxp) return g_.nothing();
    st.min_p = std::max<int64_t>(minp, 0);
    st.max_p = maxp;
    st.cap = maxp >= 0 ? maxp : st.min_p;
    int64_t sigmas = st.subset ? (int64_t(1) << n) : int64_t(n) + 1;
    if (st.cap > 1000 || sigmas * (st.cap + 1) > 20000)
      refuse(maxp >= 0 ? "maxProperties" : "minProperties", path,
             "too many (named keys, member count) states to enforce the count exactly");
    st.track = true;
  }
  st.colon = tokws(":");
  st.comma = tokws(",");
  st.close = wstok("}");
  for (size_t i = 0; i < n; ++i) {
    st.key.push_back(lit(key_texts[i]));
    int v = gen(schemas[i], join_path(join_path(path, "properties"), keys[i]), depth + 1);
    st.val.push_back(v);
  }
  if (add_key >= 0) {
    // One rule for "an additional member": it appears in every state of the object.
    int r = g_.add_rule(join_path(path, "additionalProperties"));
    g_.define(r, g_.seq({add_key, st.colon, add_val}));
    st.add = g_.ref(r);
  }
  if (add_member >= 0) st.add = add_member;
  // Values used in many states become rules (one copy of their automaton).
  // Small ones (scalars) stay inline: a rule ending right after a number would make every token
  // that continues past the number "uncertain" (checked at mask time).
  if ((st.subset && n > 2) || st.track)
    for (size_t i = 0; i < n; ++i) {
      if (expr_size(st.val[i], 1500) < 1500) continue;
      int r = g_.add_rule(join_path(path, "properties") + "/" + keys[i]);
      g_.define(r, st.val[i]);
      st.val[i] = g_.ref(r);
    }
  uint32_t s0 = 0;
  std::vector<int> first;
  if (can_close(st, s0, 0)) first.push_back(st.close);
  if (st.add >= 0 && (!st.track || st.max_p != 0))
    first.push_back(g_.seq({st.add, g_.ref(t_rule(st, s0, st.next(0), path))}));
  first.push_back(d_expr(st, s0, 0, path));
  return g_.seq({tokws("{"), g_.choice(std::move(first))});
}

bool SchemaCompiler::can_close(const ObjState& st, uint32_t sigma, int64_t c) {
  if (st.track && c < st.min_p) return false;
  for (size_t k = 0; k < st.n; ++k) {
    if (st.req[k] && (st.subset ? !((sigma >> k) & 1) : k >= sigma)) return false;
    if (st.subset && ((sigma >> k) & 1) && (sigma & st.dep_mask[k]) != st.dep_mask[k]) return false;
  }
  return true;
}

// A declared member, then the rest of the object (c members so far).
int SchemaCompiler::d_expr(ObjState& st, uint32_t sigma, int64_t c, const std::string& path) {
  if (st.track && st.max_p >= 0 && c + 1 > st.max_p) return g_.nothing();
  std::vector<int> alts;
  for (size_t k = 0; k < st.n; ++k) {
    uint32_t next;
    if (st.subset) {
      if ((sigma >> k) & 1) continue;
      next = sigma | (uint32_t(1) << k);
    } else {
      if (k < sigma) continue;
      next = uint32_t(k + 1);
    }
    alts.push_back(g_.seq({st.key[k], st.colon, st.val[k], g_.ref(t_rule(st, next, st.next(c), path))}));
    if (!st.subset && st.req[k]) break;  // a required key cannot be skipped
  }
  return g_.choice(std::move(alts));
}

// After at least one member, in state (sigma, c): more additional members, then "}" or a declared
// member. Without a count to track, the additional members are a repetition inside the state.
int SchemaCompiler::t_rule(ObjState& st, uint32_t sigma, int64_t c, const std::string& path) {
  uint64_t id = uint64_t(sigma) | (uint64_t(c) << 32);
  auto it = st.t_rules.find(id);
  if (it != st.t_rules.end()) return it->second;
  tick();
  int r = g_.add_rule(path + "{" + std::to_string(sigma) + "," + std::to_string(c) + "}");
  st.t_rules[id] = r;
  std::vector<int> end;
  if (can_close(st, sigma, c)) end.push_back(st.close);
  end.push_back(g_.seq({st.comma, d_expr(st, sigma, c, path)}));
  int body;
  if (st.add >= 0 && st.track) {
    if (st.max_p < 0 || c + 1 <= st.max_p)
      end.push_back(g_.seq({st.comma, st.add, g_.ref(t_rule(st, sigma, st.next(c), path))}));
    body = g_.choice(std::move(end));
  } else {
    int tail = g_.choice(std::move(end));
    body = st.add >= 0 ? g_.seq({g_.repeat(g_.seq({st.comma, st.add}), 0, -1), tail}) : tail;
  }
  g_.define(r, body);
  return r;
}

// Expression nodes under e (shared ones counted each time, references as one), up to `cap`.
size_t SchemaCompiler::expr_size(int e, size_t cap) {
  size_t n = 0;
  std::vector<int> work = {e};
  while (!work.empty() && n < cap) {
    const Expr& x = g_.exprs[work.back()];
    work.pop_back();
    n += x.kind == ExprKind::kRepeat ? size_t(std::max(x.max, x.min) < 0 ? 1 : std::max(x.max, 1)) : 1;
    for (int k : x.kids) work.push_back(k);
  }
  return n;
}

}  // namespace beluga::grammar::detail
