// The Jinja interpreter: walks the syntax tree with a stack of scopes. Loop bodies and macros get
// their own scope (Jinja's rule: `set` inside them does not leak out; namespace() objects are how
// templates carry state out of loops).
#include "recipe/jinja_template.h"

#include <cmath>
#include <map>

#include "recipe/jinja_builtins.h"
#include "recipe/jinja_parser.h"
#include "util/error.h"

namespace beluga::recipe::jinja {

namespace {

enum class Flow { kNormal, kBreak, kContinue };

// The interpreter recurses over the tree (at most kMaxTemplateNesting deep) and into macros; this
// bounds the whole, so a macro that calls itself without end fails cleanly instead of overflowing
// (1000 levels overflowed an 8 MiB stack under ASan; chat templates recurse a few levels at most).
constexpr int kMaxRenderDepth = 200;
// Nodes and expressions one render may evaluate: a chat template over a long conversation takes
// well under a million (measured: a 5M-step render takes ~4 s on a loaded core); loops nested to multiply
// past this are refused instead of running on.
constexpr int64_t kMaxRenderSteps = 5'000'000;

class Renderer {
 public:
  Renderer(const Dict& globals, MutationLog& log) : globals_(globals), log_(log) { scopes_.emplace_back(); }

  Flow render(const Body& body, Value& out) {
    for (const Node& n : body) {
      Flow f = render_node(n, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

 private:
  // Counts the interpreter's recursion (render_node and eval).
  struct Deeper {
    int& depth;
    Deeper(Renderer& r, int line) : depth(r.depth_) {
      if (++r.steps_ > kMaxRenderSteps)
        fail("template line ", line, ": rendering takes more than ", kMaxRenderSteps, " steps");
      if (++depth > kMaxRenderDepth)
        fail("template line ", line, ": recursion deeper than ", kMaxRenderDepth,
             " levels (a macro that calls itself without end?)");
    }
    ~Deeper() { --depth; }
  };

  Flow render_node(const Node& n, Value& out) {
    const Deeper deeper(*this, n.line);
    switch (n.kind) {
      case Node::Kind::kText:
        append_literal(n.text, out);
        return Flow::kNormal;
      case Node::Kind::kOutput: {
        Value v = eval(*n.expr);
        v.append_to(out);
        return Flow::kNormal;
      }
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches)
          if (eval(*cond).truthy()) return render(body, out);
        return render(n.else_body, out);
      case Node::Kind::kFor:
        return render_for(n, out);
      case Node::Kind::kSet: {
        Value v;
        if (n.expr) {
          v = eval(*n.expr);
        } else {
          v = Value::string("");
          scopes_.emplace_back();
          render(n.body, v);
          scopes_.pop_back();
        }
        assign(n.targets, v, n.line);
        return Flow::kNormal;
      }
      case Node::Kind::kMacro: {
        const Node* node = &n;
        scopes_.back()[n.text] = Value::function([this, node](Args& a) { return call_macro(*node, a); });
        return Flow::kNormal;
      }
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  void assign(const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      const std::string& t = targets[0];
      size_t dot = t.find('.');
      if (dot == std::string::npos) {
        scopes_.back()[t] = v;
        return;
      }
      Value ns = lookup(t.substr(0, dot));
      BELUGA_CHECK(ns.type == Value::Type::kDict && ns.is_namespace, "template line ", line,
                   ": cannot set an attribute of ", t.substr(0, dot), ", which is not a namespace()");
      log_.mutated(ns.dict);
      ns.dict->set(t.substr(dot + 1), v);
      return;
    }
    List items = iterate(v);
    BELUGA_CHECK(items.size() == targets.size(), "template line ", line, ": cannot unpack ", items.size(),
                 " values into ", targets.size(), " names");
    for (size_t k = 0; k < targets.size(); ++k) scopes_.back()[targets[k]] = items[k];
  }

  Flow render_for(const Node& n, Value& out) {
    List items = iterate(eval(*n.expr));
    if (n.filter) {  // `for x in xs if cond`: loop.* counts only the kept items
      List kept;
      for (const auto& it : items) {
        scopes_.emplace_back();
        assign(n.targets, it, n.line);
        if (eval(*n.filter).truthy()) kept.push_back(it);
        scopes_.pop_back();
      }
      items = std::move(kept);
    }
    if (items.empty()) return render(n.else_body, out);
    const int64_t len = static_cast<int64_t>(items.size());
    // One `loop` dict serves every iteration whose body kept no reference to it (the usual case):
    // building a fresh nine-entry dict per iteration was most of an empty iteration's cost.
    Value loop;
    for (int64_t k = 0; k < len; ++k) {
      const Deeper step(*this, n.line);  // an empty body still costs a step per iteration
      scopes_.emplace_back();
      if (!loop.dict || loop.dict.use_count() != 1 || loop.dict->items.size() != 9) {
        loop = Value::new_dict();
        for (const char* key :
             {"index", "index0", "revindex", "revindex0", "first", "last", "length", "previtem", "nextitem"})
          loop.dict->items.emplace_back(key, Value());
      }
      auto& e = loop.dict->items;  // in the order above
      e[0].second = Value::integer(k + 1);
      e[1].second = Value::integer(k);
      e[2].second = Value::integer(len - k);
      e[3].second = Value::integer(len - k - 1);
      e[4].second = Value::boolean(k == 0);
      e[5].second = Value::boolean(k == len - 1);
      e[6].second = Value::integer(len);
      e[7].second = k > 0 ? items[k - 1] : Value();
      e[8].second = k + 1 < len ? items[k + 1] : Value();
      scopes_.back()["loop"] = loop;
      assign(n.targets, items[k], n.line);
      Flow f = render(n.body, out);
      scopes_.pop_back();
      if (f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  Value call_macro(const Node& m, Args& a) {
    scopes_.emplace_back();
    for (size_t k = 0; k < m.params.size(); ++k) {
      Value v = a.get(k, m.params[k].first);
      if (v.is_undefined() && m.params[k].second) v = eval(*m.params[k].second);
      scopes_.back()[m.params[k].first] = v;
    }
    Value out = Value::string("");
    render(m.body, out);
    scopes_.pop_back();
    return out;
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    if (const Value* v = globals_.find(name)) return *v;
    return global_function(name);
  }

  Args eval_args(const Expr& e, size_t skip) {
    Args a;
    a.log = &log_;
    for (size_t k = skip; k < e.args.size(); ++k) a.pos.push_back(eval(*e.args[k]));
    for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x));
    return a;
  }

  Value eval(const Expr& e) {
    const Deeper deeper(*this, e.line);
    using K = Expr::Kind;
    switch (e.kind) {
      case K::kLiteral:
        return e.value;
      case K::kName:
        return lookup(e.name);
      case K::kList: {
        List items;
        for (const auto& x : e.args) items.push_back(eval(*x));
        return Value::new_list(std::move(items));
      }
      case K::kDict: {
        Value d = Value::new_dict();
        for (size_t k = 0; k + 1 < e.args.size(); k += 2)
          d.dict->set(eval(*e.args[k]).to_str(), eval(*e.args[k + 1]));
        return d;
      }
      case K::kAttr: {
        Value obj = eval(*e.args[0]);
        if (obj.type == Value::Type::kDict) {
          if (const Value* v = obj.dict->find(e.name)) return *v;
        }
        return method(obj, e.name);
      }
      case K::kItem: {
        Value obj = eval(*e.args[0]);
        Value key = eval(*e.args[1]);
        Value v = get_item(obj, key);
        if (v.is_undefined() && key.is_string()) return method(obj, key.s);
        return v;
      }
      case K::kSlice: {
        auto opt = [&](size_t k) { return e.args[k] ? eval(*e.args[k]) : Value(); };
        return slice(eval(*e.args[0]), opt(1), opt(2), opt(3));
      }
      case K::kCall: {
        Value f = eval(*e.args[0]);
        BELUGA_CHECK(f.type == Value::Type::kFunction, "template line ", e.line,
                     ": calling something that is not a function");
        Args a = eval_args(e, 1);
        return (*f.fn)(a);
      }
      case K::kFilter: {
        Value v = eval(*e.args[0]);
        Args a = eval_args(e, 1);
        return apply_filter(e.name, v, a);
      }
      case K::kTest: {
        Value v = eval(*e.args[0]);
        Args a = eval_args(e, 1);
        return Value::boolean(apply_test(e.name, v, a.pos) != e.negate);
      }
      case K::kUnary: {
        Value v = eval(*e.args[0]);
        if (e.name == "not") return Value::boolean(!v.truthy());
        if (e.name == "+") return v;
        if (v.type == Value::Type::kInt) {
          BELUGA_CHECK(v.i != INT64_MIN, "template line ", e.line, ": integer overflow");
          return Value::integer(-v.i);
        }
        return Value::real(-v.as_double());
      }
      case K::kCondExpr:
        if (eval(*e.args[0]).truthy()) return eval(*e.args[1]);
        return e.args[2] ? eval(*e.args[2]) : Value();
      case K::kBinary:
        return binary(e);
    }
    return Value();
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value a = eval(*e.args[0]);
      return a.truthy() ? eval(*e.args[1]) : a;
    }
    if (op == "or") {
      Value a = eval(*e.args[0]);
      return a.truthy() ? a : eval(*e.args[1]);
    }
    Value a = eval(*e.args[0]);
    Value b = eval(*e.args[1]);
    using T = Value::Type;
    if (op == "~") {
      Value out = Value::string("");
      a.append_to(out);
      b.append_to(out);
      return out;
    }
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        Value out = a;
        b.append_to(out);
        return out;
      }
      if (a.type == T::kList && b.type == T::kList) {
        BELUGA_CHECK(a.list->size() + b.list->size() <= kMaxListItems, "template line ", e.line,
                     ": a list of more than ", kMaxListItems, " items");
        List items = *a.list;
        items.insert(items.end(), b.list->begin(), b.list->end());
        return Value::new_list(std::move(items));
      }
    }
    if (op == "==") return Value::boolean(equals(a, b));
    if (op == "!=") return Value::boolean(!equals(a, b));
    if (op == "in" || op == "not in") return Value::boolean(apply_test("in", a, {b}) == (op == "in"));
    if (op == "<") return Value::boolean(compare(a, b) < 0);
    if (op == ">") return Value::boolean(compare(a, b) > 0);
    if (op == "<=") return Value::boolean(compare(a, b) <= 0);
    if (op == ">=") return Value::boolean(compare(a, b) >= 0);
    if (op == "*" && (a.is_string() || b.is_string())) {
      const Value& s = a.is_string() ? a : b;
      int64_t n = a.is_string() ? (b.type == T::kInt ? b.i : 0) : (a.type == T::kInt ? a.i : 0);
      BELUGA_CHECK(n <= 0 || s.s.size() <= kMaxStringBytes / uint64_t(n), "template line ", e.line,
                   ": a string longer than ", kMaxStringBytes >> 20, " MiB");
      std::string out;
      if (!s.s.empty()) {  // an empty string repeats to itself at once, however large n is
        out.reserve(s.s.size() * size_t(std::max<int64_t>(n, 0)));
        for (int64_t k = 0; k < n; ++k) out += s.s;
      }
      return Value::string(out, s.has_data());
    }
    BELUGA_CHECK((a.is_number() || a.type == T::kBool) && (b.is_number() || b.type == T::kBool),
                 "template line ", e.line, ": unsupported operands for '", op, "'");
    bool ints = (a.type == T::kInt || a.type == T::kBool) && (b.type == T::kInt || b.type == T::kBool);
    int64_t x = a.type == T::kBool ? a.b : a.i, y = b.type == T::kBool ? b.b : b.i;
    double fx = a.as_double(), fy = b.as_double();
    // Python integers do not overflow; int64 ones must not either (undefined behaviour).
    int64_t r = 0;
    auto exact = [&](bool overflow) {
      BELUGA_CHECK(!overflow, "template line ", e.line, ": integer overflow");
      return Value::integer(r);
    };
    if (op == "+") return ints ? exact(__builtin_add_overflow(x, y, &r)) : Value::real(fx + fy);
    if (op == "-") return ints ? exact(__builtin_sub_overflow(x, y, &r)) : Value::real(fx - fy);
    if (op == "*") return ints ? exact(__builtin_mul_overflow(x, y, &r)) : Value::real(fx * fy);
    if (op == "/") {
      BELUGA_CHECK(fy != 0, "template line ", e.line, ": division by zero");
      return Value::real(fx / fy);
    }
    if (op == "//" || op == "%") {
      BELUGA_CHECK(fy != 0, "template line ", e.line, ": division by zero");
      if (ints) {
        BELUGA_CHECK(!(x == INT64_MIN && y == -1), "template line ", e.line, ": integer overflow");
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;  // Python floors
        return op == "//" ? Value::integer(q) : Value::integer(x - q * y);
      }
      double q = std::floor(fx / fy);
      return op == "//" ? Value::real(q) : Value::real(fx - q * fy);
    }
    if (op == "**") {
      const double p = std::pow(fx, fy);
      if (!ints || y < 0) return Value::real(p);
      BELUGA_CHECK(p >= -9.2e18 && p <= 9.2e18, "template line ", e.line, ": integer overflow");
      return Value::integer(static_cast<int64_t>(p));
    }
    fail("template line ", e.line, ": unknown operator ", op);
  }

  const Dict& globals_;
  MutationLog& log_;
  std::vector<std::map<std::string, Value>> scopes_;
  int depth_ = 0;
  int64_t steps_ = 0;
};

}  // namespace

Template::Template(std::string_view source) : root_(std::make_shared<const Body>(parse_template(source))) {}

Value Template::render(const Dict& context) const {
  MutationLog log;  // declared first, so it is destroyed after the renderer's scopes (jinja_value.h)
  Renderer r(context, log);
  Value out = Value::string("");
  r.render(*root_, out);
  return out;
}

}  // namespace beluga::recipe::jinja
