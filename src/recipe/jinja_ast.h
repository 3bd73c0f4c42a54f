// Syntax tree of a parsed Jinja template (internal to the Jinja interpreter).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "recipe/jinja_value.h"

namespace beluga::recipe::jinja {

// How deeply a template may nest expressions and blocks. The parser and the interpreter recurse
// over the tree, so a hostile template (`((((...`, `1+1+...+1`, 10,000 nested ifs) is refused when
// parsed instead of overflowing the stack; real chat templates nest fewer than 20 levels.
inline constexpr int kMaxTemplateNesting = 100;

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // value
    kName,      // name
    kList,      // args
    kDict,      // kwargs-like pairs: keys in args[2k], values in args[2k+1]
    kAttr,      // args[0].name
    kItem,      // args[0][args[1]]
    kSlice,     // args[0][args[1]:args[2]:args[3]] (null = omitted)
    kCall,      // args[0](args[1..], kwargs)
    kFilter,    // args[0] | name(args[1..], kwargs)
    kTest,      // args[0] is [not] name(args[1..])
    kUnary,     // name = "not" | "-" | "+"
    kBinary,    // name = operator
    kCondExpr,  // args[1] if args[0] else args[2] (args[2] may be null)
  };
  Kind kind = Kind::kLiteral;
  Value value;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negate = false;
  int line = 0;
  int depth = 1;  // height of this subtree (bounded by the parser: kMaxTemplateNesting)
};

struct Node;
using Body = std::vector<Node>;

struct Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kMacro, kBreak, kContinue };
  Kind kind = Kind::kText;
  int line = 0;
  std::string text;                                     // kText; kMacro name
  ExprPtr expr;                                         // kOutput, kFor iterable, kSet value
  std::vector<std::pair<ExprPtr, Body>> branches;       // kIf: (condition, body)...
  Body body;                                            // kFor, kMacro, kSet (block form)
  Body else_body;                                       // kIf, kFor
  std::vector<std::string> targets;                     // kFor / kSet names (tuple unpacking); kSet "ns.attr"
  ExprPtr filter;                                       // kFor `if` condition
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro parameters and defaults
};

}  // namespace beluga::recipe::jinja
