#include "recipe/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>

#include "recipe/py_json.h"
#include "util/error.h"

namespace beluga::recipe::jinja {

namespace {

Value derived(const Value& src, std::string s) {
  return Value::string(std::move(s), contains_data(src));
}

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  auto in_set = [&](char c) { return chars.is_string() ? chars.s.find(c) != std::string::npos : is_ws(c); };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && in_set(s[b])) ++b;
  if (right)
    while (e > b && in_set(s[e - 1])) --e;
  return s.substr(b, e - b);
}

List split(const Value& str, const Value& sep, int64_t maxsplit) {
  List out;
  const std::string& s = str.s;
  if (!sep.is_string()) {  // whitespace split, empty pieces dropped
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && is_ws(s[i])) ++i;
      if (i >= s.size()) break;
      size_t j = i;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        j = s.size();
        while (j > i && is_ws(s[j - 1])) --j;
      } else {
        while (j < s.size() && !is_ws(s[j])) ++j;
      }
      out.push_back(derived(str, s.substr(i, j - i)));
      i = j;
    }
    return out;
  }
  BELUGA_CHECK(!sep.s.empty(), "template: split() with an empty separator");
  size_t i = 0;
  while (true) {
    size_t j = s.find(sep.s, i);
    if (j == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit)) {
      out.push_back(derived(str, s.substr(i)));
      return out;
    }
    out.push_back(derived(str, s.substr(i, j - i)));
    i = j + sep.s.size();
  }
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) return s;
  std::string out;
  size_t i = 0;
  int64_t n = 0;
  while (true) {
    size_t j = s.find(from, i);
    if (j == std::string::npos || (count >= 0 && n == count)) break;
    out.append(s, i, j - i);
    out += to;
    i = j + from.size();
    ++n;
  }
  out.append(s, i);
  return out;
}

std::string title_case(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      c = start ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c));
      start = false;
    } else {
      start = true;
    }
  }
  return out;
}

std::string map_chars(std::string s, int (*f)(int)) {
  for (char& c : s) c = static_cast<char>(f(static_cast<unsigned char>(c)));
  return s;
}

Value attr_of(const Value& v, const std::string& path) {
  Value cur = v;
  size_t i = 0;
  while (i <= path.size()) {
    size_t j = path.find('.', i);
    if (j == std::string::npos) j = path.size();
    cur = get_item(cur, Value::string(path.substr(i, j - i)));
    i = j + 1;
  }
  return cur;
}

int64_t as_int(const Value& v, int64_t def) {
  if (v.type == Value::Type::kInt) return v.i;
  if (v.type == Value::Type::kFloat) {
    BELUGA_CHECK(v.f >= -9.2e18 && v.f <= 9.2e18, "template: ", v.f, " is out of the integer range");
    return static_cast<int64_t>(v.f);
  }
  if (v.type == Value::Type::kBool) return v.b;
  return def;
}

}  // namespace

List iterate(const Value& v) {
  switch (v.type) {
    case Value::Type::kList:
      return *v.list;
    case Value::Type::kDict: {
      List out;
      for (const auto& [k, x] : v.dict->items) out.push_back(Value::string(k, v.dict->data_keys));
      return out;
    }
    case Value::Type::kString: {
      List out;
      for (size_t i = 0; i < v.s.size();) {  // by UTF-8 character
        size_t n = 1;
        unsigned char c = v.s[i];
        if (c >= 0xF0)
          n = 4;
        else if (c >= 0xE0)
          n = 3;
        else if (c >= 0xC0)
          n = 2;
        out.push_back(derived(v, v.s.substr(i, n)));
        i += n;
      }
      return out;
    }
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return {};
    default:
      fail("template: value is not iterable");
  }
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.type == Value::Type::kDict) {
    if (!key.is_string()) return Value();
    const Value* v = obj.dict->find(key.s);
    return v ? *v : Value();
  }
  if ((obj.type == Value::Type::kList || obj.is_string()) && key.type == Value::Type::kInt) {
    int64_t n = obj.is_string() ? static_cast<int64_t>(obj.s.size()) : static_cast<int64_t>(obj.list->size());
    int64_t k = key.i < 0 ? key.i + n : key.i;
    if (k < 0 || k >= n) return Value();
    return obj.is_string() ? derived(obj, obj.s.substr(k, 1)) : (*obj.list)[k];
  }
  return Value();
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  int64_t st = step.is_undefined() || step.type == Value::Type::kNone ? 1 : as_int(step, 1);
  BELUGA_CHECK(st != 0, "template: slice step cannot be zero");
  bool is_str = obj.is_string();
  BELUGA_CHECK(is_str || obj.type == Value::Type::kList, "template: only strings and lists can be sliced");
  int64_t n = is_str ? static_cast<int64_t>(obj.s.size()) : static_cast<int64_t>(obj.list->size());
  auto norm = [&](const Value& v, int64_t def) {
    if (v.is_undefined() || v.type == Value::Type::kNone) return def;
    int64_t k = as_int(v, def);
    if (k < 0) k += n;
    return st > 0 ? std::clamp<int64_t>(k, 0, n) : std::clamp<int64_t>(k, -1, n - 1);
  };
  int64_t b = norm(start, st > 0 ? 0 : n - 1), e = norm(stop, st > 0 ? n : -1);
  std::string s;
  List l;
  for (int64_t k = b; st > 0 ? k < e : k > e;) {
    if (is_str)
      s += obj.s[k];
    else
      l.push_back((*obj.list)[k]);
    if (__builtin_add_overflow(k, st, &k)) break;  // past either end
  }
  return is_str ? derived(obj, s) : Value::new_list(std::move(l));
}

std::string to_json(const Value& v, int indent, int depth) {
  BELUGA_CHECK(depth < kMaxValueDepth, "template: a value nested deeper than ", kMaxValueDepth, " levels");
  std::string pad, child;  // newline + indentation of this level and of its items
  if (indent >= 0) {
    pad.assign(1, '\n').append(static_cast<size_t>(indent) * depth, ' ');
    child.assign(1, '\n').append(static_cast<size_t>(indent) * (depth + 1), ' ');
  }
  const char* item_sep = indent >= 0 ? "," : ", ";
  switch (v.type) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return "null";
    case Value::Type::kBool:
      return v.b ? "true" : "false";
    case Value::Type::kInt:
      return std::to_string(v.i);
    case Value::Type::kFloat:
      return nlohmann::json(v.f).dump();
    case Value::Type::kString: {
      std::string out = "\"";
      json_escape_append(out, v.s);
      return out + "\"";
    }
    case Value::Type::kList: {
      if (v.list->empty()) return "[]";
      std::string out = "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        out += child + to_json((*v.list)[k], indent, depth + 1);
      }
      return out + pad + "]";
    }
    case Value::Type::kDict: {
      if (v.dict->items.empty()) return "{}";
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.dict->items) {
        if (!first) out += item_sep;
        first = false;
        out += child + "\"";
        json_escape_append(out, k);
        out += "\": " + to_json(x, indent, depth + 1);
      }
      return out + pad + "}";
    }
    case Value::Type::kFunction:
      fail("template: cannot serialize a function to JSON");
  }
  return "null";
}

bool apply_test(const std::string& name, const Value& v, const std::vector<Value>& args) {
  using T = Value::Type;
  auto arg = [&](size_t k) { return k < args.size() ? args[k] : Value(); };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.type == T::kNone;
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.type == T::kInt;
  if (name == "float") return v.type == T::kFloat;
  if (name == "boolean") return v.type == T::kBool;
  if (name == "true") return v.type == T::kBool && v.b;
  if (name == "false") return v.type == T::kBool && !v.b;
  if (name == "mapping") return v.type == T::kDict;
  if (name == "iterable") return v.type == T::kList || v.type == T::kDict || v.is_string();
  if (name == "sequence") return v.type == T::kList || v.type == T::kDict || v.is_string();
  if (name == "callable") return v.type == T::kFunction;
  if (name == "odd") return as_int(v, 0) % 2 != 0;
  if (name == "even") return as_int(v, 0) % 2 == 0;
  if (name == "divisibleby") return as_int(arg(0), 0) != 0 && as_int(v, 0) % as_int(arg(0), 1) == 0;
  if (name == "lower") return v.is_string() && map_chars(v.s, ::tolower) == v.s;
  if (name == "upper") return v.is_string() && map_chars(v.s, ::toupper) == v.s;
  if (name == "eq" || name == "equalto" || name == "==" || name == "sameas") return equals(v, arg(0));
  if (name == "ne" || name == "!=") return !equals(v, arg(0));
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, arg(0)) > 0;
  if (name == "ge" || name == ">=") return compare(v, arg(0)) >= 0;
  if (name == "lt" || name == "lessthan" || name == "<") return compare(v, arg(0)) < 0;
  if (name == "le" || name == "<=") return compare(v, arg(0)) <= 0;
  if (name == "in") {
    const Value c = arg(0);
    if (c.is_string()) return v.is_string() && c.s.find(v.s) != std::string::npos;
    if (c.type == T::kDict) return v.is_string() && c.dict->find(v.s);
    for (const auto& x : iterate(c))
      if (equals(x, v)) return true;
    return false;
  }
  fail("template: unknown test '", name, "'");
}

Value apply_filter(const std::string& name, const Value& v, Args& a) {
  using T = Value::Type;
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value::integer(static_cast<int64_t>(iterate(v).size()));
    if (v.type == T::kList) return Value::integer(static_cast<int64_t>(v.list->size()));
    if (v.type == T::kDict) return Value::integer(static_cast<int64_t>(v.dict->items.size()));
    return Value::integer(0);
  }
  // String filters take strings (as @huggingface/jinja insists; Python would print None).
  if ((name == "trim" || name == "upper" || name == "lower" || name == "title" || name == "capitalize" ||
       name == "replace") &&
      !v.is_string())
    fail("template: cannot apply filter '", name, "' to a non-string value");
  if (name == "trim") return derived(v, strip(v.s, a.get(0, "chars"), true, true));
  if (name == "string") return derived(v, v.to_str());
  if (name == "safe") return v;
  if (name == "upper") return derived(v, map_chars(v.to_str(), ::toupper));
  if (name == "lower") return derived(v, map_chars(v.to_str(), ::tolower));
  if (name == "title") return derived(v, title_case(v.to_str()));
  if (name == "capitalize") {
    std::string s = map_chars(v.to_str(), ::tolower);
    if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
    return derived(v, s);
  }
  if (name == "replace") {
    Value from = a.get(0, "old"), to = a.get(1, "new");
    Value out =
        derived(v, replace_all(v.to_str(), from.to_str(), to.to_str(), as_int(a.get(2, "count"), -1)));
    if (contains_data(to) && out.data.empty() && !out.s.empty()) out.data.push_back({0, out.s.size()});
    return out;
  }
  if (name == "int") {
    if (v.is_string()) return Value::integer(std::strtoll(v.s.c_str(), nullptr, 10));
    return Value::integer(as_int(v, 0));
  }
  if (name == "float") {
    if (v.is_string()) return Value::real(std::strtod(v.s.c_str(), nullptr));
    return Value::real(v.is_number() ? v.as_double() : 0.0);
  }
  if (name == "abs")
    return v.type == T::kInt ? Value::integer(std::llabs(v.i)) : Value::real(std::fabs(v.as_double()));
  if (name == "round") {
    int64_t digits = as_int(a.get(0, "precision"), 0);
    double scale = std::pow(10.0, static_cast<double>(digits));
    return Value::real(std::round(v.as_double() * scale) / scale);
  }
  if (name == "default" || name == "d") {
    bool boolean = a.get(1, "boolean").truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return a.get(0, "default_value");
    return v;
  }
  if (name == "first" || name == "last") {
    List items = iterate(v);
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::new_list(iterate(v));
  if (name == "reverse") {
    if (v.is_string()) return slice(v, Value(), Value(), Value::integer(-1));
    List items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::new_list(std::move(items));
  }
  if (name == "join") {
    Value sep = a.get(0, "d");
    Value attr = a.get(1, "attribute");
    Value out = Value::string("");
    bool first = true;
    for (const auto& x : iterate(v)) {
      if (!first && sep.is_string()) sep.append_to(out);
      first = false;
      (attr.is_string() ? attr_of(x, attr.s) : x).append_to(out);
    }
    return out;
  }
  if (name == "tojson") {
    Value ind = a.get(0, "indent");
    return derived(v, to_json(v, ind.type == T::kInt ? static_cast<int>(ind.i) : -1));
  }
  if (name == "items") {
    BELUGA_CHECK(v.type == T::kDict || v.is_undefined(), "template: items() of a non-dict");
    List out;
    if (v.type == T::kDict)
      for (const auto& [k, x] : v.dict->items)
        out.push_back(Value::new_list({Value::string(k, v.dict->data_keys), x}));
    return Value::new_list(std::move(out));
  }
  if (name == "dictsort") {
    Value items = apply_filter("items", v, a);
    std::stable_sort(items.list->begin(), items.list->end(),
                     [](const Value& x, const Value& y) { return (*x.list)[0].s < (*y.list)[0].s; });
    return items;
  }
  if (name == "unique") {
    List out;
    for (const auto& x : iterate(v)) {
      bool seen = false;
      for (const auto& y : out) seen = seen || equals(x, y);
      if (!seen) out.push_back(x);
    }
    return Value::new_list(std::move(out));
  }
  if (name == "sort") {
    List items = iterate(v);
    bool reverse = a.get(0, "reverse").truthy();
    Value attr = a.get(2, "attribute");
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      const Value& kx = attr.is_string() ? attr_of(x, attr.s) : x;
      const Value& ky = attr.is_string() ? attr_of(y, attr.s) : y;
      return reverse ? compare(kx, ky) > 0 : compare(kx, ky) < 0;
    });
    return Value::new_list(std::move(items));
  }
  if (name == "map") {
    List out;
    Value attr = a.get(99, "attribute");
    for (const auto& x : iterate(v)) {
      if (attr.is_string()) {
        Value r = attr_of(x, attr.s);
        out.push_back(r.is_undefined() ? a.get(99, "default") : r);
      } else {
        Args rest;
        rest.pos.assign(a.pos.begin() + (a.pos.empty() ? 0 : 1), a.pos.end());
        BELUGA_CHECK(!a.pos.empty() && a.pos[0].is_string(),
                     "template: map needs a filter name or attribute=");
        out.push_back(apply_filter(a.pos[0].s, x, rest));
      }
    }
    return Value::new_list(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    bool by_attr = name.ends_with("attr");
    bool keep_if = name.starts_with("select");
    List out;
    for (const auto& x : iterate(v)) {
      Value subject = x;
      size_t test_at = 0;
      if (by_attr) {
        subject = attr_of(x, a.get(0, "attribute").to_str());
        test_at = 1;
      }
      bool ok;
      if (test_at < a.pos.size()) {
        std::vector<Value> targs(a.pos.begin() + test_at + 1, a.pos.end());
        ok = apply_test(a.pos[test_at].to_str(), subject, targs);
      } else {
        ok = subject.truthy();
      }
      if (ok == keep_if) out.push_back(x);
    }
    return Value::new_list(std::move(out));
  }
  if (name == "indent") {
    int64_t width = as_int(a.get(0, "width"), 4);
    bool first = a.get(1, "first").truthy();
    bool blank = a.get(2, "blank").truthy();
    std::string pad(static_cast<size_t>(width), ' '), s = v.to_str(), out;
    size_t i = 0;
    bool line_start = first;
    while (i <= s.size()) {
      size_t j = s.find('\n', i);
      if (j == std::string::npos) j = s.size();
      std::string line = s.substr(i, j - i);
      if (line_start && (blank || !line.empty())) out += pad;
      out += line;
      if (j < s.size()) out += '\n';
      line_start = true;
      i = j + 1;
    }
    return derived(v, out);
  }
  if (name == "sum") {
    double total = 0;
    bool all_int = true;
    for (const auto& x : iterate(v)) {
      all_int = all_int && x.type == T::kInt;
      total += x.as_double();
    }
    return all_int ? Value::integer(static_cast<int64_t>(total)) : Value::real(total);
  }
  if (name == "min" || name == "max") {
    List items = iterate(v);
    if (items.empty()) return Value();
    Value best = items[0];
    for (const auto& x : items)
      if ((name == "min") == (compare(x, best) < 0)) best = x;
    return best;
  }
  fail("template: unknown filter '", name, "'");
}

Value method(const Value& obj, const std::string& name) {
  using T = Value::Type;
  Value self = obj;
  if (obj.is_string()) {
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return Value::function([self, name](Args& a) {
        return derived(self, strip(self.s, a.get(0, "chars"), name != "rstrip", name != "lstrip"));
      });
    if (name == "split")
      return Value::function([self](Args& a) {
        return Value::new_list(split(self, a.get(0, "sep"), as_int(a.get(1, "maxsplit"), -1)));
      });
    if (name == "startswith" || name == "endswith")
      return Value::function([self, name](Args& a) {
        Value p = a.get(0, "prefix");
        List options = p.type == T::kList ? *p.list : List{p};
        for (const auto& o : options) {
          if (!o.is_string()) continue;
          if (name == "startswith" ? self.s.starts_with(o.s) : self.s.ends_with(o.s))
            return Value::boolean(true);
        }
        return Value::boolean(false);
      });
    if (name == "replace" || name == "upper" || name == "lower" || name == "title" || name == "capitalize")
      return Value::function([self, name](Args& a) { return apply_filter(name, self, a); });
    if (name == "find")
      return Value::function([self](Args& a) {
        size_t p = self.s.find(a.get(0, "sub").to_str());
        return Value::integer(p == std::string::npos ? -1 : static_cast<int64_t>(p));
      });
    if (name == "count")
      return Value::function([self](Args& a) {
        std::string sub = a.get(0, "sub").to_str();
        int64_t n = 0;
        for (size_t p = 0; !sub.empty() && (p = self.s.find(sub, p)) != std::string::npos; p += sub.size())
          ++n;
        return Value::integer(n);
      });
    if (name == "join")
      return Value::function([self](Args& a) {
        Args j;
        j.pos.push_back(self);
        return apply_filter("join", a.get(0, "iterable"), j);
      });
    if (name == "splitlines")
      return Value::function([self](Args&) {
        List out = split(self, Value::string("\n"), -1);
        if (!out.empty() && out.back().s.empty()) out.pop_back();
        return Value::new_list(std::move(out));
      });
    return Value();
  }
  if (obj.type == T::kList) {
    if (name == "append")
      return Value::function([self](Args& a) {
        if (a.log) a.log->mutated(self.list);
        self.list->push_back(a.get(0, "item"));
        return Value::none();
      });
    if (name == "pop")
      return Value::function([self](Args& a) {
        BELUGA_CHECK(!self.list->empty(), "template: pop from an empty list");
        int64_t n = static_cast<int64_t>(self.list->size());
        int64_t k = as_int(a.get(0, "index"), -1);
        if (k < 0) k += n;
        BELUGA_CHECK(k >= 0 && k < n, "template: pop index out of range");
        Value out = (*self.list)[k];
        self.list->erase(self.list->begin() + k);
        return out;
      });
    if (name == "index")
      return Value::function([self](Args& a) {
        for (size_t k = 0; k < self.list->size(); ++k)
          if (equals((*self.list)[k], a.get(0, "value"))) return Value::integer(static_cast<int64_t>(k));
        fail("template: index(): value not in list");
      });
    return Value();
  }
  if (obj.type == T::kDict && !obj.is_namespace) {
    if (name == "items") return Value::function([self](Args& a) { return apply_filter("items", self, a); });
    if (name == "keys") return Value::function([self](Args&) { return Value::new_list(iterate(self)); });
    if (name == "values")
      return Value::function([self](Args&) {
        List out;
        for (const auto& [k, x] : self.dict->items) out.push_back(x);
        return Value::new_list(std::move(out));
      });
    if (name == "get")
      return Value::function([self](Args& a) {
        Value key = a.get(0, "key");
        const Value* v = key.is_string() ? self.dict->find(key.s) : nullptr;
        if (v) return *v;
        Value def = a.get(1, "default");
        return def.is_undefined() ? Value::none() : def;
      });
  }
  return Value();
}

Value global_function(const std::string& name) {
  if (name == "range")
    return Value::function([](Args& a) {
      int64_t start = 0, stop, step = 1;
      if (a.pos.size() == 1) {
        stop = as_int(a.pos[0], 0);
      } else {
        BELUGA_CHECK(a.pos.size() >= 2, "template: range() needs arguments");
        start = as_int(a.pos[0], 0);
        stop = as_int(a.pos[1], 0);
        if (a.pos.size() > 2) step = as_int(a.pos[2], 1);
      }
      BELUGA_CHECK(step != 0, "template: range() step cannot be zero");
      List out;
      for (int64_t k = start; step > 0 ? k < stop : k > stop;) {
        BELUGA_CHECK(out.size() < kMaxListItems, "template: range() of more than ", kMaxListItems, " items");
        out.push_back(Value::integer(k));
        if (__builtin_add_overflow(k, step, &k)) break;
      }
      return Value::new_list(std::move(out));
    });
  if (name == "namespace" || name == "dict")
    return Value::function([name](Args& a) {
      Value ns = Value::new_dict();
      ns.is_namespace = name == "namespace";
      for (auto& [k, v] : a.kw) ns.dict->set(k, v);
      return ns;
    });
  if (name == "raise_exception")
    return Value::function(
        [](Args& a) -> Value { fail("chat template error: ", a.get(0, "message").to_str()); });
  if (name == "strftime_now")
    return Value::function([](Args& a) {
      std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      size_t n = std::strftime(buf, sizeof buf, a.get(0, "format").to_str().c_str(), &tm);
      return Value::string(std::string(buf, n));
    });
  return Value();
}

}  // namespace beluga::recipe::jinja
