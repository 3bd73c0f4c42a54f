#include <algorithm>
#include <functional>

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
  if (s.contains("minItems")) min = int64_t(s["minItems"].get<double>());
  if (s.contains("maxItems")) max = int64_t(s["maxItems"].get<double>());
  if (rest->is_boolean() && !rest->get<bool>())
    max = max < 0 ? int64_t(prefix.size()) : std::min<int64_t>(max, prefix.size());
  if (max >= 0 && max < min) return g_.nothing();
  if (min > 100000 || max > 100000) refuse("maxItems", path, "item counts above 100000 are not supported");
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

int SchemaCompiler::gen_object(const Json& s, const std::string& path, int depth) {
  std::vector<std::string> keys;
  std::vector<const Json*> schemas;
  Json true_schema = true;
  const Json* addl = &true_schema;
  if (s.contains("additionalProperties")) addl = &s["additionalProperties"];
  if (s.contains("properties")) {
    BELUGA_CHECK(s["properties"].is_object(), "properties at ", path, " must be an object");
    for (auto& [k, v] : s["properties"].items()) keys.push_back(k), schemas.push_back(&v);
  }
  std::vector<bool> req(keys.size(), false);
  if (s.contains("required")) {
    BELUGA_CHECK(s["required"].is_array(), "required at ", path, " must be an array");
    for (auto& r : s["required"]) {
      BELUGA_CHECK(r.is_string(), "required at ", path, " must list strings");
      std::string k = r.get<std::string>();
      auto it = std::find(keys.begin(), keys.end(), k);
      if (it == keys.end()) {
        keys.push_back(k);
        schemas.push_back(addl);
        req.push_back(true);
      } else {
        req[it - keys.begin()] = true;
      }
    }
  }
  size_t n = keys.size();
  bool addl_ok = !(addl->is_boolean() && !addl->get<bool>());
  ObjState st;
  st.n = n;
  st.subset = n <= 5;
  st.req = req;
  st.colon = tokws(":");
  st.comma = tokws(",");
  st.close = wstok("}");
  for (size_t i = 0; i < n; ++i) {
    st.key.push_back(lit(Json(keys[i]).dump()));
    int v = gen(*schemas[i], join_path(join_path(path, "properties"), keys[i]), depth + 1);
    st.val.push_back(v);
  }
  if (addl_ok) {
    int v =
        addl == &true_schema ? any_value() : gen(*addl, join_path(path, "additionalProperties"), depth + 1);
    // One rule for "an additional member": it appears in every state of the object.
    int r = g_.add_rule(join_path(path, "additionalProperties"));
    g_.define(r, g_.seq({json_string_not_in(g_, keys, string_rest()), st.colon, v}));
    st.add = g_.ref(r);
  }
  // Values used in many states become rules (one copy of their automaton).
  // Small ones (scalars) stay inline: a rule ending right after a number would make every token
  // that continues past the number "uncertain" (checked at mask time).
  if (st.subset && n > 2)
    for (size_t i = 0; i < n; ++i) {
      if (expr_size(st.val[i], 1500) < 1500) continue;
      int r = g_.add_rule(join_path(path, "properties") + "/" + keys[i]);
      g_.define(r, st.val[i]);
      st.val[i] = g_.ref(r);
    }
  uint32_t s0 = 0;
  std::vector<int> first;
  if (can_close(st, s0)) first.push_back(st.close);
  if (st.add >= 0) first.push_back(g_.seq({st.add, g_.ref(t_rule(st, s0, path))}));
  first.push_back(d_expr(st, s0, path));
  return g_.seq({tokws("{"), g_.choice(std::move(first))});
}

bool SchemaCompiler::can_close(const ObjState& st, uint32_t sigma) {
  for (size_t k = 0; k < st.n; ++k) {
    if (!st.req[k]) continue;
    if (st.subset ? !((sigma >> k) & 1) : k >= sigma) return false;
  }
  return true;
}

// A declared member, then the rest of the object.
int SchemaCompiler::d_expr(ObjState& st, uint32_t sigma, const std::string& path) {
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
    alts.push_back(g_.seq({st.key[k], st.colon, st.val[k], g_.ref(t_rule(st, next, path))}));
    if (!st.subset && st.req[k]) break;  // a required key cannot be skipped
  }
  return g_.choice(std::move(alts));
}

// After at least one member, in state sigma: more additional members, then "}" or a declared member.
int SchemaCompiler::t_rule(ObjState& st, uint32_t sigma, const std::string& path) {
  auto it = st.t_rules.find(sigma);
  if (it != st.t_rules.end()) return it->second;
  tick();
  int r = g_.add_rule(path + "{" + std::to_string(sigma) + "}");
  st.t_rules[sigma] = r;
  std::vector<int> end;
  if (can_close(st, sigma)) end.push_back(st.close);
  end.push_back(g_.seq({st.comma, d_expr(st, sigma, path)}));
  int tail = g_.choice(std::move(end));
  int body = st.add >= 0 ? g_.seq({g_.repeat(g_.seq({st.comma, st.add}), 0, -1), tail}) : tail;
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
