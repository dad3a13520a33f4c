// The values a Jinja template computes with, modelled on the Python objects that jinja2
// works on: Undefined, None, bool, int (64-bit here), float, str (UTF-8), list and tuple,
// dict (insertion-ordered), namespace and callables. Lists, dicts and namespaces are
// shared by reference, as in Python; strings are immutable and shared, so copying a
// Value is O(1).
//
// Printing follows Python's str() and repr() (`['a', 1]`, `{'k': None}`, `1.0`, `1e+16`),
// JSON follows json.dumps(ensure_ascii=False) as Hugging Face's `tojson` filter calls it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

namespace hyperion::text::jinja {

class Value;
class Interp;  // the interpreter (jinja_eval.h); native functions receive it

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

using NativeFn = std::function<Value(Interp&, CallArgs&)>;

struct ListObj;
struct DictObj;
struct FuncObj {
  std::string name;
  NativeFn fn;
};
struct UndefinedT {
  std::string hint;  // what to say when it is used ("'foo' is undefined")
};
struct NoneT {};

// The deepest nesting of lists and dicts a value may have: deeper ones are refused when
// built, so printing, comparing and freeing them cannot overflow the stack.
inline constexpr int kMaxValueDepth = 400;

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kFunction
  };

  Value() : v_(UndefinedT{}) {}
  Value(NoneT) : v_(NoneT{}) {}                         // NOLINT(google-explicit-constructor)
  Value(bool b) : v_(b) {}                              // NOLINT
  Value(int i) : v_(static_cast<int64_t>(i)) {}         // NOLINT
  Value(int64_t i) : v_(i) {}                           // NOLINT
  Value(double d) : v_(d) {}                            // NOLINT
  Value(std::string s);                                 // NOLINT
  Value(std::string_view s) : Value(std::string(s)) {}  // NOLINT
  Value(const char* s) : Value(std::string(s)) {}       // NOLINT

  static Value undefined(std::string hint) { return Value(UndefinedT{std::move(hint)}); }
  static Value none() { return Value(NoneT{}); }
  // Throws when an item nests deeper than kMaxValueDepth.
  static Value list(std::vector<Value> items, bool tuple = false);
  static Value dict();  // an empty dict
  static Value dict(std::shared_ptr<DictObj> d) { return Value(std::move(d)); }
  static Value namespace_obj();
  static Value function(std::string name, NativeFn fn);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python: bool is an int
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }  // list or tuple
  bool is_tuple() const;
  bool is_dict() const;  // a dict (not a namespace)
  bool is_namespace() const;
  bool is_function() const { return kind() == Kind::kFunction; }

  bool as_bool() const { return std::get<bool>(v_); }
  // int or bool as an integer.
  int64_t as_int() const { return is_bool() ? (as_bool() ? 1 : 0) : std::get<int64_t>(v_); }
  // Any number as a double.
  double as_float() const {
    return is_float() ? std::get<double>(v_) : static_cast<double>(as_int());
  }
  const std::string& str() const { return *std::get<std::shared_ptr<const std::string>>(v_); }
  ListObj& list() const { return *std::get<std::shared_ptr<ListObj>>(v_); }
  DictObj& dict_obj() const { return *std::get<std::shared_ptr<DictObj>>(v_); }
  const std::shared_ptr<DictObj>& dict_ptr() const {
    return std::get<std::shared_ptr<DictObj>>(v_);
  }
  const FuncObj& function() const { return *std::get<std::shared_ptr<FuncObj>>(v_); }
  const std::string& undefined_hint() const { return std::get<UndefinedT>(v_).hint; }
  // Nesting of lists and dicts (0 for a scalar).
  int depth() const;

  bool truthy() const;            // Python bool()
  std::string type_name() const;  // Python's name of the type: 'str', 'dict', 'NoneType'...
  std::string to_str() const;     // Python str(); Undefined prints as ""
  std::string repr() const;       // Python repr()
  // json.dumps(value, ensure_ascii, indent, separators, sort_keys); indent < 0: none.
  struct JsonOptions {
    bool ensure_ascii = false;
    std::optional<std::string> indent;  // the indent string, or none for one line
    std::optional<std::pair<std::string, std::string>> separators;
    bool sort_keys = false;
    size_t max_bytes = SIZE_MAX;  // refused beyond this
  };
  std::string to_json(const JsonOptions& options) const;

  // Python ==, and the ordering of <, > (throws TypeError's message on mismatched types).
  friend bool operator==(const Value& a, const Value& b);
  friend bool operator!=(const Value& a, const Value& b) { return !(a == b); }
  static int compare(const Value& a, const Value& b);
  // Identity of containers, equality of scalars (Python `is` for the cases templates use).
  bool same_as(const Value& other) const;

 private:
  explicit Value(UndefinedT u) : v_(std::move(u)) {}
  explicit Value(std::shared_ptr<ListObj> l) : v_(std::move(l)) {}
  explicit Value(std::shared_ptr<DictObj> d) : v_(std::move(d)) {}
  explicit Value(std::shared_ptr<FuncObj> f) : v_(std::move(f)) {}

  std::variant<UndefinedT, NoneT, bool, int64_t, double, std::shared_ptr<const std::string>,
               std::shared_ptr<ListObj>, std::shared_ptr<DictObj>, std::shared_ptr<FuncObj>>
      v_;
};

struct ListObj {
  std::vector<Value> items;
  bool tuple = false;
  int depth = 1;
};

// An insertion-ordered dict whose keys are hashable scalars (None, bool, int, float, str);
// 1, 1.0 and True are the same key, as in Python.
struct DictObj {
  bool is_namespace = false;
  int depth = 1;

  size_t size() const { return items_.size(); }
  const std::vector<std::pair<Value, Value>>& items() const { return items_; }
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  // Throws on an unhashable key or a value nesting too deep.
  void set(const Value& key, Value value);
  void clear() {
    items_.clear();
    index_.clear();
  }

 private:
  std::vector<std::pair<Value, Value>> items_;
  std::unordered_map<std::string, size_t> index_;
};

// Python's repr of a float ('1.0', '1e+16', '0.0001', 'inf', 'nan').
std::string float_repr(double d);
// Python's repr of a str ('it\'s' -> "it's").
std::string string_repr(std::string_view s);

// UTF-8 helpers for str semantics by code point (invalid bytes count as one code point).
std::vector<uint32_t> decode_utf8(std::string_view s);
void append_utf8(std::string& out, uint32_t cp);
size_t count_code_points(std::string_view s);
// Python's str.isspace() for one code point.
bool is_py_space(uint32_t cp);

}  // namespace hyperion::text::jinja
