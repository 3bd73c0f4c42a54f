// `not` and `if`/`then`/`else` as schemas the rest of the compiler builds exactly. A schema is the
// conjunction of its keywords ("clauses", each of which only constrains values of its own type), so
// its complement is the disjunction of the clauses' complements (de Morgan), each written as a schema:
// `type` -> the other types (a non-integral number when `integer` is excluded, kNonIntegral), bounds ->
// the numbers beyond them, length/count bounds -> the opposite bound, `required` -> an object without
// one of the keys, `properties` -> an object whose key holds the complement, `items` <-> `contains`,
// `enum`/`const` -> kNotIn, `allOf` <-> `anyOf`, `not` -> its subschema. Everything else is refused.
// if/then/else is anyOf [allOf (if, then), allOf (not if, else)]; a dependent schema S of key k is
// anyOf [k absent, allOf (k required, S)].
#include <cmath>

#include "grammar/json_schema_compiler.h"
#include "util/error.h"

namespace beluga::grammar::detail {

// A dependent schema S of key k (other than true/{}/false, which gen_object takes): k absent, or
// present and S holds.
bool SchemaCompiler::dependent_schemas(const Json& s, Json* rest, Json* parts) {
  bool any = false;
  for (const char* kw : {"dependencies", "dependentSchemas"}) {
    if (!s.contains(kw) || !s[kw].is_object()) continue;
    for (auto& [k, v] : s[kw].items()) {
      if (v.is_array() || v.is_boolean() || is_assertion_free(v)) continue;
      any = true;
      if (!rest) continue;
      (*rest)[kw].erase(k);
      parts->push_back(
          Json{{"anyOf", Json::array({Json{{"properties", Json{{k, false}}}},
                                      Json{{"required", Json::array({k})}, {"allOf", Json::array({v})}}})}});
    }
    if (rest && (*rest)[kw].empty()) rest->erase(kw);
  }
  return any;
}

Json SchemaCompiler::lower(const Json& s, const std::string& path) {
  if (!s.is_object() || !(s.contains("not") || s.contains("if") || s.contains("then") || s.contains("else") ||
                          dependent_schemas(s, nullptr, nullptr)))
    return s;
  Json rest = s;
  for (const char* k : {"not", "if", "then", "else"}) rest.erase(k);
  Json deps = Json::array();
  dependent_schemas(s, &rest, &deps);
  Json parts = Json::array({rest});
  for (auto& d : deps) parts.push_back(d);
  if (s.contains("not")) parts.push_back(negate(s["not"], join_path(path, "not"), 0));
  if (s.contains("if") && (s.contains("then") || s.contains("else"))) {
    if (draft_ == Draft::k4 || draft_ == Draft::k6)
      refuse("if", path, std::string("not a keyword of ") + draft_name(draft_));
    const Json& cond = s["if"];
    Json yes = Json::array({cond}), no;
    try {
      no = Json::array({negate(cond, join_path(path, "if"), 0)});
    } catch (const Refused& r) {  // the else branch needs the complement of if
      throw Refused("if", "if at " + path + " (the other branch needs its complement): " + r.what());
    }
    if (s.contains("then")) yes.push_back(s["then"]);
    if (s.contains("else")) no.push_back(s["else"]);
    parts.push_back(Json{{"anyOf", Json::array({Json{{"allOf", yes}}, Json{{"allOf", no}}})}});
  }
  return parts.size() == 1 ? rest : Json{{"allOf", parts}};
}

Json SchemaCompiler::negate(const Json& s0, const std::string& path, int depth) {
  // A recursive $ref has no finite complement; a branching one would take exponential time.
  if (depth > 32 || ++negations_ > 10000)
    refuse("not", path, "negations nest too deeply (a recursive $ref?)");
  tick();
  Json s = deref(s0, path);
  if (s.is_boolean()) return !s.get<bool>();
  BELUGA_CHECK(s.is_object(), "schema at ", path, " must be an object or a boolean");
  const std::set<std::string> all = {"null", "boolean", "integer", "number", "string", "array", "object"};
  Json any = Json::array();  // the complement: some clause fails
  auto typed = [](const char* t, Json x) {
    x["type"] = t;
    return x;
  };
  // A numeric bound's complement: the numbers on the other side.
  auto beyond = [&](const Bound& b, bool lower_bound) {
    const char* kw = lower_bound ? "maximum" : "minimum";
    const char* xkw = lower_bound ? "exclusiveMaximum" : "exclusiveMinimum";
    Json x = Json{{"type", "number"}};
    if (draft_ == Draft::k4) {
      x[kw] = *b.v;
      if (!b.excl) x[xkw] = true;
    } else {
      x[b.excl ? kw : xkw] = *b.v;
    }
    return x;
  };
  bool bounds_done = false;
  for (auto& [k, v] : s.items()) {
    const std::string kpath = join_path(path, k);
    if (classify(k, draft_) == Kw::kOtherDraft)
      refuse(k, path, std::string("not a keyword of ") + draft_name(draft_));
    if (k == "type") {
      std::set<std::string> t = types_of(s, path), other = all;
      for (auto& x : t) other.erase(x);
      if (t.count("number")) other.erase("integer");
      Json ty = Json::array();
      for (auto& x : other)
        if (x != "integer") ty.push_back(x);
      Json x = Json{{"type", ty}};
      if (t.count("integer") && !t.count("number")) x[kNonIntegral] = true;  // "number" is among ty
      if (!x["type"].empty()) any.push_back(x);
    } else if (k == "enum" || k == kNotIn) {
      BELUGA_CHECK(v.is_array(), k, " at ", path, " must be an array");
      any.push_back(Json{{k == "enum" ? kNotIn : "enum", v}});
    } else if (k == "const") {
      any.push_back(Json{{kNotIn, Json::array({v})}});
    } else if (k == kNonIntegral) {
      any.push_back(Json{{"type", "integer"}});
    } else if (k == "minimum" || k == "maximum" || k == "exclusiveMinimum" || k == "exclusiveMaximum") {
      if (bounds_done) continue;
      bounds_done = true;
      Bound lo = bound(s, true, path), hi = bound(s, false, path);
      if (lo.v) any.push_back(beyond(lo, true));
      if (hi.v) any.push_back(beyond(hi, false));
    } else if (k == "minLength" || k == "minItems" || k == "minProperties") {
      int64_t n = count_value(v.get<double>(), true);
      const char* t = k == "minLength" ? "string" : k == "minItems" ? "array" : "object";
      std::string opposite = "max" + k.substr(3);
      if (n > 0) any.push_back(typed(t, Json{{opposite, n - 1}}));
    } else if (k == "maxLength" || k == "maxItems" || k == "maxProperties") {
      int64_t n = count_value(v.get<double>(), false);
      const char* t = k == "maxLength" ? "string" : k == "maxItems" ? "array" : "object";
      any.push_back(typed(t, Json{{"min" + k.substr(3), n + 1}}));
    } else if (k == "required") {
      BELUGA_CHECK(v.is_array(), "required at ", path, " must be an array");
      for (auto& r : v) {
        BELUGA_CHECK(r.is_string(), "required at ", path, " must list strings");
        any.push_back(typed("object", Json{{"properties", Json{{r.get<std::string>(), false}}}}));
      }
    } else if (k == "properties") {
      if (s.contains("additionalProperties") || s.contains("patternProperties"))
        refuse("not", path, "not of properties together with additionalProperties/patternProperties");
      BELUGA_CHECK(v.is_object(), "properties at ", path, " must be an object");
      for (auto& [key, sub] : v.items()) {
        Json n = negate(sub, join_path(kpath, key), depth + 1);
        if (n.is_boolean() && !n.get<bool>()) continue;  // every value of the key passes
        any.push_back(
            typed("object", Json{{"required", Json::array({key})}, {"properties", Json{{key, n}}}}));
      }
    } else if (k == "items" && !v.is_array() && !s.contains("prefixItems")) {
      Json n = negate(v, kpath, depth + 1);
      if (!(n.is_boolean() && !n.get<bool>())) any.push_back(typed("array", Json{{"contains", n}}));
    } else if (k == "contains" && !s.contains("minContains") && !s.contains("maxContains")) {
      any.push_back(typed("array", Json{{"items", negate(v, kpath, depth + 1)}}));
    } else if (k == "not") {
      any.push_back(v);
    } else if (k == "allOf" || k == "anyOf") {
      BELUGA_CHECK(v.is_array() && !v.empty(), k, " at ", path, " must be a non-empty array");
      Json ns = Json::array();
      for (size_t i = 0; i < v.size(); ++i)
        ns.push_back(negate(v[i], join_path(kpath, std::to_string(i)), depth + 1));
      if (k == "allOf")
        for (auto& n : ns) any.push_back(n);
      else
        any.push_back(Json{{"allOf", ns}});
    } else if (k == "if") {
      if (!s.contains("then") && !s.contains("else")) continue;
      if (draft_ == Draft::k4 || draft_ == Draft::k6)
        refuse("if", path, std::string("not a keyword of ") + draft_name(draft_));
      // not (if -> then, else) = (if and not then) or (not if and not else)
      if (s.contains("then"))
        any.push_back(
            Json{{"allOf", Json::array({v, negate(s["then"], join_path(path, "then"), depth + 1)})}});
      if (s.contains("else"))
        any.push_back(Json{{"allOf", Json::array({negate(v, kpath, depth + 1),
                                                  negate(s["else"], join_path(path, "else"), depth + 1)})}});
    } else if (k == "uniqueItems" && v.is_boolean() && !v.get<bool>()) {
      continue;
    } else if (k == "then" || k == "else" || classify(k, draft_) == Kw::kIgnored) {
      continue;  // annotations; then/else were taken with if
    } else {
      refuse("not", path, "not of a schema using \"" + k + "\" is not supported");
    }
  }
  if (any.empty()) return false;
  if (any.size() == 1) return any[0];
  return Json{{"anyOf", any}};
}

}  // namespace beluga::grammar::detail
