#include "recipe/jinja_value.h"

#include <cmath>
#include <cstdio>

#include "util/error.h"

namespace beluga::recipe::jinja {

const Value* Dict::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

void MutationLog::mutated(const std::shared_ptr<List>& l) {
  if (l.get() == last_) return;
  last_ = l.get();
  lists_.push_back(l);
}

void MutationLog::mutated(const std::shared_ptr<Dict>& d) {
  if (d.get() == last_) return;
  last_ = d.get();
  dicts_.push_back(d);
}

MutationLog::~MutationLog() {
  // Emptying one may free others (their weak pointers expire); the deleters below free deep values
  // without recursion.
  for (auto& w : lists_)
    if (auto l = w.lock()) l->clear();
  for (auto& w : dicts_)
    if (auto d = w.lock()) d->items.clear();
}

namespace {

// Lists and dicts are freed with an explicit stack: a value a template nests 100,000 deep (one more
// level per loop iteration) would otherwise be destroyed by one recursive destructor call per level.
// Each container hands its items to the stack before it is deleted, so a nested container is, when
// its turn comes, either shared (only its count drops) or already empty.
bool holds_containers(const Value& v) {
  return (v.list && !v.list->empty()) || (v.dict && !v.dict->items.empty());
}

void free_items(std::vector<Value> work) {
  while (!work.empty()) {
    Value v = std::move(work.back());
    work.pop_back();
    if (v.list && v.list.use_count() == 1) {
      for (auto& x : *v.list)
        if (holds_containers(x)) work.push_back(std::move(x));
      v.list->clear();
    }
    if (v.dict && v.dict.use_count() == 1) {
      for (auto& [k, x] : v.dict->items)
        if (holds_containers(x)) work.push_back(std::move(x));
      v.dict->items.clear();
    }
  }  // v's containers are empty or shared here: freeing them recurses at most one level
}

struct ListDeleter {
  void operator()(List* l) const {
    std::vector<Value> work;
    for (auto& x : *l)
      if (holds_containers(x)) work.push_back(std::move(x));
    delete l;
    free_items(std::move(work));
  }
};

struct DictDeleter {
  void operator()(Dict* d) const {
    std::vector<Value> work;
    for (auto& [k, x] : d->items)
      if (holds_containers(x)) work.push_back(std::move(x));
    delete d;
    free_items(std::move(work));
  }
};

}  // namespace

Value Value::none() {
  Value v;
  v.type = Type::kNone;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.type = Type::kBool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.type = Type::kInt;
  v.i = x;
  return v;
}
Value Value::real(double x) {
  Value v;
  v.type = Type::kFloat;
  v.f = x;
  return v;
}
Value Value::string(std::string x, bool is_data) {
  Value v;
  v.type = Type::kString;
  if (is_data && !x.empty()) v.data.push_back({0, x.size()});
  v.s = std::move(x);
  return v;
}
Value Value::new_list(List items) {
  Value v;
  v.type = Type::kList;
  v.list = std::shared_ptr<List>(new List(std::move(items)), ListDeleter{});
  return v;
}
Value Value::new_dict() {
  Value v;
  v.type = Type::kDict;
  v.dict = std::shared_ptr<Dict>(new Dict(), DictDeleter{});
  return v;
}
Value Value::function(Function f) {
  Value v;
  v.type = Type::kFunction;
  v.fn = std::make_shared<Function>(std::move(f));
  return v;
}

bool Value::truthy() const {
  switch (type) {
    case Type::kUndefined:
    case Type::kNone:
      return false;
    case Type::kBool:
      return b;
    case Type::kInt:
      return i != 0;
    case Type::kFloat:
      return f != 0;
    case Type::kString:
      return !s.empty();
    case Type::kList:
      return !list->empty();
    case Type::kDict:
      return !dict->items.empty();
    case Type::kFunction:
      return true;
  }
  return false;
}

double Value::as_double() const {
  if (type == Type::kInt) return static_cast<double>(i);
  if (type == Type::kFloat) return f;
  if (type == Type::kBool) return b ? 1 : 0;
  fail("template: expected a number");
}

namespace {

std::string float_str(double f) {
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (std::isnan(f)) return "nan";
  char buf[32];
  for (int prec = 1; prec <= 17; ++prec) {  // shortest text that reads back the same, as Python
    std::snprintf(buf, sizeof buf, "%.*g", prec, f);
    if (std::strtod(buf, nullptr) == f) break;
  }
  std::string s = buf;
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

namespace {

void check_depth(int depth) {
  if (depth > kMaxValueDepth) fail("template: a value nested deeper than ", kMaxValueDepth, " levels");
}

std::string repr_at(const Value& v, int depth);

std::string to_str_at(const Value& v, int depth) {
  using Type = Value::Type;
  switch (v.type) {
    case Type::kUndefined:
      return "";
    case Type::kNone:
      return "None";
    case Type::kBool:
      return v.b ? "True" : "False";
    case Type::kInt:
      return std::to_string(v.i);
    case Type::kFloat:
      return float_str(v.f);
    case Type::kString:
      return v.s;
    case Type::kList: {
      check_depth(++depth);
      std::string out = "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += repr_at((*v.list)[k], depth);
      }
      return out + "]";
    }
    case Type::kDict: {
      check_depth(++depth);
      std::string out = "{";
      bool first = true;
      for (const auto& [key, x] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += Value::string(key).repr() + ": " + repr_at(x, depth);
      }
      return out + "}";
    }
    case Type::kFunction:
      return "<function>";
  }
  return "";
}

std::string repr_at(const Value& v, int depth) {
  if (v.type != Value::Type::kString) return to_str_at(v, depth);
  const std::string& s = v.s;
  char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == q || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  out += q;
  return out;
}

bool contains_data_at(const Value& v, int depth) {
  switch (v.type) {
    case Value::Type::kString:
      return v.has_data();
    case Value::Type::kList:
      check_depth(++depth);
      for (const auto& x : *v.list)
        if (contains_data_at(x, depth)) return true;
      return false;
    case Value::Type::kDict:
      check_depth(++depth);
      if (v.dict->data_keys && !v.dict->items.empty()) return true;
      for (const auto& [k, x] : v.dict->items)
        if (contains_data_at(x, depth)) return true;
      return false;
    default:
      return false;
  }
}

bool equals_at(const Value& a, const Value& b, int depth) {
  using T = Value::Type;
  if (a.is_number() && b.is_number()) return a.as_double() == b.as_double();
  if (a.type == T::kBool && b.type == T::kBool) return a.b == b.b;
  if (a.type != b.type) return false;
  switch (a.type) {
    case T::kUndefined:
    case T::kNone:
      return true;
    case T::kString:
      return a.s == b.s;
    case T::kList:
      check_depth(++depth);
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equals_at((*a.list)[k], (*b.list)[k], depth)) return false;
      return true;
    case T::kDict:
      check_depth(++depth);
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equals_at(v, *o, depth)) return false;
      }
      return true;
    default:
      return a.fn == b.fn;
  }
}

}  // namespace

std::string Value::to_str() const {
  return to_str_at(*this, 0);
}

std::string Value::repr() const {
  return repr_at(*this, 0);
}

void append_literal(std::string_view text, Value& out) {
  if (out.s.size() + text.size() > kMaxStringBytes)
    fail("template: a string longer than ", kMaxStringBytes >> 20, " MiB");
  out.s += text;
}

void Value::append_to(Value& out) const {
  if (type == Type::kString) {
    size_t base = out.s.size();
    append_literal(s, out);
    for (const Range& r : data) {
      if (!out.data.empty() && out.data.back().end == base + r.begin) {
        out.data.back().end = base + r.end;  // keep ranges merged
      } else {
        out.data.push_back({base + r.begin, base + r.end});
      }
    }
    return;
  }
  // A printed container that holds any data counts as data as a whole.
  Value::string(to_str(), contains_data(*this)).append_to(out);
}

bool contains_data(const Value& v) {
  return contains_data_at(v, 0);
}

bool equals(const Value& a, const Value& b) {
  return equals_at(a, b, 0);
}

int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  if (a.type == Value::Type::kBool && b.type == Value::Type::kBool) return int(a.b) - int(b.b);
  fail("template: cannot compare these values");
}

Value Args::get(size_t index, const std::string& name) const {
  for (const auto& [k, v] : kw)
    if (k == name) return v;
  if (index < pos.size()) return pos[index];
  return Value();
}

}  // namespace beluga::recipe::jinja
