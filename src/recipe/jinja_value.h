// A Jinja runtime value (the subset chat templates use): undefined, none, bool, int, float, string,
// list, dict (insertion-ordered, also used for namespace()), and callables (macros, builtins).
// Strings remember which byte ranges came from request data ("data" ranges): the chat-template
// encoder renders data as plain text and only template literals may produce control tokens.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace beluga::recipe::jinja {

// What a hostile template cannot exceed (each a beluga::Error when reached): the bytes of one string,
// the items one range() or list concatenation makes, the nesting that printing, comparing or
// serializing a value walks (values can nest deeper than the template text, built up in a loop).
inline constexpr size_t kMaxStringBytes = size_t(64) << 20;
inline constexpr size_t kMaxListItems = 100000;  // as Jinja's sandbox limits range()
inline constexpr int kMaxValueDepth = 512;

struct Value;
using List = std::vector<Value>;

struct Range {
  size_t begin, end;
  bool operator==(const Range&) const = default;
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool data_keys = false;  // keys came from request data (printing them is printing data)
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};

struct Args;
using Function = std::function<Value(Args&)>;

struct Value {
  enum class Type { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunction };
  Type type = Type::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<Range> data;  // kString: ranges of s that are request data
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Function> fn;
  bool is_namespace = false;

  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value real(double v);
  static Value string(std::string v, bool is_data = false);
  static Value new_list(List items = {});
  static Value new_dict();
  static Value function(Function f);

  bool is_undefined() const { return type == Type::kUndefined; }
  bool is_string() const { return type == Type::kString; }
  bool is_number() const { return type == Type::kInt || type == Type::kFloat; }
  bool has_data() const { return !data.empty(); }
  bool truthy() const;
  double as_double() const;
  // Python's str(): how the value prints in {{ }}.
  std::string to_str() const;
  // Python-style repr (strings quoted), used inside printed lists and dicts.
  std::string repr() const;
  // Appends a string value (with its data ranges) or the printed form of any other value.
  void append_to(Value& str_out) const;
};

// Appends template text (never request data) to a string value, within the string size limit: a
// text node prints this way without first becoming a Value of its own.
void append_literal(std::string_view text, Value& str_out);

// Whether any string inside `v` (recursively, dict keys included) is request data.
bool contains_data(const Value& v);

// Equality as Python defines it for these types (1 == 1.0, lists and dicts by value).
bool equals(const Value& a, const Value& b);
// Ordering for sort and comparisons; throws on incomparable types.
int compare(const Value& a, const Value& b);

// The lists and namespaces one render mutated (`x.append(v)`, `{% set ns.a = v %}`). Values are
// reference-counted and a container built from values holds only older ones, so a cycle (which
// would never be freed: `{% set ns.x = ns %}`, a leak per render that libFuzzer found) must pass
// through a mutated container. When the render ends, after its scopes are gone, every one of them
// still alive is emptied: that frees the cycles. (A list of the caller's context the template
// appended to is emptied too; chat templates never read theirs after the render.)
class MutationLog {
 public:
  MutationLog() = default;
  MutationLog(const MutationLog&) = delete;
  MutationLog& operator=(const MutationLog&) = delete;
  ~MutationLog();
  void mutated(const std::shared_ptr<List>& l);
  void mutated(const std::shared_ptr<Dict>& d);

 private:
  std::vector<std::weak_ptr<List>> lists_;
  std::vector<std::weak_ptr<Dict>> dicts_;
  const void* last_ = nullptr;  // a loop appending to one list logs it once
};

// Call arguments: positional then keyword; `log` is the calling render's (null outside one).
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  MutationLog* log = nullptr;
  // Positional `index` or keyword `name`, else undefined.
  Value get(size_t index, const std::string& name) const;
};

}  // namespace beluga::recipe::jinja
