#include "text/jinja/parser.h"

#include <initializer_list>

#include "base/error.h"

namespace hyperion::text::jinja {
namespace {

// Nesting of statements and expressions the parser accepts (the interpreter recurses as
// deep, so this bounds its stack too).
constexpr int kMaxParseDepth = 200;

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& origin)
      : toks_(std::move(tokens)), origin_(origin) {}

  Body parse_all() {
    Body body = subparse({});
    if (cur().type != Tok::kEof) error(cur().pos, "unexpected tag '{}'", peek_block_name());
    return body;
  }

 private:
  // ---- token helpers ----
  const Token& cur() const { return toks_[i_]; }
  const Token& next_tok() const { return toks_[std::min(i_ + 1, toks_.size() - 1)]; }
  void advance() {
    if (i_ + 1 < toks_.size()) ++i_;
  }
  bool is_op(std::string_view op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(std::string_view name) const {
    return cur().type == Tok::kName && cur().text == name;
  }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    advance();
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::kEof:
        return "end of template";
      case Tok::kBlockEnd:
        return "end of statement block";
      case Tok::kVarEnd:
        return "end of print statement";
      case Tok::kText:
        return "template text";
      case Tok::kString:
        return "string literal";
      default:
        return "'" + t.text + "'";
    }
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) error(cur().pos, "expected '{}', got {}", op, describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) error(cur().pos, "expected a name, got {}", describe(cur()));
    std::string s = cur().text;
    advance();
    return s;
  }
  void expect_block_end() {
    if (cur().type != Tok::kBlockEnd)
      error(cur().pos, "expected end of statement block, got {}", describe(cur()));
    advance();
  }
  template <typename... Args>
  [[noreturn]] void error(Pos pos, fmt::format_string<Args...> f, Args&&... args) const {
    fail("{}:{}:{}: {}", origin_, pos.line, pos.col, fmt::format(f, std::forward<Args>(args)...));
  }
  std::string peek_block_name() const {
    return cur().type == Tok::kBlockBegin && next_tok().type == Tok::kName ? next_tok().text
                                                                           : describe(cur());
  }

  struct DepthGuard {
    Parser& p;
    DepthGuard(Parser& parser, Pos pos) : p(parser) {
      if (++p.depth_ > kMaxParseDepth)
        p.error(pos, "template nests deeper than {} levels", kMaxParseDepth);
    }
    ~DepthGuard() { --p.depth_; }
    DepthGuard(const DepthGuard&) = delete;
    DepthGuard& operator=(const DepthGuard&) = delete;
  };

  // Each link of a chain the parser builds in a loop (a + b + c, x.a.b, x | f | g) deepens
  // the tree as nesting does.
  void chain_link(int& links) {
    if (++links + depth_ > kMaxParseDepth)
      error(cur().pos, "template nests deeper than {} levels", kMaxParseDepth);
  }

  static ExprPtr make(Expr::Kind kind, Pos pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }
  static std::unique_ptr<Stmt> make_stmt(Stmt::Kind kind, Pos pos) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->pos = pos;
    return s;
  }

  // ---- statements ----

  // Parses until a block tag named in `ends` (left unconsumed, at its `{%`) or the end.
  Body subparse(std::initializer_list<std::string_view> ends) {
    DepthGuard guard(*this, cur().pos);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kEof) {
        if (ends.size() != 0)
          error(t.pos, "unexpected end of template: expected '{}'", *ends.begin());
        return body;
      }
      if (t.type == Tok::kText) {
        auto s = make_stmt(Stmt::Kind::kText, t.pos);
        s->text = t.text;
        body.push_back(std::move(s));
        advance();
      } else if (t.type == Tok::kVarBegin) {
        auto s = make_stmt(Stmt::Kind::kOutput, t.pos);
        advance();
        s->expr = parse_tuple(true);
        if (cur().type != Tok::kVarEnd)
          error(cur().pos, "expected end of print statement, got {}", describe(cur()));
        advance();
        body.push_back(std::move(s));
      } else if (t.type == Tok::kBlockBegin) {
        const std::string name = next_tok().type == Tok::kName ? next_tok().text : "";
        for (std::string_view e : ends)
          if (name == e) return body;
        advance();
        parse_statement(body);
      } else {
        error(t.pos, "unexpected {}", describe(t));
      }
    }
  }

  void parse_statement(Body& body) {
    const Pos pos = cur().pos;
    if (cur().type != Tok::kName) error(pos, "expected a tag name, got {}", describe(cur()));
    const std::string tag = cur().text;
    advance();
    if (tag == "for") return body.push_back(parse_for(pos));
    if (tag == "if") return body.push_back(parse_if(pos));
    if (tag == "set") return body.push_back(parse_set(pos));
    if (tag == "macro") return body.push_back(parse_macro(pos));
    if (tag == "filter") return body.push_back(parse_filter_block(pos));
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) error(pos, "'{}' outside of a loop", tag);
      expect_block_end();
      body.push_back(make_stmt(tag == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, pos));
      return;
    }
    if (tag == "generation") {  // transformers' AssistantTracker: renders its body as is
      expect_block_end();
      Body inner = subparse({"endgeneration"});
      end_tag("endgeneration");
      for (auto& s : inner) body.push_back(std::move(s));
      return;
    }
    static constexpr std::string_view kUnsupported[] = {
        "call", "include", "import", "from", "extends", "block", "with", "autoescape", "do"};
    for (std::string_view u : kUnsupported)
      if (tag == u) error(pos, "the '{}' tag is not supported in chat templates", tag);
    error(pos, "encountered unknown tag '{}'", tag);
  }

  void end_tag(std::string_view name) {
    advance();  // {%
    if (!skip_name(name)) error(cur().pos, "expected '{}'", name);
    expect_block_end();
  }

  std::unique_ptr<Stmt> parse_for(Pos pos) {
    auto s = make_stmt(Stmt::Kind::kFor, pos);
    s->target = parse_target(false);
    if (!skip_name("in")) error(cur().pos, "expected 'in', got {}", describe(cur()));
    s->expr = parse_tuple(false);
    if (skip_name("if")) s->cond = parse_expression(true);
    if (is_name("recursive")) error(cur().pos, "recursive loops are not supported");
    expect_block_end();
    ++loop_depth_;
    const int refs = loop_refs_;
    s->body = subparse({"endfor", "else"});
    s->uses_loop = loop_refs_ != refs;
    --loop_depth_;
    if (peek_block_name() == "else") {
      end_tag("else");
      s->else_body = subparse({"endfor"});
    }
    end_tag("endfor");
    return s;
  }

  std::unique_ptr<Stmt> parse_if(Pos pos) {
    auto s = make_stmt(Stmt::Kind::kIf, pos);
    while (true) {
      s->conds.push_back(parse_tuple(false));
      expect_block_end();
      s->bodies.push_back(subparse({"elif", "else", "endif"}));
      const std::string tag = peek_block_name();
      if (tag == "elif") {
        advance();
        advance();
        continue;
      }
      if (tag == "else") {
        end_tag("else");
        s->else_body = subparse({"endif"});
      }
      end_tag("endif");
      return s;
    }
  }

  std::unique_ptr<Stmt> parse_set(Pos pos) {
    Target target = parse_target(true);
    if (skip_op("=")) {
      auto s = make_stmt(Stmt::Kind::kSet, pos);
      s->target = std::move(target);
      s->expr = parse_tuple(true);
      expect_block_end();
      return s;
    }
    auto s = make_stmt(Stmt::Kind::kSetBlock, pos);
    if (target.tuple || !target.attr.empty()) error(pos, "a block set assigns a single name");
    s->target = std::move(target);
    if (skip_op("|")) s->expr = parse_filters(make(Expr::Kind::kBlockValue, cur().pos));
    expect_block_end();
    s->body = subparse({"endset"});
    end_tag("endset");
    return s;
  }

  std::unique_ptr<Stmt> parse_filter_block(Pos pos) {
    auto s = make_stmt(Stmt::Kind::kFilterBlock, pos);
    auto placeholder = make(Expr::Kind::kBlockValue, cur().pos);
    s->expr = parse_filter_chain(std::move(placeholder), false);
    expect_block_end();
    s->body = subparse({"endfilter"});
    end_tag("endfilter");
    return s;
  }

  std::unique_ptr<Stmt> parse_macro(Pos pos) {
    auto s = make_stmt(Stmt::Kind::kMacro, pos);
    s->text = expect_name();
    expect_op("(");
    while (!skip_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (skip_op(")")) break;
      std::string name = expect_name();
      ExprPtr def;
      if (skip_op("=")) def = parse_expression(true);
      s->params.emplace_back(std::move(name), std::move(def));
    }
    expect_block_end();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = subparse({"endmacro"});
    loop_depth_ = saved;
    end_tag("endmacro");
    return s;
  }

  // `name`, `a, b`, `(a, b)`, or (for set) `ns.attr`.
  Target parse_target(bool allow_attr) {
    Target t;
    const bool paren = skip_op("(");
    t.names.push_back(expect_name());
    if (allow_attr && !paren && skip_op(".")) {
      t.attr = expect_name();
      return t;
    }
    while (skip_op(",")) {
      t.tuple = true;
      if (cur().type != Tok::kName) break;
      t.names.push_back(expect_name());
    }
    if (paren) {
      expect_op(")");
      t.tuple = true;
    }
    return t;
  }

  // ---- expressions ----

  // Comma-separated expressions: a tuple when there is a comma.
  ExprPtr parse_tuple(bool with_condexpr) {
    const Pos pos = cur().pos;
    std::vector<ExprPtr> items;
    bool comma = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        comma = true;
        if (at_tuple_end()) break;
      }
      items.push_back(parse_expression(with_condexpr));
    }
    if (!comma) return std::move(items[0]);
    auto e = make(Expr::Kind::kTuple, pos);
    e->args = std::move(items);
    return e;
  }
  bool at_tuple_end() const {
    const Tok t = cur().type;
    return t == Tok::kVarEnd || t == Tok::kBlockEnd || t == Tok::kEof || is_op(")") || is_op("]") ||
           is_op("}") || is_name("in") || is_name("if");
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this, cur().pos);
    if (!with_condexpr) return parse_or();
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const Pos pos = cur().pos;
      advance();
      auto c = make(Expr::Kind::kCond, pos);
      ExprPtr cond = parse_or();
      ExprPtr other = skip_name("else") ? parse_expression(true) : nullptr;
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Expr::Kind kind, Pos pos, ExprPtr a, ExprPtr b, std::string op = {}) {
    auto e = make(kind, pos);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    int links = 0;
    while (is_name("or")) {
      chain_link(links);
      const Pos pos = cur().pos;
      advance();
      e = binary(Expr::Kind::kOr, pos, std::move(e), parse_and());
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    int links = 0;
    while (is_name("and")) {
      chain_link(links);
      const Pos pos = cur().pos;
      advance();
      e = binary(Expr::Kind::kAnd, pos, std::move(e), parse_not());
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this, cur().pos);
      auto e = make(Expr::Kind::kNot, cur().pos);
      advance();
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const Pos pos = cur().pos;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        advance();
      } else if (is_name("in")) {
        op = "in";
        advance();
      } else if (is_name("not") && next_tok().type == Tok::kName && next_tok().text == "in") {
        op = "notin";
        advance();
        advance();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::kCompare, pos);
        cmp->args.push_back(std::move(first));
      }
      if (cmp->ops.size() > static_cast<size_t>(kMaxParseDepth))
        error(cur().pos, "comparison chain is too long");
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    int links = 0;
    while (is_op("+") || is_op("-")) {
      chain_link(links);
      const Pos pos = cur().pos;
      std::string op = cur().text;
      advance();
      e = binary(Expr::Kind::kBinary, pos, std::move(e), parse_concat(), op);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    int links = 0;
    while (is_op("~")) {
      chain_link(links);
      const Pos pos = cur().pos;
      advance();
      e = binary(Expr::Kind::kBinary, pos, std::move(e), parse_math2(), "~");
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    int links = 0;
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      chain_link(links);
      const Pos pos = cur().pos;
      std::string op = cur().text;
      advance();
      e = binary(Expr::Kind::kBinary, pos, std::move(e), parse_pow(), op);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    int links = 0;
    while (is_op("**")) {
      chain_link(links);
      const Pos pos = cur().pos;
      advance();
      e = binary(Expr::Kind::kBinary, pos, std::move(e), parse_unary(true), "**");
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this, cur().pos);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = make(is_op("-") ? Expr::Kind::kNeg : Expr::Kind::kPos, cur().pos);
      advance();
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_chain(std::move(e), true);
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    const Pos pos = t.pos;
    if (t.type == Tok::kName) {
      auto e = make(Expr::Kind::kLiteral, pos);
      if (t.text == "true" || t.text == "True") {
        e->value = Value(true);
      } else if (t.text == "false" || t.text == "False") {
        e->value = Value(false);
      } else if (t.text == "none" || t.text == "None") {
        e->value = Value::none();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.text;
        if (t.text == "loop") ++loop_refs_;
      }
      advance();
      return e;
    }
    if (t.type == Tok::kString) {
      std::string s;
      while (cur().type == Tok::kString) {  // adjacent literals concatenate
        s += cur().text;
        advance();
      }
      auto e = make(Expr::Kind::kLiteral, pos);
      e->value = Value(std::move(s));
      return e;
    }
    if (t.type == Tok::kInt || t.type == Tok::kFloat) {
      auto e = make(Expr::Kind::kLiteral, pos);
      e->value = t.type == Tok::kInt ? Value(t.int_value) : Value(t.float_value);
      advance();
      return e;
    }
    if (skip_op("(")) {
      if (skip_op(")")) return make(Expr::Kind::kTuple, pos);
      ExprPtr e = parse_tuple(true);
      expect_op(")");
      return e;
    }
    if (skip_op("[")) {
      auto e = make(Expr::Kind::kList, pos);
      while (!skip_op("]")) {
        if (!e->args.empty()) expect_op(",");
        if (skip_op("]")) break;
        e->args.push_back(parse_expression(true));
      }
      return e;
    }
    if (skip_op("{")) {
      auto e = make(Expr::Kind::kDict, pos);
      while (!skip_op("}")) {
        if (!e->args.empty()) expect_op(",");
        if (skip_op("}")) break;
        e->args.push_back(parse_expression(true));
        expect_op(":");
        e->args.push_back(parse_expression(true));
      }
      return e;
    }
    error(pos, "unexpected {}", describe(t));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    int links = 0;
    while (true) {
      chain_link(links);
      const Pos pos = cur().pos;
      if (skip_op(".")) {
        if (cur().type == Tok::kInt) {  // x.0 is x[0]
          auto idx = make(Expr::Kind::kLiteral, cur().pos);
          idx->value = Value(cur().int_value);
          advance();
          e = binary(Expr::Kind::kGetItem, pos, std::move(e), std::move(idx));
          continue;
        }
        auto g = make(Expr::Kind::kGetAttr, pos);
        g->name = expect_name();
        g->args.push_back(std::move(e));
        e = std::move(g);
      } else if (skip_op("[")) {
        e = parse_subscript(std::move(e), pos);
      } else if (is_op("(")) {
        e = parse_call(std::move(e), Expr::Kind::kCall);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj, Pos pos) {
    DepthGuard guard(*this, pos);
    ExprPtr parts[3];
    int n = 0;
    bool slice = false;
    while (true) {
      if (n < 3 && !is_op(":") && !is_op("]")) parts[n] = parse_expression(true);
      if (skip_op(":")) {
        slice = true;
        if (++n > 2) error(cur().pos, "too many ':' in a slice");
        continue;
      }
      break;
    }
    if (!slice && is_op(",")) {  // x[a, b] subscripts with a tuple
      auto tup = make(Expr::Kind::kTuple, pos);
      tup->args.push_back(std::move(parts[0]));
      while (skip_op(",") && !is_op("]")) tup->args.push_back(parse_expression(true));
      parts[0] = std::move(tup);
    }
    expect_op("]");
    if (!slice) {
      if (!parts[0]) error(pos, "expected a subscript");
      return binary(Expr::Kind::kGetItem, pos, std::move(obj), std::move(parts[0]));
    }
    auto e = make(Expr::Kind::kSlice, pos);
    e->args.push_back(std::move(obj));
    for (auto& p : parts) e->args.push_back(std::move(p));
    return e;
  }

  // Arguments `(a, b, k=v)` into e (whose args[0] is the callee or subject).
  void parse_args(Expr& e) {
    expect_op("(");
    bool any = false;
    while (!skip_op(")")) {
      if (any) expect_op(",");
      if (skip_op(")")) break;
      any = true;
      if (is_op("*") || is_op("**"))
        error(cur().pos, "*args and **kwargs in calls are not supported");
      if (cur().type == Tok::kName && next_tok().type == Tok::kOp && next_tok().text == "=") {
        std::string key = cur().text;
        advance();
        advance();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) error(cur().pos, "positional argument after keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
  }

  ExprPtr parse_call(ExprPtr callee, Expr::Kind kind) {
    auto e = make(kind, callee->pos);
    e->args.push_back(std::move(callee));
    parse_args(*e);
    return e;
  }

  ExprPtr parse_filters(ExprPtr e) { return parse_filter_chain(std::move(e), false); }

  // `| name(args)`, `is [not] test arg`, and calls of the result, in any order.
  ExprPtr parse_filter_chain(ExprPtr e, bool with_tests) {
    bool first = !with_tests;  // a filter block starts with a bare filter name
    int links = 0;
    while (true) {
      chain_link(links);
      const Pos pos = cur().pos;
      if (first || skip_op("|")) {
        first = false;
        auto f = make(Expr::Kind::kFilter, pos);
        f->name = expect_name();
        while (skip_op(".")) f->name.append(".").append(expect_name());  // not "." + x: GCC 12 -Wrestrict
        f->args.push_back(std::move(e));
        if (is_op("(")) parse_args(*f);
        e = std::move(f);
      } else if (with_tests && is_name("is")) {
        advance();
        auto t = make(Expr::Kind::kTest, pos);
        t->negated = skip_name("not");
        t->name = expect_name();
        while (skip_op(".")) t->name.append(".").append(expect_name());  // not "." + x: GCC 12 -Wrestrict
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          parse_args(*t);
        } else if ((cur().type == Tok::kName || cur().type == Tok::kString ||
                    cur().type == Tok::kInt || cur().type == Tok::kFloat || is_op("[") ||
                    is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) error(cur().pos, "you cannot chain multiple tests with is");
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (with_tests && is_op("(")) {
        e = parse_call(std::move(e), Expr::Kind::kCall);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> toks_;
  size_t i_ = 0;
  const std::string& origin_;
  int depth_ = 0;
  int loop_depth_ = 0;
  int loop_refs_ = 0;  // `loop` names parsed so far
};

}  // namespace

Body parse_template(std::string_view source, const std::string& origin) {
  return Parser(lex(source, origin), origin).parse_all();
}

}  // namespace hyperion::text::jinja
