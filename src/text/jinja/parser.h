// The Jinja syntax tree and its parser (jinja2's grammar and operator precedence:
// `a + b | trim` is `a + (b | trim)`, `not x is defined` is `not (x is defined)`, `**` is
// left-associative, `for x in y if c` filters, `x if c` has an optional else).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/lexer.h"
#include "text/jinja/value.h"

namespace hyperion::text::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind : uint8_t {
    kLiteral,     // value
    kName,        // name
    kList,        // args
    kTuple,       // args
    kDict,        // args: key, value, key, value...
    kGetAttr,     // args[0].name
    kGetItem,     // args[0][args[1]]
    kSlice,       // args[0][args[1]:args[2]:args[3]] (null for an omitted part)
    kCall,        // args[0](args[1:], kwargs)
    kFilter,      // args[0] | name(args[1:], kwargs)
    kTest,        // args[0] is [not] name(args[1:]); negated
    kNot,         // not args[0]
    kNeg,         // -args[0]
    kPos,         // +args[0]
    kBinary,      // args[0] name args[1]: + - * / // % ** ~
    kAnd,         // args[0] and args[1]
    kOr,          // args[0] or args[1]
    kCompare,     // args[0] ops[0] args[1] ops[1] args[2]...: == != < <= > >= in notin
    kCond,        // args[0] if args[1] else args[2] (args[2] null: undefined)
    kBlockValue,  // the captured body of a filter block or block set
  };
  Kind kind;
  Pos pos;
  std::string name;
  Value value;
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

// An assignment target: a name, a tuple of names, or a namespace attribute `ns.attr`.
struct Target {
  std::vector<std::string> names;
  bool tuple = false;
  std::string attr;  // set: names[0] is a namespace, assign its attribute
};

struct Stmt {
  enum class Kind : uint8_t {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // conds[i] -> bodies[i]; else_body
    kFor,          // for target in expr [if cond] body else else_body
    kSet,          // set target = expr
    kSetBlock,     // set target [| filters in expr] body endset
    kMacro,        // macro name(params) body
    kFilterBlock,  // filter expr body endfilter
    kBreak,
    kContinue,
  };
  Kind kind;
  Pos pos;
  bool uses_loop = false;  // for: the body names `loop`
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  Target target;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body;
  Body else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters and defaults
};

// Throws hyperion::Error "ORIGIN:LINE:COL: message" on a syntax error.
Body parse_template(std::string_view source, const std::string& origin);

}  // namespace hyperion::text::jinja
