// The Jinja interpreter: walks the syntax tree of jinja_parser.h over Values, with
// jinja2's scoping (a for loop's body gets a fresh scope each iteration, so a `set` in it
// is not seen outside; `namespace()` objects carry state out; `if` opens no scope; a
// macro runs in a scope over the one it was defined in) and the limits of RenderOptions.
//
// Errors inside the interpreter and the builtins are thrown as plain hyperion::Error
// messages; render() prefixes the position of the expression being evaluated.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/jinja/jinja.h"
#include "text/jinja/parser.h"
#include "text/jinja/value.h"

namespace hyperion::text::jinja {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
};

class Interp {
 public:
  Interp(const RenderOptions& options, const std::string& origin);
  ~Interp();
  Interp(const Interp&) = delete;
  Interp& operator=(const Interp&) = delete;

  std::string render(const Body& body, const Value& context);

  const RenderOptions& options() const { return options_; }
  // Counts work against max_steps.
  void charge(int64_t steps);
  // A string of `bytes` is about to be built: refused beyond max_output_bytes, and its
  // length counts as work.
  void check_string(size_t bytes);
  // Calls a function value (macro, global, bound method) with the call depth checked.
  Value call(const Value& callee, CallArgs& args);
  Value apply_filter(const std::string& name, const Value& subject, CallArgs& args);
  bool apply_test(const std::string& name, const Value& subject, CallArgs& args);
  // A new namespace object; the interpreter clears them all when the render ends, which
  // frees the reference cycles a template can build through them.
  Value make_namespace();

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Flow exec(const Body& body, const std::shared_ptr<Scope>& scope);
  Flow exec_stmt(const Stmt& s, const std::shared_ptr<Scope>& scope);
  Flow exec_for(const Stmt& s, const std::shared_ptr<Scope>& scope);
  void exec_set(const Target& t, Value v, const std::shared_ptr<Scope>& scope);
  void define_macro(const Stmt& s, const std::shared_ptr<Scope>& scope);
  Value call_macro(const Stmt& s, const std::weak_ptr<Scope>& defined_in, CallArgs& args);
  std::string capture(const Body& body, const std::shared_ptr<Scope>& scope);
  void emit(std::string_view text);

  Value eval(const Expr& e, const std::shared_ptr<Scope>& scope);
  Value eval_call(const Expr& e, const std::shared_ptr<Scope>& scope);
  void eval_args(const Expr& e, size_t first, CallArgs& out, const std::shared_ptr<Scope>& scope);
  Value eval_compare(const Expr& e, const std::shared_ptr<Scope>& scope);
  static Value lookup(const std::string& name, const Scope& scope);

  struct DepthGuard;

  const RenderOptions& options_;
  const std::string& origin_;
  std::string* out_ = nullptr;
  Pos pos_;
  int64_t steps_ = 0;
  int depth_ = 0;       // nested evaluation (bounds the native stack)
  int call_depth_ = 0;  // nested macro calls
  const Value* block_value_ = nullptr;
  std::vector<Value> namespaces_;
};

// ---- the builtins (jinja_builtins.cc) ----
using FilterFn = Value (*)(Interp&, const Value& subject, CallArgs& args);
using TestFn = bool (*)(Interp&, const Value& subject, CallArgs& args);
FilterFn find_filter(const std::string& name);
TestFn find_test(const std::string& name);
// jinja2's getattr (`x.name`: an attribute or method first, then an item) and getitem
// (`x[key]`: an item first, then an attribute); both give Undefined for what is missing.
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
// The globals: range, namespace, dict, joiner, raise_exception, strftime_now.
void add_globals(Scope& scope);
// Python's `a OP b` for + - * / // % ** (throws TypeError's and ZeroDivisionError's text).
Value binary_op(Interp& in, const std::string& op, const Value& a, const Value& b);
// Python's `item in container`.
bool contains(const Value& container, const Value& item);
// The items a for loop (or list()) visits: a list's items, a dict's keys, a string's
// characters; Undefined visits nothing.
std::vector<Value> iterate(const Value& v);
// Python's obj[start:stop:step] on a list, tuple or string (None for an omitted part).
Value slice_value(Interp& in, const Value& obj, const Value& start, const Value& stop,
                  const Value& step);
// Python's str.strip family and str.split, by code point (what == nullptr: whitespace).
std::string strip_string(std::string_view s, const std::string* chars, bool left, bool right);
std::vector<Value> split_string(std::string_view s, const std::string* sep, int64_t maxsplit);
// ASCII case mapping.
std::string to_upper(std::string_view s);
std::string to_lower(std::string_view s);
// Throws the error that using an Undefined raises.
[[noreturn]] void undefined_error(const Value& v);

}  // namespace hyperion::text::jinja
