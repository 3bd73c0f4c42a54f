#include <algorithm>

#include "grammar/json_schema_compiler.h"
#include "util/error.h"

namespace beluga::grammar::detail {

Json SchemaCompiler::deref(const Json& s, const std::string& path) {
  if (s.is_object() && s.contains("$ref") && s["$ref"].is_string()) {
    std::string ptr;
    const Json& t = resolve(s["$ref"].get<std::string>(), path, ptr);
    if (draft_ != Draft::k2020) return deref(t, path);
    Json rest = s;
    rest.erase("$ref");
    return is_assertion_free(rest) ? deref(t, path) : merge(rest, deref(t, path), path);
  }
  return s;
}

Json SchemaCompiler::merge(const Json& a0, const Json& b0, const std::string& path) {
  if (++merges_ > 10000) refuse("allOf", path, "merging subschemas does not terminate (recursive $ref?)");
  // not and if/then/else become allOf/anyOf first: an if of one part never meets another's then.
  Json a = lower(deref(a0, path), path), b = lower(deref(b0, path), path);
  if (a.is_boolean()) return a.get<bool>() ? b : a;
  if (b.is_boolean()) return b.get<bool>() ? a : b;
  BELUGA_CHECK(a.is_object() && b.is_object(), "subschemas at ", path, " must be objects or booleans");
  Json out = a;
  auto ap = [&](const Json& s) -> const Json* {
    return s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
  };
  for (auto& [k, bv] : b.items()) {
    if (!a.contains(k)) {
      out[k] = bv;
      continue;
    }
    const Json& av = a[k];
    if (k == "type") {
      std::set<std::string> ta = types_of(a, path), tb = types_of(b, path), t;
      for (auto& x : ta) {
        if (tb.count(x))
          t.insert(x);
        else if (x == "integer" && tb.count("number"))
          t.insert("integer");
        else if (x == "number" && tb.count("integer"))
          t.insert("integer");
      }
      out[k] = Json::array();
      for (auto& x : t) out[k].push_back(x);
    } else if (k == "required") {
      Json r = av;
      for (auto& x : bv)
        if (std::find(r.begin(), r.end(), x) == r.end()) r.push_back(x);
      out[k] = r;
    } else if (k == "properties") {
      continue;  // below, with additionalProperties
    } else if (k == "additionalProperties") {
      out[k] = Json{{"allOf", Json::array({av, bv})}};
    } else if (k == "minLength" || k == "minItems" || k == "minimum" || k == "minProperties") {
      out[k] = std::max(av.get<double>(), bv.get<double>());
    } else if (k == "maxLength" || k == "maxItems" || k == "maximum" || k == "maxProperties") {
      out[k] = std::min(av.get<double>(), bv.get<double>());
    } else if ((k == "exclusiveMinimum" || k == "exclusiveMaximum") && draft_ != Draft::k4) {
      out[k] = k == "exclusiveMinimum" ? std::max(av.get<double>(), bv.get<double>())
                                       : std::min(av.get<double>(), bv.get<double>());
    } else if (k == "enum") {
      Json e = Json::array();
      for (auto& x : av)
        for (auto& y : bv)
          if (json_equal(x, y)) {
            e.push_back(x);
            break;
          }
      out[k] = e;
    } else if (k == "const") {
      if (!json_equal(av, bv)) out["enum"] = Json::array();
    } else if (k == "allOf") {
      Json all = av;
      for (auto& x : bv) all.push_back(x);
      out[k] = all;
    } else if (k == "anyOf") {
      // (a1 or a2) and (b1 or b2): every pair.
      if (av.size() * bv.size() > 64)
        refuse("allOf", path, "combining two anyOf would need over 64 branches");
      Json pairs = Json::array();
      for (auto& x : av)
        for (auto& y : bv) pairs.push_back(Json{{"allOf", Json::array({x, y})}});
      out[k] = pairs;
    } else if (k == kNotIn) {
      Json all = av;
      for (auto& x : bv) all.push_back(x);
      out[k] = all;
    } else if (k == "uniqueItems") {
      out[k] = av.get<bool>() || bv.get<bool>();
    } else if (k == "items" && !av.is_array() && !bv.is_array()) {
      out[k] = Json{{"allOf", Json::array({av, bv})}};
    } else if (classify(k, draft_) == Kw::kIgnored) {
      continue;
    } else if (av == bv) {
      continue;
    } else {
      refuse("allOf", path, "cannot combine two subschemas that both use \"" + k + "\"");
    }
  }
  if (a.contains("minimum") && b.contains("minimum") && draft_ == Draft::k4 &&
      (a.value("exclusiveMinimum", false) != b.value("exclusiveMinimum", false)))
    refuse("allOf", path, "cannot combine draft-4 exclusiveMinimum flags");
  if (a.contains("maximum") && b.contains("maximum") && draft_ == Draft::k4 &&
      (a.value("exclusiveMaximum", false) != b.value("exclusiveMaximum", false)))
    refuse("allOf", path, "cannot combine draft-4 exclusiveMaximum flags");
  // A key one side names, or leaves to additionalProperties, may match the other side's patterns:
  // which schema applies to it is not expressible by combining the keywords.
  auto has_patterns = [](const Json& x) {
    return x.contains("patternProperties") && !x["patternProperties"].empty();
  };
  auto has_keys = [](const Json& x) {
    return x.contains("properties") || x.contains("additionalProperties");
  };
  if ((has_patterns(a) && has_keys(b)) || (has_patterns(b) && has_keys(a)))
    refuse("allOf", path, "cannot combine patternProperties with the other side's properties");
  if (a.contains("properties") || b.contains("properties")) {
    // A key declared on one side only is an "additional" property of the other side.
    Json props = Json::object();
    Json none = Json::object();
    const Json& pa = a.contains("properties") ? a["properties"] : none;
    const Json& pb = b.contains("properties") ? b["properties"] : none;
    const Json* aa = ap(a);
    const Json* ab = ap(b);
    auto side = [&](const Json& p, const Json* addl, const std::string& key) -> Json {
      if (p.contains(key)) return p[key];
      return addl ? *addl : Json(true);
    };
    for (auto& [k, v] : pa.items()) props[k] = Json{{"allOf", Json::array({v, side(pb, ab, k)})}};
    for (auto& [k, v] : pb.items())
      if (!pa.contains(k)) props[k] = Json{{"allOf", Json::array({side(pa, aa, k), v})}};
    out["properties"] = props;
  }
  if (a.contains("items") && b.contains("items") && (a["items"].is_array() || b["items"].is_array()))
    refuse("allOf", path, "cannot combine two subschemas that both use \"items\"");
  return out;
}

// oneOf is enforced as a choice only when its branches cannot match the same value.
void SchemaCompiler::check_exclusive(const std::vector<Json>& branches, const std::string& path) {
  struct Info {
    std::set<std::string> types;
    std::optional<std::vector<Json>> values;
  };
  std::vector<Info> info;
  for (auto& b0 : branches) {
    Json b = deref(b0, path);
    Info in;
    if (b.is_boolean()) {
      if (b.get<bool>()) in.types = types_of(Json::object(), path);
    } else {
      in.types = types_of(b, path);
      if (in.types.count("number")) in.types.insert("integer");
      std::vector<Json> vals;
      bool has = false;
      if (b.contains("enum")) has = true, vals.assign(b["enum"].begin(), b["enum"].end());
      if (b.contains("const")) has = true, vals = {b["const"]};
      if (has) in.values = vals;
    }
    info.push_back(std::move(in));
  }
  for (size_t i = 0; i < info.size(); ++i)
    for (size_t j = i + 1; j < info.size(); ++j) {
      bool overlap = false;
      for (auto& t : info[i].types) overlap = overlap || info[j].types.count(t);
      if (!overlap) continue;
      if (info[i].values && info[j].values) {
        bool same = false;
        for (auto& x : *info[i].values)
          for (auto& y : *info[j].values) same = same || json_equal(x, y);
        if (!same) continue;
      }
      refuse("oneOf", path,
             "branches " + std::to_string(i) + " and " + std::to_string(j) +
                 " may match the same value (exclusivity cannot be enforced)");
    }
}

}  // namespace beluga::grammar::detail
