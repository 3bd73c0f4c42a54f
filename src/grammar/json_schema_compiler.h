// The JSON Schema front end's compiler (json_schema.h is the public contract): one SchemaCompiler per
// schema walks it and writes the grammar of its canonical instances. Internal to src/grammar; its
// members are defined by concept: the walker and $ref resolution (json_schema.cc), strings and
// formats (json_schema_strings.cc), numbers and numeric ranges (json_schema_numbers.cc), arrays and
// objects (json_schema_containers.cc), uniqueItems (json_schema_unique.cc), enum/const values
// (json_schema_values.cc), merging of subschemas for allOf and oneOf exclusivity
// (json_schema_merge.cc), and not / if-then-else as schemas the rest can build (json_schema_not.cc).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/refused.h"

namespace beluga::grammar {
struct CompiledGrammar;
}

namespace beluga::grammar::detail {

using Json = nlohmann::ordered_json;

// Keywords by what Beluga does with them.
enum class Kw { kEnforced, kIgnored, kRefused, kOtherDraft };
Kw classify(const std::string& k, Draft d);
const char* draft_name(Draft d);
bool is_assertion_free(const Json& s);
// Keywords the compiler writes for itself (a complement has no JSON Schema spelling); a schema that
// uses them is refused. kNotIn: the value is none of these; kNonIntegral: a number is not an integer.
inline constexpr const char* kNotIn = "$beluga:notIn";
inline constexpr const char* kNonIntegral = "$beluga:nonIntegral";
// A count keyword's number (minItems, maxLength, ...) as an integer, rounded up or down and clamped
// to +-2^53: converting a number past int64_t's range (`"maxItems": 3e26`) is undefined behavior.
inline int64_t count_value(double v, bool round_up) {
  constexpr double kLimit = 9007199254740992.0;  // 2^53
  return int64_t(std::clamp(round_up ? std::ceil(v) : std::floor(v), -kLimit, kLimit));
}
inline std::string join_path(const std::string& p, const std::string& k) {
  return p + "/" + k;
}

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, const JsonSchemaOptions& o);
  Grammar run();

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

  // ---- the walker (json_schema.cc) -----------------------------------------------------------------
  const Json& resolve(const std::string& ref, const std::string& path, std::string& ptr_out);
  int gen(const Json& s, const std::string& path, int depth);
  int gen_ref(const std::string& ref, const std::string& path, int depth);
  std::set<std::string> types_of(const Json& s, const std::string& path);
  int gen_types(const Json& s, const std::string& path, int depth);
  int any_value();
  int any_inline();

  // ---- strings (json_schema_strings.cc) ------------------------------------------------------------
  int string_rest();
  int string_expr(int min, int max);
  int lexeme(const std::string& name, int body);
  int gen_string(const Json& s, const std::string& path);
  int format_expr(const std::string& f);
  int gen_pattern(const Json& s, const std::string& path, int min, int max);
  int digits(int n) { return g_.repeat(g_.bytes(ByteSet::range('0', '9')), n, n); }
  int two(const char* lo1, const char* hi1) {  // helper: [a-b][c-d]
    return g_.seq({g_.bytes(ByteSet::range(lo1[0], hi1[0])), g_.bytes(ByteSet::range(lo1[1], hi1[1]))});
  }

  // ---- numbers (json_schema_numbers.cc) ------------------------------------------------------------
  struct Bound {
    std::optional<double> v;
    bool excl = false;
  };
  int number_expr();
  int digit_range(const std::string& a, const std::string& b);
  int nonneg_range(int64_t lo, int64_t hi);
  int int_range(std::optional<int64_t> lo, std::optional<int64_t> hi, bool zero_ok_negative = false);
  Bound bound(const Json& s, bool lower, const std::string& path);
  // Numbers the schema accepts; `extra_lo`/`extra_hi` tighten its bounds (kNotIn's open intervals).
  int gen_number(const Json& s, const std::string& path, bool integer);
  int gen_number(const Json& s, const std::string& path, bool integer, Bound extra_lo, Bound extra_hi);
  // Numbers other than the numeric values of kNotIn: the open intervals between them.
  int gen_number_not_in(const Json& s, const std::vector<double>& out, const std::string& path, bool integer);
  // multipleOf (json_schema_multiple.cc): a digit automaton tracking the remainder.
  int gen_multiple_of(const Json& s, const std::string& path, bool integer, bool zero_frac_ok);

  // ---- arrays and objects (json_schema_containers.cc) ----------------------------------------------
  struct ObjState {
    size_t n = 0;
    bool subset = true;
    std::vector<bool> req;
    std::vector<uint32_t> dep_mask;  // per key: the keys its presence requires (subset mode)
    std::vector<int> key, val;
    int add = -1, colon = -1, comma = -1, close = -1;
    // minProperties/maxProperties: members counted up to `cap` (max_p, or min_p when unbounded).
    bool track = false;
    int64_t min_p = 0, max_p = -1, cap = 0;
    int64_t next(int64_t c) const { return track ? std::min(c + 1, cap) : 0; }
    std::map<uint64_t, int> t_rules;  // (sigma, count) -> rule
  };
  int gen_array(const Json& s, const std::string& path, int depth);
  int gen_contains(const Json& s, const Json& item, int64_t min, int64_t max, const std::string& path,
                   int depth);
  int gen_object(const Json& s, const std::string& path, int depth);
  bool can_close(const ObjState& st, uint32_t sigma, int64_t c);
  int d_expr(ObjState& st, uint32_t sigma, int64_t c, const std::string& path);
  int t_rule(ObjState& st, uint32_t sigma, int64_t c, const std::string& path);
  size_t expr_size(int e, size_t cap);
  // uniqueItems over finite item domains (json_schema_unique.cc).
  std::optional<std::vector<Json>> finite_values(const Json& s, const std::string& path, int depth);
  int gen_unique(const std::vector<const Json*>& prefix, const Json& rest, int64_t min, int64_t max,
                 const std::string& path, int depth);

  // ---- enum / const (json_schema_values.cc) --------------------------------------------------------
  int gen_enum(const Json& s, const std::string& path, int depth);
  static bool json_equal(const Json& a, const Json& b);
  int value_expr(const Json& v, const std::string& path);
  // Whether each text (a whole JSON value) matches expr: the grammar so far with expr as its root,
  // rules still being defined (recursion) taken as empty, so only non-recursive uses are exact.
  std::vector<bool> accepts(int expr, const std::vector<std::string>& texts);
  std::shared_ptr<const CompiledGrammar> probe_grammar(int expr);
  // Unnamed keys by the set of patterns they match (json_schema_keys.cc): class -> key expression.
  std::map<uint32_t, int> key_classes(const std::vector<std::string>& patterns,
                                      const std::vector<std::string>& named_texts, const std::string& path);

  // ---- merging (json_schema_merge.cc) --------------------------------------------------------------
  Json deref(const Json& s, const std::string& path);
  Json merge(const Json& a0, const Json& b0, const std::string& path);
  void check_exclusive(const std::vector<Json>& branches, const std::string& path);

  // ---- not, if/then/else (json_schema_not.cc) ------------------------------------------------------
  // s with not / if-then-else / dependent schemas rewritten as allOf/anyOf of schemas the rest builds
  // (lone if, then and else dropped); other schemas unchanged.
  Json lower(const Json& s, const std::string& path);
  // Whether s has dependent schemas lower() rewrites; with rest/parts: moves them from *rest to *parts.
  bool dependent_schemas(const Json& s, Json* rest, Json* parts);
  // A schema for the complement of s (de Morgan over its keywords); refuses what has none.
  Json negate(const Json& s, const std::string& path, int depth);

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
  size_t ticks_ = 0, merges_ = 0, negations_ = 0;
};

}  // namespace beluga::grammar::detail
