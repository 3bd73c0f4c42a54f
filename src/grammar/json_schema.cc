#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "grammar/automaton.h"
#include "grammar/compiled.h"
#include "grammar/json_string.h"
#include "grammar/matcher.h"
#include "grammar/refused.h"
#include "util/error.h"

namespace beluga::grammar {

using Json = nlohmann::ordered_json;

std::optional<Draft> parse_draft(std::string_view s) {
  if (s == "4" || s == "draft-04" || s == "draft4") return Draft::k4;
  if (s == "6" || s == "draft-06" || s == "draft6") return Draft::k6;
  if (s == "7" || s == "draft-07" || s == "draft7") return Draft::k7;
  if (s == "2020-12" || s == "2020" || s == "draft2020-12") return Draft::k2020;
  return std::nullopt;
}

namespace {

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

// Keywords by what Beluga does with them.
enum class Kw { kEnforced, kIgnored, kRefused, kOtherDraft };

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
                                                     "format"};
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
  static const std::set<std::string> refused = {"not",
                                                "pattern",
                                                "patternProperties",
                                                "propertyNames",
                                                "dependencies",
                                                "dependentRequired",
                                                "dependentSchemas",
                                                "contains",
                                                "minContains",
                                                "maxContains",
                                                "if",
                                                "uniqueItems",
                                                "multipleOf",
                                                "minProperties",
                                                "maxProperties",
                                                "unevaluatedProperties",
                                                "unevaluatedItems",
                                                "$dynamicRef",
                                                "$dynamicAnchor",
                                                "$recursiveRef",
                                                "$recursiveAnchor"};
  if (enforced_all.count(k)) return Kw::kEnforced;
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

std::string join_path(const std::string& p, const std::string& k) {
  return p + "/" + k;
}

int64_t checked_int(double x, const char* kw) {
  if (!(std::fabs(x) < 1e18)) throw Refused(kw, std::string(kw) + ": bounds beyond 1e18 are not supported");
  return int64_t(x);
}

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, const JsonSchemaOptions& o) : root_(root), opt_(o) {
    draft_ = Draft::k2020;
    if (root.is_object() && root.contains("$schema")) {
      BELUGA_CHECK(root["$schema"].is_string(), "$schema must be a string");
      auto d = draft_of_uri(root["$schema"].get<std::string>());
      if (!d && !o.draft)
        throw Refused("$schema", "$schema: unsupported draft " + root["$schema"].get<std::string>());
      if (d) draft_ = *d;
    }
    if (o.draft) draft_ = *o.draft;
    has_ref_ = root.dump().find("\"$ref\"") != std::string::npos;
    ws_ = o.max_whitespace > 0 ? g_.repeat(g_.bytes(ByteSet::of(" \t\n\r")), 0, o.max_whitespace) : -1;
  }

  Grammar run() {
    int root_rule = g_.add_rule("root");
    g_.root = root_rule;
    in_progress_.insert("#");
    int body = gen(root_, "#", 0);
    in_progress_.erase("#");
    g_.define(root_rule, body);
    return std::move(g_);
  }

 private:
  // ---- helpers -------------------------------------------------------------------------------------
  void tick() {
    if (g_.exprs.size() > opt_.max_exprs) throw Refused("grammar-size", "the schema's grammar is too large");
    if ((++ticks_ & 255) == 0 && std::chrono::steady_clock::now() > opt_.deadline)
      throw Refused("compile-time", "compiling the schema exceeded the compile time limit");
  }
  int ws() { return ws_ >= 0 ? ws_ : g_.empty(); }
  int lit(std::string_view s) { return g_.literal(s); }
  // A structural token followed by optional whitespace.
  int tokws(std::string_view s) { return ws_ >= 0 ? g_.seq({lit(s), ws_}) : lit(s); }
  int wstok(std::string_view s) { return ws_ >= 0 ? g_.seq({ws_, lit(s)}) : lit(s); }

  [[noreturn]] void refuse(const std::string& kw, const std::string& path, const std::string& why) {
    throw Refused(kw, kw + " at " + path + ": " + why);
  }

  const Json& resolve(const std::string& ref, const std::string& path, std::string& ptr_out) {
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
      } else if (cur->is_array() && !key.empty() &&
                 key.find_first_not_of("0123456789") == std::string::npos && std::stoul(key) < cur->size()) {
        cur = &(*cur)[std::stoul(key)];
      } else {
        fail("$ref at ", path, ": \"", ref, "\" does not resolve within the schema");
      }
      i = j;
    }
    return *cur;
  }

  // ---- the main dispatch ---------------------------------------------------------------------------
  int gen(const Json& s, const std::string& path, int depth) {
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

    for (auto& [k, v] : s.items()) {
      switch (classify(k, draft_)) {
        case Kw::kEnforced:
        case Kw::kIgnored:
          break;
        case Kw::kOtherDraft:
          refuse(k, path, std::string("not a keyword of ") + draft_name(draft_));
        case Kw::kRefused:
          if (k == "uniqueItems" && v.is_boolean() && !v.get<bool>()) break;
          if (k == "minProperties" && v.is_number() && v.get<double>() <= 0) break;
          if (k == "patternProperties" && v.is_object() && v.empty()) break;
          if (k == "if" && !s.contains("then") && !s.contains("else")) break;
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
      if (one) check_exclusive(branches, path);
      std::vector<int> alts;
      for (size_t i = 0; i < branches.size(); ++i)
        alts.push_back(gen(branches[i], join_path(join_path(path, kw), std::to_string(i)), depth + 1));
      return g_.choice(std::move(alts));
    }
    if (s.contains("enum") || s.contains("const")) return gen_enum(s, path, depth);
    return gen_types(s, path, depth);
  }

  int gen_ref(const std::string& ref, const std::string& path, int depth) {
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

  // ---- types ---------------------------------------------------------------------------------------
  std::set<std::string> types_of(const Json& s, const std::string& path) {
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

  int gen_types(const Json& s, const std::string& path, int depth) {
    std::set<std::string> types = types_of(s, path);
    std::vector<int> alts;
    if (types.count("null")) alts.push_back(lit("null"));
    if (types.count("boolean")) alts.push_back(g_.choice({lit("true"), lit("false")}));
    if (types.count("number"))
      alts.push_back(gen_number(s, path, false));
    else if (types.count("integer"))
      alts.push_back(gen_number(s, path, true));
    if (types.count("string")) alts.push_back(gen_string(s, path));
    if (types.count("array")) alts.push_back(gen_array(s, path, depth));
    if (types.count("object")) alts.push_back(gen_object(s, path, depth));
    return g_.choice(std::move(alts));
  }

  // Any JSON value: scalars inline, containers through one recursive rule that ends at ] or }.
  int any_value() {
    if (any_container_ < 0) {
      any_container_ = g_.add_rule("any-container");
      int v = any_inline();
      int member = g_.seq({string_expr(0, -1), tokws(":"), v});
      int arr = g_.seq(
          {tokws("["), g_.optional(g_.seq({v, g_.repeat(g_.seq({tokws(","), v}), 0, -1)})), wstok("]")});
      int obj =
          g_.seq({tokws("{"), g_.optional(g_.seq({member, g_.repeat(g_.seq({tokws(","), member}), 0, -1)})),
                  wstok("}")});
      g_.define(any_container_, g_.choice({arr, obj}));
    }
    return any_inline();
  }
  int any_inline() {
    if (any_inline_ < 0)
      any_inline_ = g_.choice({lit("null"), lit("true"), lit("false"), number_expr(), string_expr(0, -1),
                               g_.ref(any_container_)});
    return any_inline_;
  }

  // ---- strings -------------------------------------------------------------------------------------
  // Unbounded strings share one rule for their body and closing quote, so its (full-vocabulary) token
  // masks are computed once per grammar rather than once per string in the schema.
  int string_rest() {
    if (string_rest_ < 0) {
      if (char_ < 0) char_ = json_string_char(g_);
      int r = g_.add_rule("string-rest");
      g_.define(r, g_.seq({g_.repeat(char_, 0, -1), lit("\"")}));
      string_rest_ = g_.ref(r);
    }
    return string_rest_;
  }
  int string_expr(int min, int max) {
    if (min == 0 && max < 0) return g_.seq({lit("\""), string_rest()});
    if (char_ < 0) char_ = json_string_char(g_);
    return g_.seq({lit("\""), lexeme("string{" + std::to_string(min) + "," + std::to_string(max) + "}",
                                     g_.seq({g_.repeat(char_, min, max), lit("\"")}))});
  }
  // A call-free piece as a rule of its own: the automaton compiler makes it a DFA, built once however
  // often the schema uses it.
  int lexeme(const std::string& name, int body) {
    auto it = lexemes_.find(name);
    if (it != lexemes_.end()) return it->second;
    int r = g_.add_rule(name);
    g_.define(r, body);
    return lexemes_[name] = g_.ref(r);
  }

  int gen_string(const Json& s, const std::string& path) {
    int min = 0, max = -1;
    if (s.contains("minLength")) min = int(std::min<double>(s["minLength"].get<double>(), 1e6));
    if (s.contains("maxLength")) max = int(std::min<double>(s["maxLength"].get<double>(), 1e6));
    if (max >= 0 && max < min) return g_.nothing();
    if (s.contains("format")) {
      BELUGA_CHECK(s["format"].is_string(), "format at ", path, " must be a string");
      std::string f = s["format"].get<std::string>();
      if (min > 0 || max >= 0)
        refuse("format", path, "format together with minLength/maxLength is not supported");
      auto it = lexemes_.find("format:" + f);
      if (it != lexemes_.end()) return g_.seq({lit("\""), it->second});
      int body = format_expr(f);
      if (body < 0) refuse("format", path, "format \"" + f + "\" is not supported");
      return g_.seq({lit("\""), lexeme("format:" + f, g_.seq({body, lit("\"")}))});
    }
    return string_expr(min, max);
  }

  int digits(int n) { return g_.repeat(g_.bytes(ByteSet::range('0', '9')), n, n); }
  int two(const char* lo1, const char* hi1) {  // helper: [a-b][c-d]
    return g_.seq({g_.bytes(ByteSet::range(lo1[0], hi1[0])), g_.bytes(ByteSet::range(lo1[1], hi1[1]))});
  }
  int format_expr(const std::string& f) {
    auto date = [&] {
      int month = g_.choice({two("01", "09"), two("10", "12")});
      int day = g_.choice({two("01", "09"), two("10", "29"), two("30", "31")});
      return g_.seq({digits(4), lit("-"), month, lit("-"), day});
    };
    auto time = [&] {
      int hour = g_.choice({two("00", "19"), two("20", "23")});
      int minute = two("00", "59");
      int second = g_.choice({two("00", "59"), lit("60")});
      int frac = g_.optional(g_.seq({lit("."), g_.repeat(g_.bytes(ByteSet::range('0', '9')), 1, -1)}));
      int offset = g_.choice(
          {g_.bytes(ByteSet::of("Zz")), g_.seq({g_.bytes(ByteSet::of("+-")), hour, lit(":"), minute})});
      return g_.seq({hour, lit(":"), minute, lit(":"), second, frac, offset});
    };
    if (f == "date") return date();
    if (f == "time") return time();
    if (f == "date-time") return g_.seq({date(), g_.bytes(ByteSet::of("Tt")), time()});
    if (f == "uuid") {
      ByteSet hex = ByteSet::range('0', '9');
      hex.set_range('a', 'f');
      hex.set_range('A', 'F');
      int h = g_.bytes(hex);
      auto hx = [&](int n) { return g_.repeat(h, n, n); };
      return g_.seq({hx(8), lit("-"), hx(4), lit("-"), hx(4), lit("-"), hx(4), lit("-"), hx(12)});
    }
    if (f == "email") {
      ByteSet atext = ByteSet::range('a', 'z');
      atext.set_range('A', 'Z');
      atext.set_range('0', '9');
      for (char c : std::string("!#$%&'*+/=?^_`{|}~-")) atext.set(uint8_t(c));
      int word = g_.repeat(g_.bytes(atext), 1, -1);
      int local = g_.seq({word, g_.repeat(g_.seq({lit("."), word}), 0, -1)});
      ByteSet alnum = ByteSet::range('a', 'z');
      alnum.set_range('A', 'Z');
      alnum.set_range('0', '9');
      ByteSet alnum_dash = alnum;
      alnum_dash.set('-');
      int label = g_.seq(
          {g_.bytes(alnum), g_.optional(g_.seq({g_.repeat(g_.bytes(alnum_dash), 0, 61), g_.bytes(alnum)}))});
      int domain = g_.seq({label, g_.repeat(g_.seq({lit("."), label}), 1, -1)});
      return g_.seq({local, lit("@"), domain});
    }
    return -1;
  }

  // ---- numbers -------------------------------------------------------------------------------------
  int number_expr() {
    int digit = g_.bytes(ByteSet::range('0', '9'));
    int intpart = g_.seq(
        {g_.optional(lit("-")),
         g_.choice({lit("0"), g_.seq({g_.bytes(ByteSet::range('1', '9')), g_.repeat(digit, 0, -1)})})});
    int frac = g_.optional(g_.seq({lit("."), g_.repeat(digit, 1, -1)}));
    int exp = g_.optional(g_.seq(
        {g_.bytes(ByteSet::of("eE")), g_.optional(g_.bytes(ByteSet::of("+-"))), g_.repeat(digit, 1, -1)}));
    return g_.seq({intpart, frac, exp});
  }

  // Same-length digit strings a <= b (leading zeros allowed): every string between them.
  int digit_range(const std::string& a, const std::string& b) {
    if (a.empty()) return g_.empty();
    if (a == b) return lit(a);
    if (a[0] == b[0]) return g_.seq({lit(a.substr(0, 1)), digit_range(a.substr(1), b.substr(1))});
    std::string ra = a.substr(1), rb = b.substr(1);
    bool low_full = ra.find_first_not_of('0') == std::string::npos;
    bool high_full = rb.find_first_not_of('9') == std::string::npos;
    std::vector<int> alts;
    if (!low_full)
      alts.push_back(g_.seq({lit(a.substr(0, 1)), digit_range(ra, std::string(ra.size(), '9'))}));
    char lo = low_full ? a[0] : char(a[0] + 1), hi = high_full ? b[0] : char(b[0] - 1);
    if (lo <= hi) alts.push_back(g_.seq({g_.bytes(ByteSet::range(lo, hi)), digits(int(ra.size()))}));
    if (!high_full)
      alts.push_back(g_.seq({lit(b.substr(0, 1)), digit_range(std::string(rb.size(), '0'), rb)}));
    return g_.choice(std::move(alts));
  }

  // Canonical decimal integers in [lo, hi] (lo >= 0; hi < 0: unbounded).
  int nonneg_range(int64_t lo, int64_t hi) {
    if (hi >= 0 && hi < lo) return g_.nothing();
    std::string los = std::to_string(lo);
    std::vector<int> alts;
    size_t maxlen = hi >= 0 ? std::to_string(hi).size() : los.size();
    for (size_t len = los.size(); len <= maxlen; ++len) {
      std::string a = los;
      if (len != los.size()) {
        a.assign(len, '0');
        a[0] = '1';
      }
      std::string b = std::string(len, '9');
      if (hi >= 0 && len == maxlen) b = std::to_string(hi);
      if (a.size() == b.size() && a <= b) alts.push_back(digit_range(a, b));
    }
    if (hi < 0)  // every longer number
      alts.push_back(g_.seq({g_.bytes(ByteSet::range('1', '9')),
                             g_.repeat(g_.bytes(ByteSet::range('0', '9')), int(los.size()), -1)}));
    return g_.choice(std::move(alts));
  }

  // Integers in [lo, hi]; nullopt: unbounded. Negative numbers as "-" magnitude.
  int int_range(std::optional<int64_t> lo, std::optional<int64_t> hi, bool zero_ok_negative = false) {
    std::vector<int> alts;
    if (!hi || *hi >= 0) alts.push_back(nonneg_range(lo ? std::max<int64_t>(*lo, 0) : 0, hi ? *hi : -1));
    if (!lo || *lo < 0) {
      int64_t mlo = hi && *hi < 0 ? -*hi : (zero_ok_negative ? 0 : 1);
      int64_t mhi = lo ? -*lo : -1;
      if (zero_ok_negative && hi && *hi >= 0) mlo = 0;
      alts.push_back(g_.seq({lit("-"), nonneg_range(mlo, mhi)}));
    }
    return g_.choice(std::move(alts));
  }

  struct Bound {
    std::optional<double> v;
    bool excl = false;
  };
  Bound bound(const Json& s, bool lower, const std::string& path) {
    const char* kw = lower ? "minimum" : "maximum";
    const char* xkw = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    Bound b;
    if (s.contains(kw)) {
      BELUGA_CHECK(s[kw].is_number(), kw, " at ", path, " must be a number");
      b.v = s[kw].get<double>();
    }
    if (s.contains(xkw)) {
      const Json& x = s[xkw];
      if (draft_ == Draft::k4) {
        BELUGA_CHECK(x.is_boolean(), xkw, " at ", path, " must be a boolean in draft 4");
        b.excl = x.get<bool>() && b.v;
      } else {
        BELUGA_CHECK(x.is_number(), xkw, " at ", path, " must be a number");
        double xv = x.get<double>();
        if (!b.v || (lower ? xv >= *b.v : xv <= *b.v)) b.v = xv, b.excl = true;
      }
    }
    return b;
  }

  int gen_number(const Json& s, const std::string& path, bool integer) {
    Bound lo = bound(s, true, path), hi = bound(s, false, path);
    int zeros = g_.optional(g_.seq({lit("."), g_.repeat(lit("0"), 1, -1)}));
    bool zero_frac_ok = draft_ != Draft::k4 || !integer;
    if (integer) {
      std::optional<int64_t> l, h;
      if (lo.v) {
        double c = lo.excl ? std::floor(*lo.v) + 1 : std::ceil(*lo.v);
        l = checked_int(c, "minimum");
      }
      if (hi.v) {
        double c = hi.excl ? std::ceil(*hi.v) - 1 : std::floor(*hi.v);
        h = checked_int(c, "maximum");
      }
      if (l && h && *l > *h) return g_.nothing();
      int base = int_range(l, h);
      return zero_frac_ok ? g_.seq({base, zeros}) : base;
    }
    if (!lo.v && !hi.v) return number_expr();
    for (const Bound* b : {&lo, &hi})
      if (b->v && std::floor(*b->v) != *b->v)
        refuse(b == &lo ? "minimum" : "maximum", path, "a non-integer bound on a number is not supported");
    std::optional<int64_t> L, H;
    if (lo.v) L = checked_int(*lo.v, "minimum");
    if (hi.v) H = checked_int(*hi.v, "maximum");
    int digit = g_.bytes(ByteSet::range('0', '9'));
    int frac = g_.seq(
        {lit("."), g_.repeat(digit, 0, -1), g_.bytes(ByteSet::range('1', '9')), g_.repeat(digit, 0, -1)});
    auto irange = [&](std::optional<int64_t> a, std::optional<int64_t> b) -> int {  // I in [a, b], I >= 0
      int64_t aa = std::max<int64_t>(a ? *a : 0, 0);
      if (b && *b < aa) return g_.nothing();
      return nonneg_range(aa, b ? *b : -1);
    };
    auto opt_add = [](std::optional<int64_t> x, int64_t d) -> std::optional<int64_t> {
      return x ? std::optional<int64_t>(*x + d) : std::nullopt;
    };
    auto opt_neg = [](std::optional<int64_t> x) -> std::optional<int64_t> {
      return x ? std::optional<int64_t>(-*x) : std::nullopt;
    };
    std::vector<int> alts;
    // value = I (exact) or I + d, 0 < d < 1 (frac), for I >= 0; then the negatives.
    alts.push_back(g_.seq({irange(lo.excl ? opt_add(L, 1) : L, hi.excl ? opt_add(H, -1) : H), zeros}));
    alts.push_back(g_.seq({irange(L, opt_add(H, -1)), frac}));
    {
      // -I >= L  <=>  I <= -L ; -I <= H <=> I >= -H ; I >= 1
      std::optional<int64_t> a = hi.excl ? opt_add(opt_neg(H), 1) : opt_neg(H);
      std::optional<int64_t> b = lo.excl ? opt_add(opt_neg(L), -1) : opt_neg(L);
      if (!a || *a < 1) a = 1;
      alts.push_back(g_.seq({lit("-"), irange(a, b), zeros}));
    }
    // -(I + d) >= L <=> I <= -L - 1 ; -(I + d) <= H <=> I >= -H
    alts.push_back(g_.seq({lit("-"), irange(opt_neg(H), opt_add(opt_neg(L), -1)), frac}));
    return g_.choice(std::move(alts));
  }

  // ---- arrays --------------------------------------------------------------------------------------
  int gen_array(const Json& s, const std::string& path, int depth) {
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
    for (int i = 0; i < p; ++i)
      items.push_back(gen(*prefix[i], join_path(path, std::to_string(i)), depth + 1));
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

  // ---- objects -------------------------------------------------------------------------------------
  int gen_object(const Json& s, const std::string& path, int depth) {
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

  struct ObjState {
    size_t n = 0;
    bool subset = true;
    std::vector<bool> req;
    std::vector<int> key, val;
    int add = -1, colon = -1, comma = -1, close = -1;
    std::map<uint32_t, int> t_rules;
  };
  bool can_close(const ObjState& st, uint32_t sigma) {
    for (size_t k = 0; k < st.n; ++k) {
      if (!st.req[k]) continue;
      if (st.subset ? !((sigma >> k) & 1) : k >= sigma) return false;
    }
    return true;
  }
  // A declared member, then the rest of the object.
  int d_expr(ObjState& st, uint32_t sigma, const std::string& path) {
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
  int t_rule(ObjState& st, uint32_t sigma, const std::string& path) {
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
  size_t expr_size(int e, size_t cap) {
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

  // ---- enum / const --------------------------------------------------------------------------------
  int gen_enum(const Json& s, const std::string& path, int depth) {
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
    std::vector<int> alts;
    if (!is_assertion_free(rest)) {
      // Keep the values the rest of the schema accepts (checked with the rest's own grammar).
      int other = gen(rest, path, depth + 1);
      Grammar probe = g_;
      for (auto& b : probe.rule_body)
        if (b < 0) b = probe.nothing();  // a rule still being defined (recursion): conservatively empty
      int r = probe.add_rule("probe");
      probe.define(r, other);
      probe.root = r;
      auto cg = std::make_shared<CompiledGrammar>();
      cg->automaton = compile_automaton(probe);
      std::vector<Json> kept;
      for (auto& v : values) {
        Matcher m(cg);
        if (m.accept_bytes(v.dump()) && m.is_accepting()) kept.push_back(v);
      }
      values = std::move(kept);
    }
    for (auto& v : values) alts.push_back(value_expr(v, path));
    return g_.choice(std::move(alts));
  }

  static bool json_equal(const Json& a, const Json& b) {
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
  int value_expr(const Json& v, const std::string& path) {
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
      for (auto& k : keys)
        members.push_back(g_.seq({lit(Json(k).dump()), tokws(":"), value_expr(v[k], path)}));
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

  // ---- merging (allOf, and siblings of anyOf/oneOf) ------------------------------------------------
  Json deref(const Json& s, const std::string& path) {
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

  Json merge(const Json& a0, const Json& b0, const std::string& path) {
    if (++merges_ > 10000) refuse("allOf", path, "merging subschemas does not terminate (recursive $ref?)");
    Json a = deref(a0, path), b = deref(b0, path);
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
      } else if (k == "minLength" || k == "minItems" || k == "minimum") {
        out[k] = std::max(av.get<double>(), bv.get<double>());
      } else if (k == "maxLength" || k == "maxItems" || k == "maximum") {
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
  void check_exclusive(const std::vector<Json>& branches, const std::string& path) {
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

  const Json& root_;
  JsonSchemaOptions opt_;
  Draft draft_;
  bool has_ref_ = false;
  Grammar g_;
  int ws_ = -1;
  int any_container_ = -1, any_inline_ = -1, char_ = -1, string_rest_ = -1;
  std::set<std::string> in_progress_;
  std::map<std::string, int> ref_rule_;
  std::map<std::string, int> expansions_;
  std::map<std::string, int> lexemes_;
  size_t ticks_ = 0, merges_ = 0;
};

}  // namespace

Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options) {
  return SchemaCompiler(schema, options).run();
}

}  // namespace beluga::grammar
