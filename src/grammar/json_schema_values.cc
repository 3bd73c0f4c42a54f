#include <algorithm>
#include <cmath>
#include <memory>

#include "grammar/automaton.h"
#include "grammar/compiled.h"
#include "grammar/json_schema_compiler.h"
#include "grammar/matcher.h"
#include "util/error.h"

namespace beluga::grammar::detail {

int SchemaCompiler::gen_enum(const Json& s, const std::string& path, int depth) {
  std::vector<Json> values;
  if (s.contains("enum")) {
    BELUGA_CHECK(s["enum"].is_array(), "enum at ", path, " must be an array");
    for (auto& v : s["enum"]) values.push_back(v);
  }
  if (s.contains("const")) {
    if (s.contains("enum")) {
      bool found = false;
      for (auto& v : values) found = found || json_equal(v, s["const"]);
      values.clear();
      if (found) values.push_back(s["const"]);
    } else {
      values.push_back(s["const"]);
    }
  }
  Json rest = s;
  rest.erase("enum");
  rest.erase("const");
  if (s.contains(kNotIn)) {  // a complement of another enum/const: drop its values
    std::vector<Json> kept;
    for (auto& v : values)
      if (std::none_of(s[kNotIn].begin(), s[kNotIn].end(), [&](const Json& x) { return json_equal(x, v); }))
        kept.push_back(v);
    values = std::move(kept);
    rest.erase(kNotIn);
  }
  std::vector<int> alts;
  if (!is_assertion_free(rest)) {
    // Keep the values the rest of the schema accepts (checked with the rest's own grammar).
    int other = gen(rest, path, depth + 1);
    std::vector<std::string> texts;
    for (auto& v : values) texts.push_back(v.dump());
    std::vector<bool> ok = accepts(other, texts);
    std::vector<Json> kept;
    for (size_t i = 0; i < values.size(); ++i)
      if (ok[i]) kept.push_back(values[i]);
    values = std::move(kept);
  }
  for (auto& v : values) alts.push_back(value_expr(v, path));
  return g_.choice(std::move(alts));
}

std::shared_ptr<const CompiledGrammar> SchemaCompiler::probe_grammar(int expr) {
  Grammar probe = g_;
  for (auto& b : probe.rule_body)
    if (b < 0) b = probe.nothing();  // a rule still being defined (recursion): conservatively empty
  int r = probe.add_rule("probe");
  probe.define(r, expr);
  probe.root = r;
  auto cg = std::make_shared<CompiledGrammar>();
  cg->automaton = compile_automaton(probe);
  return cg;
}

std::vector<bool> SchemaCompiler::accepts(int expr, const std::vector<std::string>& texts) {
  auto cg = probe_grammar(expr);
  std::vector<bool> out;
  for (auto& t : texts) {
    Matcher m(cg);
    out.push_back(m.accept_bytes(t) && m.is_accepting());
  }
  return out;
}

bool SchemaCompiler::json_equal(const Json& a, const Json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!json_equal(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (auto& [k, v] : a.items())
      if (!b.contains(k) || !json_equal(v, b[k])) return false;
    return true;
  }
  return a == b;
}

// Every canonical spelling of a JSON value: numbers in all forms of the same value a serializer
// writes (1, 1.0), object members in any order.
int SchemaCompiler::value_expr(const Json& v, const std::string& path) {
  tick();
  if (v.is_number()) {
    double d = v.get<double>();
    if (v.is_number_integer() || v.is_number_unsigned() || (std::floor(d) == d && std::fabs(d) < 1e15)) {
      std::string digits = v.is_number_float() ? std::to_string(int64_t(d)) : v.dump();
      std::vector<int> alts = {
          g_.seq({lit(digits), g_.optional(g_.seq({lit("."), g_.repeat(lit("0"), 1, -1)}))})};
      if (v.is_number_float() && std::fabs(d) >= 1e15) alts.push_back(lit(v.dump()));
      return g_.choice(std::move(alts));
    }
    return lit(v.dump());
  }
  if (v.is_array()) {
    std::vector<int> parts = {tokws("[")};
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) parts.push_back(tokws(","));
      parts.push_back(value_expr(v[i], path));
    }
    parts.push_back(wstok("]"));
    return g_.seq(std::move(parts));
  }
  if (v.is_object()) {
    if (v.size() > 5) refuse("enum", path, "object values with more than 5 members are not supported");
    std::vector<std::string> keys;
    for (auto& [k, x] : v.items()) keys.push_back(k);
    std::vector<size_t> perm(keys.size());
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = i;
    std::vector<int> members;
    for (auto& k : keys) members.push_back(g_.seq({lit(Json(k).dump()), tokws(":"), value_expr(v[k], path)}));
    std::vector<int> alts;
    do {
      std::vector<int> parts = {tokws("{")};
      for (size_t i = 0; i < perm.size(); ++i) {
        if (i) parts.push_back(tokws(","));
        parts.push_back(members[perm[i]]);
      }
      parts.push_back(wstok("}"));
      alts.push_back(g_.seq(std::move(parts)));
    } while (std::next_permutation(perm.begin(), perm.end()));
    return g_.choice(std::move(alts));
  }
  return lit(v.dump());
}

}  // namespace beluga::grammar::detail
