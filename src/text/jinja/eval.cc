#include "text/jinja/eval.h"

#include <exception>
#include <new>

#include "base/error.h"

namespace hyperion::text::jinja {
namespace {
// Nested evaluations (statements, expressions, calls) the interpreter allows: bounds its
// native stack whatever the template and the limits.
constexpr int kMaxEvalDepth = 1500;
}  // namespace

struct Interp::DepthGuard {
  Interp& in;
  explicit DepthGuard(Interp& interp) : in(interp) {
    HYP_CHECK(++in.depth_ <= kMaxEvalDepth, "template evaluation nests deeper than {} levels",
              kMaxEvalDepth);
  }
  ~DepthGuard() { --in.depth_; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;
};

Interp::Interp(const RenderOptions& options, const std::string& origin)
    : options_(options), origin_(origin) {}

Interp::~Interp() {
  // Namespaces may hold each other (ns.a = ns): empty them so the cycles free.
  for (Value& ns : namespaces_) ns.dict_obj().clear();
}

void Interp::charge(int64_t steps) {
  steps_ += steps;
  HYP_CHECK(steps_ <= options_.max_steps,
            "the template ran more than {} steps (RenderOptions::max_steps)", options_.max_steps);
}

void Interp::check_string(size_t bytes) {
  HYP_CHECK(bytes <= options_.max_output_bytes,
            "a string of {} bytes exceeds the {}-byte limit (RenderOptions::max_output_bytes)",
            bytes, options_.max_output_bytes);
  charge(static_cast<int64_t>(bytes / 64));
}

Value Interp::make_namespace() {
  Value ns = Value::namespace_obj();
  namespaces_.push_back(ns);
  return ns;
}

void Interp::emit(std::string_view text) {
  check_string(out_->size() + text.size());
  out_->append(text);
}

std::string Interp::render(const Body& body, const Value& context) {
  auto globals = std::make_shared<Scope>();
  add_globals(*globals);
  auto top = std::make_shared<Scope>();
  top->parent = globals;
  if (context.is_dict()) {
    for (const auto& [k, v] : context.dict_obj().items())
      if (k.is_string()) top->vars[k.str()] = v;
  } else if (!context.is_undefined() && !context.is_none()) {
    fail("{}: the render context must be a dict, not {}", origin_, context.type_name());
  }
  std::string out;
  out_ = &out;
  try {
    exec(body, top);
  } catch (const std::bad_alloc&) {
    fail("{}:{}:{}: out of memory", origin_, pos_.line, pos_.col);
  } catch (const std::exception& e) {
    fail("{}:{}:{}: {}", origin_, pos_.line, pos_.col, e.what());
  }
  return out;
}

// ---- statements -------------------------------------------------------------------------

Interp::Flow Interp::exec(const Body& body, const std::shared_ptr<Scope>& scope) {
  for (const auto& s : body) {
    const Flow f = exec_stmt(*s, scope);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Interp::Flow Interp::exec_stmt(const Stmt& s, const std::shared_ptr<Scope>& scope) {
  DepthGuard guard(*this);
  charge(1);
  pos_ = s.pos;
  switch (s.kind) {
    case Stmt::Kind::kText:
      emit(s.text);
      break;
    case Stmt::Kind::kOutput: {
      const Value v = eval(*s.expr, scope);
      if (v.is_string()) {
        emit(v.str());
      } else {
        emit(v.to_str());
      }
      break;
    }
    case Stmt::Kind::kIf:
      for (size_t i = 0; i < s.conds.size(); ++i)
        if (eval(*s.conds[i], scope).truthy()) return exec(s.bodies[i], scope);
      return exec(s.else_body, scope);
    case Stmt::Kind::kFor:
      return exec_for(s, scope);
    case Stmt::Kind::kSet:
      exec_set(s.target, eval(*s.expr, scope), scope);
      break;
    case Stmt::Kind::kSetBlock: {
      Value v(capture(s.body, scope));
      if (s.expr) {
        block_value_ = &v;
        v = eval(*s.expr, scope);
        block_value_ = nullptr;
      }
      exec_set(s.target, std::move(v), scope);
      break;
    }
    case Stmt::Kind::kFilterBlock: {
      const Value v(capture(s.body, scope));
      block_value_ = &v;
      const Value r = eval(*s.expr, scope);
      block_value_ = nullptr;
      emit(r.to_str());
      break;
    }
    case Stmt::Kind::kMacro:
      define_macro(s, scope);
      break;
    case Stmt::Kind::kBreak:
      return Flow::kBreak;
    case Stmt::Kind::kContinue:
      return Flow::kContinue;
  }
  return Flow::kNormal;
}

std::string Interp::capture(const Body& body, const std::shared_ptr<Scope>& scope) {
  std::string buf;
  std::string* saved = out_;
  out_ = &buf;
  try {
    exec(body, scope);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buf;
}

namespace {
Value make_loop(const std::vector<Value>& items, size_t i) {
  auto d = std::make_shared<DictObj>();
  const auto n = static_cast<int64_t>(items.size());
  const auto k = static_cast<int64_t>(i);
  d->set("index", Value(k + 1));
  d->set("index0", Value(k));
  d->set("revindex", Value(n - k));
  d->set("revindex0", Value(n - k - 1));
  d->set("first", Value(k == 0));
  d->set("last", Value(k == n - 1));
  d->set("length", Value(n));
  d->set("depth", Value(1));
  d->set("depth0", Value(0));
  d->set("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
  d->set("nextitem",
         i + 1 < items.size() ? items[i + 1] : Value::undefined("there is no next item"));
  d->set("cycle", Value::function("loop.cycle", [k](Interp&, CallArgs& a) -> Value {
           HYP_CHECK(!a.pos.empty(), "no items for cycling given");
           return a.pos[static_cast<size_t>(k) % a.pos.size()];
         }));
  return Value::dict(std::move(d));
}
}  // namespace

Interp::Flow Interp::exec_for(const Stmt& s, const std::shared_ptr<Scope>& scope) {
  const Value seq = eval(*s.expr, scope);
  std::vector<Value> items = iterate(seq);
  if (s.cond) {  // `for x in xs if cond`: filtered before the loop, so loop.length counts
    std::vector<Value> kept;
    for (Value& v : items) {
      charge(1);
      auto tmp = std::make_shared<Scope>();
      tmp->parent = scope;
      exec_set(s.target, v, tmp);
      if (eval(*s.cond, tmp).truthy()) kept.push_back(std::move(v));
    }
    items = std::move(kept);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    charge(1);
    auto iter = std::make_shared<Scope>();
    iter->parent = scope;
    if (s.uses_loop) iter->vars["loop"] = make_loop(items, i);
    pos_ = s.pos;
    exec_set(s.target, items[i], iter);
    if (exec(s.body, iter) == Flow::kBreak) break;
  }
  if (items.empty()) return exec(s.else_body, scope);
  return Flow::kNormal;
}

void Interp::exec_set(const Target& t, Value v, const std::shared_ptr<Scope>& scope) {
  if (!t.attr.empty()) {
    const Value ns = lookup(t.names[0], *scope);
    HYP_CHECK(ns.is_namespace(), "cannot assign attribute on non-namespace object ('{}' is {})",
              t.names[0], ns.is_undefined() ? "undefined" : ns.type_name());
    ns.dict_obj().set(Value(t.attr), std::move(v));
    return;
  }
  if (!t.tuple) {
    scope->vars[t.names[0]] = std::move(v);
    return;
  }
  if (v.is_undefined()) undefined_error(v);
  HYP_CHECK(v.is_list() || v.is_string() || v.is_dict(), "cannot unpack non-iterable {} object",
            v.type_name());
  std::vector<Value> parts = iterate(v);
  HYP_CHECK(parts.size() >= t.names.size(), "not enough values to unpack (expected {}, got {})",
            t.names.size(), parts.size());
  HYP_CHECK(parts.size() <= t.names.size(), "too many values to unpack (expected {})",
            t.names.size());
  for (size_t i = 0; i < parts.size(); ++i) scope->vars[t.names[i]] = std::move(parts[i]);
}

void Interp::define_macro(const Stmt& s, const std::shared_ptr<Scope>& scope) {
  const Stmt* node = &s;
  std::weak_ptr<Scope> defined_in = scope;
  scope->vars[s.text] = Value::function(s.text, [node, defined_in](Interp& in, CallArgs& args) {
    return in.call_macro(*node, defined_in, args);
  });
}

Value Interp::call_macro(const Stmt& s, const std::weak_ptr<Scope>& defined_in, CallArgs& args) {
  auto parent = defined_in.lock();
  HYP_CHECK(parent != nullptr, "macro '{}' is called after the scope it was defined in has ended",
            s.text);
  HYP_CHECK(args.pos.size() <= s.params.size(), "macro '{}' takes not more than {} argument(s)",
            s.text, s.params.size());
  auto scope = std::make_shared<Scope>();
  scope->parent = parent;
  std::vector<bool> given(s.params.size(), false);
  for (size_t i = 0; i < args.pos.size(); ++i) {
    scope->vars[s.params[i].first] = args.pos[i];
    given[i] = true;
  }
  for (auto& [key, value] : args.kw) {
    size_t i = 0;
    while (i < s.params.size() && s.params[i].first != key) ++i;
    HYP_CHECK(i < s.params.size(), "macro '{}' takes no keyword argument '{}'", s.text, key);
    HYP_CHECK(!given[i], "macro '{}' got multiple values for argument '{}'", s.text, key);
    scope->vars[key] = value;
    given[i] = true;
  }
  for (size_t i = 0; i < s.params.size(); ++i) {
    if (given[i]) continue;
    const auto& [name, def] = s.params[i];
    scope->vars[name] = def ? eval(*def, scope) : Value::undefined("'" + name + "' is undefined");
  }
  return Value(capture(s.body, scope));
}

// ---- expressions ------------------------------------------------------------------------

Value Interp::lookup(const std::string& name, const Scope& scope) {
  for (const Scope* s = &scope; s != nullptr; s = s->parent.get()) {
    const auto it = s->vars.find(name);
    if (it != s->vars.end()) return it->second;
  }
  return Value::undefined("'" + name + "' is undefined");
}

Value Interp::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) undefined_error(callee);
  HYP_CHECK(callee.is_function(), "'{}' object is not callable", callee.type_name());
  HYP_CHECK(call_depth_ < options_.max_call_depth,
            "calls nest deeper than {} (RenderOptions::max_call_depth)", options_.max_call_depth);
  ++call_depth_;
  struct Leave {
    int& d;
    ~Leave() { --d; }
  } leave{call_depth_};
  return callee.function().fn(*this, args);
}

Value Interp::apply_filter(const std::string& name, const Value& subject, CallArgs& args) {
  const FilterFn f = find_filter(name);
  HYP_CHECK(f != nullptr, "no filter named '{}'", name);
  return f(*this, subject, args);
}

bool Interp::apply_test(const std::string& name, const Value& subject, CallArgs& args) {
  const TestFn t = find_test(name);
  HYP_CHECK(t != nullptr, "no test named '{}'", name);
  return t(*this, subject, args);
}

void Interp::eval_args(const Expr& e, size_t first, CallArgs& out,
                       const std::shared_ptr<Scope>& scope) {
  for (size_t i = first; i < e.args.size(); ++i) out.pos.push_back(eval(*e.args[i], scope));
  for (const auto& [k, v] : e.kwargs) out.kw.emplace_back(k, eval(*v, scope));
}

Value Interp::eval_call(const Expr& e, const std::shared_ptr<Scope>& scope) {
  const Value callee = eval(*e.args[0], scope);
  CallArgs args;
  eval_args(e, 1, args, scope);
  pos_ = e.pos;
  return call(callee, args);
}

Value Interp::eval_compare(const Expr& e, const std::shared_ptr<Scope>& scope) {
  Value left = eval(*e.args[0], scope);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.args[i + 1], scope);
    pos_ = e.pos;
    const std::string& op = e.ops[i];
    bool r = false;
    if (op == "==") {
      r = left == right;
    } else if (op == "!=") {
      r = left != right;
    } else if (op == "in" || op == "notin") {
      r = contains(right, left) == (op == "in");
    } else {
      if (left.is_undefined()) undefined_error(left);
      if (right.is_undefined()) undefined_error(right);
      const int c = Value::compare(left, right);
      r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    }
    if (!r) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

Value Interp::eval(const Expr& e, const std::shared_ptr<Scope>& scope) {
  DepthGuard guard(*this);
  charge(1);
  pos_ = e.pos;
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.value;
    case Expr::Kind::kName:
      return lookup(e.name, *scope);
    case Expr::Kind::kBlockValue:
      return block_value_ != nullptr ? *block_value_ : Value();
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.args.size());
      for (const auto& a : e.args) items.push_back(eval(*a, scope));
      return Value::list(std::move(items), e.kind == Expr::Kind::kTuple);
    }
    case Expr::Kind::kDict: {
      Value d = Value::dict();
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value k = eval(*e.args[i], scope);
        Value v = eval(*e.args[i + 1], scope);
        pos_ = e.args[i]->pos;
        d.dict_obj().set(k, std::move(v));
      }
      return d;
    }
    case Expr::Kind::kGetAttr: {
      const Value obj = eval(*e.args[0], scope);
      pos_ = e.pos;
      return get_attr(obj, e.name);
    }
    case Expr::Kind::kGetItem: {
      const Value obj = eval(*e.args[0], scope);
      const Value key = eval(*e.args[1], scope);
      pos_ = e.pos;
      return get_item(obj, key);
    }
    case Expr::Kind::kSlice: {
      const Value obj = eval(*e.args[0], scope);
      Value parts[3];
      for (size_t i = 0; i < 3; ++i)
        parts[i] = e.args[i + 1] ? eval(*e.args[i + 1], scope) : Value::none();
      pos_ = e.pos;
      return slice_value(*this, obj, parts[0], parts[1], parts[2]);
    }
    case Expr::Kind::kCall:
      return eval_call(e, scope);
    case Expr::Kind::kFilter: {
      const Value subject = eval(*e.args[0], scope);
      CallArgs args;
      eval_args(e, 1, args, scope);
      pos_ = e.pos;
      return apply_filter(e.name, subject, args);
    }
    case Expr::Kind::kTest: {
      const Value subject = eval(*e.args[0], scope);
      CallArgs args;
      eval_args(e, 1, args, scope);
      pos_ = e.pos;
      return Value(apply_test(e.name, subject, args) != e.negated);
    }
    case Expr::Kind::kNot:
      return Value(!eval(*e.args[0], scope).truthy());
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      const Value v = eval(*e.args[0], scope);
      pos_ = e.pos;
      if (v.is_undefined()) undefined_error(v);
      HYP_CHECK(v.is_number(), "bad operand type for unary {}: '{}'",
                e.kind == Expr::Kind::kNeg ? '-' : '+', v.type_name());
      if (e.kind == Expr::Kind::kPos) return v.is_bool() ? Value(v.as_int()) : v;
      if (v.is_float()) return Value(-v.as_float());
      return binary_op(*this, "-", Value(0), v);
    }
    case Expr::Kind::kBinary: {
      const Value a = eval(*e.args[0], scope);
      const Value b = eval(*e.args[1], scope);
      pos_ = e.pos;
      return binary_op(*this, e.name, a, b);
    }
    case Expr::Kind::kAnd: {
      Value a = eval(*e.args[0], scope);
      return a.truthy() ? eval(*e.args[1], scope) : a;
    }
    case Expr::Kind::kOr: {
      Value a = eval(*e.args[0], scope);
      return a.truthy() ? a : eval(*e.args[1], scope);
    }
    case Expr::Kind::kCompare:
      return eval_compare(e, scope);
    case Expr::Kind::kCond:
      if (eval(*e.args[1], scope).truthy()) return eval(*e.args[0], scope);
      if (e.args[2]) return eval(*e.args[2], scope);
      return Value::undefined("the inline if expression on line " + std::to_string(e.pos.line) +
                              " evaluated to false and no else section was defined.");
  }
  return Value();
}

// ---- the public face --------------------------------------------------------------------

struct Template::Parsed {
  Body body;
};

Template Template::parse(std::string_view source, std::string origin) {
  Template t;
  t.origin_ = std::make_shared<const std::string>(std::move(origin));
  auto parsed = std::make_shared<Parsed>();
  parsed->body = parse_template(source, *t.origin_);
  t.parsed_ = std::move(parsed);
  return t;
}

std::string Template::render(const Value& context, const RenderOptions& options) const {
  Interp in(options, *origin_);
  return in.render(parsed_->body, context);
}

namespace {
template <typename Json>
Value json_to_value(const Json& j, int depth) {
  HYP_CHECK(depth < kMaxValueDepth, "JSON nests deeper than {} levels", kMaxValueDepth);
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.template get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<int64_t>(u));
      return Value(static_cast<double>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(json_to_value(x, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value d = Value::dict();
      for (auto it = j.begin(); it != j.end(); ++it)
        d.dict_obj().set(Value(it.key()), json_to_value(it.value(), depth + 1));
      return d;
    }
    default:
      fail("JSON value of type {} has no template value", j.type_name());
  }
}
}  // namespace

Value from_json(const nlohmann::ordered_json& json) {
  return json_to_value(json, 0);
}
Value from_json(const nlohmann::json& json) {
  return json_to_value(json, 0);
}

}  // namespace hyperion::text::jinja
