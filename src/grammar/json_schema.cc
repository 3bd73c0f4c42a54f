#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "grammar/json_schema_compiler.h"
#include "grammar/json_string.h"
#include "grammar/refused.h"
#include "util/error.h"

namespace beluga::grammar {

std::optional<Draft> parse_draft(std::string_view s) {
  if (s == "4" || s == "draft-04" || s == "draft4") return Draft::k4;
  if (s == "6" || s == "draft-06" || s == "draft6") return Draft::k6;
  if (s == "7" || s == "draft-07" || s == "draft7") return Draft::k7;
  if (s == "2020-12" || s == "2020" || s == "draft2020-12") return Draft::k2020;
  return std::nullopt;
}

Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options) {
  try {
    return detail::SchemaCompiler(schema, options).run();
  } catch (const nlohmann::json::exception& e) {
    // A keyword whose value has the wrong JSON type (e.g. "minLength": "3").
    fail("not a valid schema: ", e.what());
  }
}

namespace detail {

namespace {

std::optional<Draft> draft_of_uri(std::string s) {
  while (!s.empty() && (s.back() == '#')) s.pop_back();
  if (s == "http://json-schema.org/draft-04/schema" || s == "https://json-schema.org/draft-04/schema")
    return Draft::k4;
  if (s == "http://json-schema.org/draft-06/schema" || s == "https://json-schema.org/draft-06/schema")
    return Draft::k6;
  if (s == "http://json-schema.org/draft-07/schema" || s == "https://json-schema.org/draft-07/schema")
    return Draft::k7;
  if (s == "https://json-schema.org/draft/2020-12/schema" ||
      s == "http://json-schema.org/draft/2020-12/schema")
    return Draft::k2020;
  return std::nullopt;
}

}  // namespace

const char* draft_name(Draft d) {
  switch (d) {
    case Draft::k4:
      return "draft 4";
    case Draft::k6:
      return "draft 6";
    case Draft::k7:
      return "draft 7";
    case Draft::k2020:
      return "draft 2020-12";
  }
  return "?";
}

Kw classify(const std::string& k, Draft d) {
  static const std::set<std::string> enforced_all = {"type",
                                                     "enum",
                                                     "properties",
                                                     "required",
                                                     "additionalProperties",
                                                     "items",
                                                     "minItems",
                                                     "maxItems",
                                                     "minLength",
                                                     "maxLength",
                                                     "minimum",
                                                     "maximum",
                                                     "exclusiveMinimum",
                                                     "exclusiveMaximum",
                                                     "allOf",
                                                     "anyOf",
                                                     "oneOf",
                                                     "$ref",
                                                     "format",
                                                     "pattern",
                                                     "multipleOf",
                                                     "minProperties",
                                                     "maxProperties",
                                                     "propertyNames",
                                                     "patternProperties",
                                                     "dependencies",
                                                     "dependentRequired",
                                                     "dependentSchemas",
                                                     "contains",
                                                     "minContains",
                                                     "maxContains",
                                                     "not",
                                                     "if",
                                                     "uniqueItems"};
  static const std::set<std::string> ignored = {"$schema",
                                                "$id",
                                                "$defs",
                                                "definitions",
                                                "title",
                                                "description",
                                                "default",
                                                "examples",
                                                "$comment",
                                                "readOnly",
                                                "writeOnly",
                                                "deprecated",
                                                "contentEncoding",
                                                "contentMediaType",
                                                "contentSchema",
                                                "$anchor",
                                                "$vocabulary",
                                                "then",
                                                "else"};
  static const std::set<std::string> refused = {"unevaluatedProperties", "unevaluatedItems",
                                                "$dynamicRef",           "$dynamicAnchor",
                                                "$recursiveRef",         "$recursiveAnchor"};
  if (enforced_all.count(k) || k == kNotIn || k == kNonIntegral) return Kw::kEnforced;
  if (k == "const") return d == Draft::k4 ? Kw::kOtherDraft : Kw::kEnforced;
  if (k == "prefixItems") return d == Draft::k2020 ? Kw::kEnforced : Kw::kOtherDraft;
  if (k == "additionalItems") return d == Draft::k2020 ? Kw::kOtherDraft : Kw::kEnforced;
  if (k == "id") return d == Draft::k4 ? Kw::kIgnored : Kw::kOtherDraft;
  if (ignored.count(k)) return Kw::kIgnored;
  if (refused.count(k)) return Kw::kRefused;
  return Kw::kIgnored;  // unknown keywords have no effect (annotations)
}

bool is_assertion_free(const Json& s) {
  if (s.is_boolean()) return s.get<bool>();
  for (auto& [k, v] : s.items()) {
    if (k == "$schema" || k == "$id" || k == "id" || k == "$defs" || k == "definitions" || k == "title" ||
        k == "description" || k == "default" || k == "examples" || k == "$comment")
      continue;
    return false;
  }
  return true;
}

SchemaCompiler::SchemaCompiler(const Json& root, const JsonSchemaOptions& o) : root_(root), opt_(o) {
  draft_ = Draft::k2020;
  if (root.is_object() && root.contains("$schema")) {
    BELUGA_CHECK(root["$schema"].is_string(), "$schema must be a string");
    auto d = draft_of_uri(root["$schema"].get<std::string>());
    if (!d && !o.draft)
      throw Refused("$schema", "$schema: unsupported draft " + root["$schema"].get<std::string>());
    if (d) draft_ = *d;
  }
  if (o.draft) draft_ = *o.draft;
  std::function<void(const Json&)> reserved = [&](const Json& x) {
    if (x.is_array())
      for (auto& y : x) reserved(y);
    if (!x.is_object()) return;
    for (auto& [k, v] : x.items()) {
      if (k.rfind("$beluga:", 0) == 0) throw Refused(k, k + ": a keyword reserved for the compiler");
      reserved(v);
    }
  };
  reserved(root);
  has_ref_ = root.dump().find("\"$ref\"") != std::string::npos;
  ws_ = o.max_whitespace > 0 ? g_.repeat(g_.bytes(ByteSet::of(" \t\n\r")), 0, o.max_whitespace) : -1;
}

Grammar SchemaCompiler::run() {
  int root_rule = g_.add_rule("root");
  g_.root = root_rule;
  in_progress_.insert("#");
  int body = gen(root_, "#", 0);
  in_progress_.erase("#");
  g_.define(root_rule, body);
  return std::move(g_);
}

const Json& SchemaCompiler::resolve(const std::string& ref, const std::string& path, std::string& ptr_out) {
  if (ref.empty() || ref[0] != '#')
    refuse("$ref", path, "only references within the schema (\"#...\") are supported, not \"" + ref + "\"");
  if (ref.size() > 1 && ref[1] != '/')
    refuse("$ref", path, "anchor references (\"" + ref + "\") are not supported");
  // Percent-decoding, then JSON pointer unescaping.
  std::string dec;
  for (size_t i = 1; i < ref.size(); ++i) {
    if (ref[i] == '%' && i + 2 < ref.size() + 0 && isxdigit(uint8_t(ref[i + 1])) &&
        isxdigit(uint8_t(ref[i + 2]))) {
      dec += char(std::stoi(ref.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      dec += ref[i];
    }
  }
  ptr_out = "#" + dec;
  const Json* cur = &root_;
  size_t i = 0;
  while (i < dec.size()) {
    size_t j = dec.find('/', i + 1);
    if (j == std::string::npos) j = dec.size();
    std::string tok = dec.substr(i + 1, j - i - 1), key;
    for (size_t k = 0; k < tok.size(); ++k) {
      if (tok[k] == '~' && k + 1 < tok.size() && tok[k + 1] == '1')
        key += '/', ++k;
      else if (tok[k] == '~' && k + 1 < tok.size() && tok[k + 1] == '0')
        key += '~', ++k;
      else
        key += tok[k];
    }
    if (cur->is_object() && cur->contains(key)) {
      cur = &(*cur)[key];
    } else if (cur->is_array() && !key.empty() && key.find_first_not_of("0123456789") == std::string::npos &&
               std::stoul(key) < cur->size()) {
      cur = &(*cur)[std::stoul(key)];
    } else {
      fail("$ref at ", path, ": \"", ref, "\" does not resolve within the schema");
    }
    i = j;
  }
  return *cur;
}

int SchemaCompiler::gen(const Json& s, const std::string& path, int depth) {
  tick();
  if (depth > 200) refuse("$ref", path, "references nest too deeply (recursion through allOf/anyOf?)");
  if (s.is_boolean()) return s.get<bool>() ? any_value() : g_.nothing();
  BELUGA_CHECK(s.is_object(), "schema at ", path, " must be an object or a boolean");

  if (s.contains("$ref")) {
    BELUGA_CHECK(s["$ref"].is_string(), "$ref at ", path, " must be a string");
    std::string ref = s["$ref"].get<std::string>();
    if (draft_ != Draft::k2020) return gen_ref(ref, path, depth);  // siblings of $ref are ignored
    Json rest = s;
    rest.erase("$ref");
    if (is_assertion_free(rest)) return gen_ref(ref, path, depth);
    std::string ptr;
    const Json& target = resolve(ref, path, ptr);
    if (in_progress_.count(ptr))
      refuse("$ref", path, "a recursive $ref with sibling keywords is not supported");
    return gen(merge(rest, target, path), path, depth + 1);
  }

  if (s.contains("not") || s.contains("if") || s.contains("then") || s.contains("else") ||
      dependent_schemas(s, nullptr, nullptr)) {
    for (auto& [k, v] : s.items())
      if (classify(k, draft_) == Kw::kRefused) refuse(k, path, "this keyword is not supported");
    return gen(lower(s, path), path, depth + 1);  // lower() drops these keywords: no loop
  }
  for (auto& [k, v] : s.items()) {
    switch (classify(k, draft_)) {
      case Kw::kEnforced:
      case Kw::kIgnored:
        break;
      case Kw::kOtherDraft:
        refuse(k, path, std::string("not a keyword of ") + draft_name(draft_));
      case Kw::kRefused:
        refuse(k, path, "this keyword is not supported");
    }
  }
  if (path != "#" &&
      ((s.contains("$id") && s["$id"].is_string()) ||
       (draft_ == Draft::k4 && s.contains("id") && s["id"].is_string())) &&
      has_ref_)
    refuse("$id", path, "a nested $id (a new base URI for references) is not supported");

  if (s.contains("allOf")) {
    const Json& all = s["allOf"];
    BELUGA_CHECK(all.is_array() && !all.empty(), "allOf at ", path, " must be a non-empty array");
    Json merged = s;
    merged.erase("allOf");
    for (size_t i = 0; i < all.size(); ++i) merged = merge(merged, all[i], join_path(path, "allOf"));
    return gen(merged, path, depth + 1);
  }
  if (s.contains("anyOf") || s.contains("oneOf")) {
    bool one = !s.contains("anyOf");
    const char* kw = one ? "oneOf" : "anyOf";
    const Json& br = s[kw];
    BELUGA_CHECK(br.is_array() && !br.empty(), kw, " at ", path, " must be a non-empty array");
    Json rest = s;
    rest.erase(kw);
    bool plain = is_assertion_free(rest);
    std::vector<Json> branches;
    for (size_t i = 0; i < br.size(); ++i)
      branches.push_back(plain ? br[i] : merge(rest, br[i], join_path(path, kw)));
    if (one) {
      try {
        check_exclusive(branches, path);
      } catch (const Refused& r) {
        // Branches that may overlap: exactly one matches, i.e. branch i and the complement of every
        // other one (disjoint by construction), when those complements can be built.
        if (br.size() > 4) throw;
        std::vector<Json> negs;
        try {
          for (size_t i = 0; i < br.size(); ++i)
            negs.push_back(negate(br[i], join_path(join_path(path, kw), std::to_string(i)), 0));
        } catch (const Refused&) {
          throw r;
        }
        for (size_t i = 0; i < br.size(); ++i) {
          Json parts = Json::array({branches[i]});
          for (size_t j = 0; j < br.size(); ++j)
            if (j != i) parts.push_back(negs[j]);
          branches[i] = Json{{"allOf", parts}};
        }
      }
    }
    std::vector<int> alts;
    for (size_t i = 0; i < branches.size(); ++i)
      alts.push_back(gen(branches[i], join_path(join_path(path, kw), std::to_string(i)), depth + 1));
    return g_.choice(std::move(alts));
  }
  if (s.contains("enum") || s.contains("const")) return gen_enum(s, path, depth);
  return gen_types(s, path, depth);
}

int SchemaCompiler::gen_ref(const std::string& ref, const std::string& path, int depth) {
  std::string ptr;
  const Json& target = resolve(ref, path, ptr);
  auto it = ref_rule_.find(ptr);
  if (it != ref_rule_.end()) return g_.ref(it->second);
  if (in_progress_.count(ptr) || ++expansions_[ptr] > 4) {
    // Recursive (or used often): a rule of its own.
    int r = g_.add_rule("ref:" + ptr);
    ref_rule_[ptr] = r;
    bool fresh = in_progress_.insert(ptr).second;
    int body = gen(target, ptr, depth + 1);
    if (fresh) in_progress_.erase(ptr);
    g_.define(r, body);
    return g_.ref(r);
  }
  in_progress_.insert(ptr);
  int e = gen(target, ptr, depth + 1);
  in_progress_.erase(ptr);
  return e;
}

std::set<std::string> SchemaCompiler::types_of(const Json& s, const std::string& path) {
  std::set<std::string> all = {"null", "boolean", "integer", "number", "string", "array", "object"};
  if (!s.contains("type")) return all;
  const Json& t = s["type"];
  std::set<std::string> out;
  auto add = [&](const Json& x) {
    BELUGA_CHECK(x.is_string() && all.count(x.get<std::string>()), "type at ", path, ": unknown type ",
                 x.dump());
    out.insert(x.get<std::string>());
  };
  if (t.is_array())
    for (auto& x : t) add(x);
  else
    add(t);
  return out;
}

int SchemaCompiler::gen_types(const Json& s, const std::string& path, int depth) {
  std::set<std::string> types = types_of(s, path);
  // kNotIn (a complement of enum/const): its values are taken out of each type's language.
  std::vector<Json> out;
  if (s.contains(kNotIn))
    for (auto& v : s[kNotIn]) out.push_back(v);
  auto excluded = [&](const Json& v) {
    return std::any_of(out.begin(), out.end(), [&](const Json& x) { return json_equal(x, v); });
  };
  std::vector<double> nums;
  std::vector<std::string> strs;
  bool containers = false;
  for (auto& v : out) {
    if (v.is_number()) nums.push_back(v.get<double>());
    if (v.is_string()) strs.push_back(v.get<std::string>());
    containers = containers || v.is_array() || v.is_object();
  }
  std::vector<int> alts;
  if (types.count("null") && !excluded(nullptr)) alts.push_back(lit("null"));
  if (types.count("boolean")) {
    std::vector<int> b;
    if (!excluded(true)) b.push_back(lit("true"));
    if (!excluded(false)) b.push_back(lit("false"));
    alts.push_back(g_.choice(std::move(b)));
  }
  bool integer = !types.count("number");
  if ((types.count("number") || types.count("integer")) && !(integer && s.contains(kNonIntegral)))
    alts.push_back(nums.empty() ? gen_number(s, path, integer) : gen_number_not_in(s, nums, path, integer));
  if (types.count("string")) {
    if (strs.empty()) {
      alts.push_back(gen_string(s, path));
    } else {
      for (const char* k : {"minLength", "maxLength", "pattern", "format"})
        if (s.contains(k))
          refuse("not", path,
                 std::string("excluding string values together with ") + k + " is not supported");
      alts.push_back(json_string_not_in(g_, strs, string_rest()));
    }
  }
  if (containers && (types.count("array") || types.count("object")))
    refuse("not", path, "excluding array or object values (not of enum/const) is not supported");
  if (types.count("array")) alts.push_back(gen_array(s, path, depth));
  if (types.count("object")) alts.push_back(gen_object(s, path, depth));
  return g_.choice(std::move(alts));
}

// Any JSON value: scalars inline, containers through one recursive rule that ends at ] or }.
int SchemaCompiler::any_value() {
  if (any_container_ < 0) {
    any_container_ = g_.add_rule("any-container");
    int v = any_inline();
    int member = g_.seq({string_expr(0, -1), tokws(":"), v});
    int arr =
        g_.seq({tokws("["), g_.optional(g_.seq({v, g_.repeat(g_.seq({tokws(","), v}), 0, -1)})), wstok("]")});
    int obj =
        g_.seq({tokws("{"), g_.optional(g_.seq({member, g_.repeat(g_.seq({tokws(","), member}), 0, -1)})),
                wstok("}")});
    g_.define(any_container_, g_.choice({arr, obj}));
  }
  return any_inline();
}

int SchemaCompiler::any_inline() {
  if (any_inline_ < 0)
    any_inline_ = g_.choice(
        {lit("null"), lit("true"), lit("false"), number_expr(), string_expr(0, -1), g_.ref(any_container_)});
  return any_inline_;
}

}  // namespace detail

}  // namespace beluga::grammar
