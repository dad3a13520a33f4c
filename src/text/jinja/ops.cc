// Attribute and item access, the methods of str, list and dict, and the operators.
#include <algorithm>
#include <climits>
#include <cmath>

#include "base/error.h"
#include "text/jinja/eval.h"

namespace hyperion::text::jinja {

void undefined_error(const Value& v) {
  throw Error(v.undefined_hint());
}

namespace {

std::string string_of(const std::vector<uint32_t>& cps, size_t from, size_t to) {
  std::string out;
  for (size_t i = from; i < to; ++i) append_utf8(out, cps[i]);
  return out;
}

// jinja2's name of an object's type in "has no attribute" messages.
std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  if (v.is_namespace()) return "jinja2.utils.Namespace object";
  return v.type_name() + " object";
}

Value missing(const Value& obj, const Value& name) {
  if (name.is_string())
    return Value::undefined(string_repr(object_type_repr(obj)) + " has no attribute " +
                            name.repr());
  return Value::undefined(object_type_repr(obj) + " has no element " + name.repr());
}

// Positional argument i or keyword `name`, else `def`.
Value arg(const CallArgs& a, size_t i, std::string_view name, Value def = Value::none()) {
  if (i < a.pos.size()) return a.pos[i];
  for (const auto& [k, v] : a.kw)
    if (k == name) return v;
  return def;
}

const std::string* opt_string(const Value& v, const char* what) {
  if (v.is_none()) return nullptr;
  HYP_CHECK(v.is_string(), "{} must be None or str, not {}", what, v.type_name());
  return &v.str();
}

int64_t int_arg(const Value& v, const char* what) {
  HYP_CHECK(v.is_int() || v.is_bool(), "{}: an integer is required, not '{}'", what, v.type_name());
  return v.as_int();
}

// The code point index of byte offset `at` of s.
int64_t cp_index(std::string_view s, size_t at) {
  return static_cast<int64_t>(count_code_points(s.substr(0, at)));
}

bool affix_matches(const Value& what, const std::string& s, bool prefix) {
  auto one = [&](const Value& p) {
    HYP_CHECK(p.is_string(), "{} first arg must be str or a tuple of str, not {}",
              prefix ? "startswith" : "endswith", p.type_name());
    const std::string& x = p.str();
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0
                  : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (what.is_tuple()) {
    for (const Value& p : what.list().items)
      if (one(p)) return true;
    return false;
  }
  return one(what);
}

std::string replace_all(Interp& in, const std::string& s, const std::string& old,
                        const std::string& repl, int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {  // Python inserts `repl` around every code point
    const auto cps = decode_utf8(s);
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      if (i < cps.size()) append_utf8(out, cps[i]);
      in.check_string(out.size());
    }
    return out;
  }
  size_t from = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, from);
    if (at == std::string::npos) break;
    out.append(s, from, at - from);
    out += repl;
    in.check_string(out.size());
    from = at + old.size();
    ++done;
  }
  out.append(s, from, std::string::npos);
  in.check_string(out.size());
  return out;
}

std::string title_case(std::string_view s) {  // Python's str.title (ASCII letters)
  std::string out(s);
  bool prev_cased = false;
  for (char& c : out) {
    const bool lower = c >= 'a' && c <= 'z', upper = c >= 'A' && c <= 'Z';
    if (lower && !prev_cased) c = static_cast<char>(c - 32);
    if (upper && prev_cased) c = static_cast<char>(c + 32);
    prev_cased = lower || upper;
  }
  return out;
}

// Python's '...'.format(*args, **kwargs) for `{}`, `{0}` and `{name}` without format specs.
std::string format_string(Interp& in, const std::string& fmt_text, const CallArgs& a) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < fmt_text.size(); ++i) {
    const char c = fmt_text[i];
    if ((c == '{' || c == '}') && i + 1 < fmt_text.size() && fmt_text[i + 1] == c) {
      out.push_back(c);
      ++i;
      continue;
    }
    HYP_CHECK(c != '}', "Single '}}' encountered in format string");
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    const size_t close = fmt_text.find('}', i);
    HYP_CHECK(close != std::string::npos, "Single '{{' encountered in format string");
    const std::string field = fmt_text.substr(i + 1, close - i - 1);
    HYP_CHECK(field.find_first_of(":!.[") == std::string::npos,
              "format: only {{}}, {{N}} and {{name}} are supported");
    Value v;
    if (field.empty()) {
      HYP_CHECK(next < a.pos.size(), "Replacement index {} out of range for positional args tuple",
                next);
      v = a.pos[next++];
    } else if (std::all_of(field.begin(), field.end(),
                           [](char d) { return d >= '0' && d <= '9'; })) {
      const size_t k = std::stoul(field);
      HYP_CHECK(k < a.pos.size(), "Replacement index {} out of range for positional args tuple", k);
      v = a.pos[k];
    } else {
      v = arg(a, SIZE_MAX, field, Value::undefined("'" + field + "'"));
      HYP_CHECK(!v.is_undefined(), "KeyError: '{}'", field);
    }
    out += v.to_str();
    in.check_string(out.size());
    i = close;
  }
  return out;
}

Value str_method(Interp& in, const std::string& s, const std::string& name, CallArgs& a) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value chars = arg(a, 0, "chars");
    return Value(
        strip_string(s, opt_string(chars, "strip arg"), name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    const Value sep = arg(a, 0, "sep");
    const int64_t maxsplit = int_arg(arg(a, 1, "maxsplit", Value(-1)), "split");
    HYP_CHECK(name == "split" || maxsplit < 0, "rsplit with maxsplit is not supported");
    auto parts = split_string(s, opt_string(sep, "split separator"), maxsplit);
    in.charge(static_cast<int64_t>(parts.size()));
    return Value::list(std::move(parts));
  }
  if (name == "startswith" || name == "endswith")
    return Value(affix_matches(arg(a, 0, "prefix"), s, name == "startswith"));
  if (name == "upper") return Value(to_upper(s));
  if (name == "lower") return Value(to_lower(s));
  if (name == "title") return Value(title_case(s));
  if (name == "capitalize")
    return Value(to_upper(s.substr(0, 1)) + to_lower(s.size() > 1 ? s.substr(1) : ""));
  if (name == "replace") {
    const Value old = arg(a, 0, "old"), repl = arg(a, 1, "new");
    HYP_CHECK(old.is_string() && repl.is_string(), "replace() arguments must be str");
    return Value(replace_all(in, s, old.str(), repl.str(),
                             int_arg(arg(a, 2, "count", Value(-1)), "replace")));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    const Value sub = arg(a, 0, "sub");
    HYP_CHECK(sub.is_string(), "must be str, not {}", sub.type_name());
    if (name == "count") {
      if (sub.str().empty()) return Value(static_cast<int64_t>(count_code_points(s)) + 1);
      int64_t n = 0;
      for (size_t at = s.find(sub.str()); at != std::string::npos;
           at = s.find(sub.str(), at + sub.str().size()))
        ++n;
      return Value(n);
    }
    const size_t at = name[0] == 'r' ? s.rfind(sub.str()) : s.find(sub.str());
    if (at == std::string::npos) {
      HYP_CHECK(name.find("index") == std::string::npos, "substring not found");
      return Value(-1);
    }
    return Value(cp_index(s, at));
  }
  if (name == "join") {
    std::string out;
    bool first = true;
    for (const Value& v : iterate(arg(a, 0, "iterable"))) {
      HYP_CHECK(v.is_string(), "sequence item: expected str instance, {} found", v.type_name());
      if (!first) out += s;
      first = false;
      out += v.str();
      in.check_string(out.size());
    }
    return Value(std::move(out));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const Value x = arg(a, 0, "affix");
    HYP_CHECK(x.is_string(), "{}() argument must be str", name);
    if (!affix_matches(x, s, name == "removeprefix")) return Value(s);
    return Value(name == "removeprefix" ? s.substr(x.str().size())
                                        : s.substr(0, s.size() - x.str().size()));
  }
  if (name == "format") return Value(format_string(in, s, a));
  const auto cps = decode_utf8(s);
  auto all = [&](auto pred) { return !cps.empty() && std::all_of(cps.begin(), cps.end(), pred); };
  if (name == "isdigit") return Value(all([](uint32_t c) { return c >= '0' && c <= '9'; }));
  if (name == "isalpha")
    return Value(all([](uint32_t c) { return (c | 32) >= 'a' && (c | 32) <= 'z'; }));
  if (name == "isspace") return Value(all(is_py_space));
  if (name == "isupper") return Value(to_lower(s) != s && to_upper(s) == s);
  if (name == "islower") return Value(to_upper(s) != s && to_lower(s) == s);
  if (name == "splitlines") {
    std::vector<Value> lines;
    size_t from = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] != '\n' && s[i] != '\r') continue;
      lines.emplace_back(s.substr(from, i - from));
      if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      from = i + 1;
    }
    if (from < s.size()) lines.emplace_back(s.substr(from));
    return Value::list(std::move(lines));
  }
  fail("'str object' has no attribute '{}'", name);
}

Value dict_method(const Value& d, const std::string& name, CallArgs& a) {
  const DictObj& obj = d.dict_obj();
  if (name == "items" || name == "keys" || name == "values") {
    std::vector<Value> out;
    out.reserve(obj.size());
    for (const auto& [k, v] : obj.items()) {
      if (name == "items") {
        out.push_back(Value::list({k, v}, true));
      } else {
        out.push_back(name == "keys" ? k : v);
      }
    }
    return Value::list(std::move(out));
  }
  if (name == "get") {
    const Value* v = obj.find(arg(a, 0, "key"));
    return v != nullptr ? *v : arg(a, 1, "default");
  }
  // copy
  auto copy = std::make_shared<DictObj>();
  for (const auto& [k, v] : obj.items()) copy->set(k, v);
  return Value::dict(std::move(copy));
}

Value list_method(const Value& l, const std::string& name, CallArgs& a) {
  const auto& items = l.list().items;
  if (name == "copy") return Value::list(items, l.is_tuple());
  const Value x = arg(a, 0, "value");
  if (name == "count")
    return Value(static_cast<int64_t>(std::count(items.begin(), items.end(), x)));
  const auto it = std::find(items.begin(), items.end(), x);  // index
  HYP_CHECK(it != items.end(), "{} is not in list", x.repr());
  return Value(static_cast<int64_t>(it - items.begin()));
}

bool is_one_of(const std::string& name, std::initializer_list<std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

Value bound(const Value& obj, const std::string& name) {
  return Value::function(obj.type_name() + "." + name,
                         [obj, name](Interp& in, CallArgs& a) -> Value {
                           if (obj.is_string()) return str_method(in, obj.str(), name, a);
                           if (obj.is_dict()) return dict_method(obj, name, a);
                           return list_method(obj, name, a);
                         });
}

// A method of obj, Undefined (unsafe) for the mutating ones, or nullopt for none.
std::optional<Value> method(const Value& obj, const std::string& name) {
  static const std::initializer_list<std::string_view> kStr = {
      "strip",   "lstrip",  "rstrip",  "split",      "rsplit",       "startswith",   "endswith",
      "upper",   "lower",   "title",   "capitalize", "replace",      "find",         "rfind",
      "index",   "rindex",  "count",   "join",       "removeprefix", "removesuffix", "format",
      "isdigit", "isalpha", "isspace", "isupper",    "islower",      "splitlines"};
  if (obj.is_string() && is_one_of(name, kStr)) return bound(obj, name);
  if (obj.is_dict()) {
    if (is_one_of(name, {"items", "keys", "values", "get", "copy"})) return bound(obj, name);
    if (is_one_of(name, {"clear", "pop", "popitem", "setdefault", "update"}))
      return Value::undefined("access to attribute '" + name + "' of 'dict' object is unsafe.");
  }
  if (obj.is_list()) {
    if (is_one_of(name, {"index", "count"}) || (name == "copy" && !obj.is_tuple()))
      return bound(obj, name);
    if (!obj.is_tuple() && is_one_of(name, {"append", "extend", "insert", "pop", "remove",
                                            "reverse", "sort", "clear"}))
      return Value::undefined("access to attribute '" + name + "' of 'list' object is unsafe.");
  }
  return std::nullopt;
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_error(obj);
  if (auto m = method(obj, name)) return *m;
  if (obj.kind() == Value::Kind::kDict) {
    if (const Value* v = obj.dict_obj().find(std::string_view(name))) return *v;
  }
  return missing(obj, Value(name));
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.kind() == Value::Kind::kDict) {
    if (const Value* v = obj.dict_obj().find(key)) return *v;
  } else if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      const auto n = static_cast<int64_t>(obj.list().items.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.list().items[static_cast<size_t>(i)];
    } else {
      const auto cps = decode_utf8(obj.str());
      const auto n = static_cast<int64_t>(cps.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n)
        return Value(string_of(cps, static_cast<size_t>(i), static_cast<size_t>(i) + 1));
    }
  }
  if (key.is_string()) {
    if (auto m = method(obj, key.str())) return *m;
  }
  return missing(obj, key);
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return v.list().items;
    case Value::Kind::kString: {
      std::vector<Value> out;
      for (uint32_t cp : decode_utf8(v.str())) out.emplace_back(string_of({cp}, 0, 1));
      return out;
    }
    case Value::Kind::kDict:
      if (!v.is_namespace()) {
        std::vector<Value> keys;
        for (const auto& kv : v.dict_obj().items()) keys.push_back(kv.first);
        return keys;
      }
      break;
    default:
      break;
  }
  fail("'{}' object is not iterable", v.type_name());
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      HYP_CHECK(item.is_string(), "'in <string>' requires string as left operand, not {}",
                item.type_name());
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
      return std::find(container.list().items.begin(), container.list().items.end(), item) !=
             container.list().items.end();
    case Value::Kind::kDict:
      if (container.is_namespace()) break;
      HYP_CHECK(!item.is_list() && !item.is_function() && item.kind() != Value::Kind::kDict,
                "unhashable type: '{}'", item.type_name());
      return container.dict_obj().find(item) != nullptr;
    default:
      break;
  }
  fail("argument of type '{}' is not iterable", container.type_name());
}

Value slice_value(Interp& in, const Value& obj, const Value& start, const Value& stop,
                  const Value& step) {
  if (obj.is_undefined()) undefined_error(obj);
  auto index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    if (v.is_undefined()) undefined_error(v);
    HYP_CHECK(v.is_int() || v.is_bool(), "slice {} must be an integer or None, not {}", what,
              v.type_name());
    return v.as_int();
  };
  const int64_t st = index(step, "step").value_or(1);
  HYP_CHECK(st != 0, "slice step cannot be zero");
  HYP_CHECK(st != INT64_MIN, "slice step is too small");
  if (!obj.is_list() && !obj.is_string()) return missing(obj, Value("slice"));
  std::vector<uint32_t> cps;
  if (obj.is_string()) cps = decode_utf8(obj.str());
  const auto n = static_cast<int64_t>(obj.is_string() ? cps.size() : obj.list().items.size());
  auto adjust = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v;
    if (x < 0) {
      x = x < -n ? (st < 0 ? -1 : 0) : x + n;
    } else if (x >= n) {
      x = st < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t b = adjust(index(start, "indices"), st > 0 ? 0 : n - 1);
  const int64_t e = adjust(index(stop, "indices"), st > 0 ? n : -1);
  std::vector<size_t> picks;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
    picks.push_back(static_cast<size_t>(i));
    if (st > 0 ? i > n - st : i < -1 - st) break;  // no overflow past the ends
  }
  in.charge(static_cast<int64_t>(picks.size()));
  if (obj.is_string()) {
    std::string out;
    for (size_t i : picks) append_utf8(out, cps[i]);
    return Value(std::move(out));
  }
  std::vector<Value> items;
  items.reserve(picks.size());
  for (size_t i : picks) items.push_back(obj.list().items[i]);
  return Value::list(std::move(items), obj.is_tuple());
}

std::string strip_string(std::string_view s, const std::string* chars, bool left, bool right) {
  const auto cps = decode_utf8(s);
  std::vector<uint32_t> set;
  if (chars != nullptr) set = decode_utf8(*chars);
  auto strip = [&](uint32_t c) {
    return chars == nullptr ? is_py_space(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip(cps[b])) ++b;
  if (right)
    while (e > b && strip(cps[e - 1])) --e;
  return string_of(cps, b, e);
}

std::vector<Value> split_string(std::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<Value> out;
  if (sep != nullptr) {
    HYP_CHECK(!sep->empty(), "empty separator");
    size_t from = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t at = s.find(*sep, from);
      if (at == std::string_view::npos) break;
      out.emplace_back(std::string(s.substr(from, at - from)));
      from = at + sep->size();
    }
    out.emplace_back(std::string(s.substr(from)));
    return out;
  }
  const auto cps = decode_utf8(s);
  size_t i = 0;
  while (true) {
    while (i < cps.size() && is_py_space(cps[i])) ++i;
    if (i == cps.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.emplace_back(string_of(cps, i, cps.size()));  // the rest, trailing space kept
      break;
    }
    size_t j = i;
    while (j < cps.size() && !is_py_space(cps[j])) ++j;
    out.emplace_back(string_of(cps, i, j));
    i = j;
  }
  return out;
}

std::string to_upper(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 32);
  return out;
}

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
  return out;
}

// ---- operators --------------------------------------------------------------------------

namespace {
[[noreturn]] void bad_operands(const std::string& op, const Value& a, const Value& b) {
  fail("unsupported operand type(s) for {}: '{}' and '{}'", op, a.type_name(), b.type_name());
}

// Python's integers do not overflow; ours are 64-bit and refuse to.
int64_t checked_op(char op, int64_t x, int64_t y) {
  int64_t r = 0;
  const bool overflow = op == '+'   ? __builtin_add_overflow(x, y, &r)
                        : op == '-' ? __builtin_sub_overflow(x, y, &r)
                                    : __builtin_mul_overflow(x, y, &r);
  HYP_CHECK(!overflow, "integer overflow (integers are 64-bit here)");
  return r;
}

Value repeat(Interp& in, const Value& seq, int64_t times) {
  if (times <= 0) return seq.is_string() ? Value("") : Value::list({}, seq.is_tuple());
  if (seq.is_string()) {
    const size_t n = seq.str().size();
    HYP_CHECK(n == 0 || static_cast<uint64_t>(times) <= SIZE_MAX / n,
              "string repetition is too large");
    in.check_string(n * static_cast<size_t>(times));
    std::string out;
    out.reserve(n * static_cast<size_t>(times));
    for (int64_t i = 0; i < times; ++i) out += seq.str();
    return Value(std::move(out));
  }
  const size_t n = seq.list().items.size();
  HYP_CHECK(
      n == 0 || static_cast<uint64_t>(times) <= static_cast<uint64_t>(in.options().max_steps) / n,
      "list repetition is too large");
  in.charge(static_cast<int64_t>(n) * times);
  std::vector<Value> items;
  for (int64_t i = 0; i < times; ++i)
    items.insert(items.end(), seq.list().items.begin(), seq.list().items.end());
  return Value::list(std::move(items), seq.is_tuple());
}

double float_mod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0) {
    if ((b < 0) != (m < 0)) m += b;
  } else {
    m = std::copysign(0.0, b);
  }
  return m;
}

Value int_pow(int64_t base, int64_t exp) {
  if (exp < 0) return Value(std::pow(static_cast<double>(base), static_cast<double>(exp)));
  int64_t r = 1;
  while (exp > 0) {
    if (base == 0 || base == 1) return Value(exp > 0 ? base : r);
    if (base == -1) return Value((exp & 1) ? -r : r);
    r = checked_op('*', r, base);
    --exp;
  }
  return Value(r);
}
}  // namespace

Value binary_op(Interp& in, const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = a.to_str() + b.to_str();
    in.check_string(s.size());
    return Value(std::move(s));
  }
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  if (a.is_number() && b.is_number()) {
    const bool ints = !a.is_float() && !b.is_float();
    const int64_t x = ints ? a.as_int() : 0, y = ints ? b.as_int() : 0;
    const double p = a.as_float(), q = b.as_float();
    if (op == "+") return ints ? Value(checked_op('+', x, y)) : Value(p + q);
    if (op == "-") return ints ? Value(checked_op('-', x, y)) : Value(p - q);
    if (op == "*") return ints ? Value(checked_op('*', x, y)) : Value(p * q);
    if (op == "**") return ints ? int_pow(x, y) : Value(std::pow(p, q));
    HYP_CHECK(ints ? y != 0 : q != 0, "division by zero");
    if (op == "/") return Value(p / q);
    if (ints) {
      HYP_CHECK(!(x == INT64_MIN && y == -1), "integer overflow (integers are 64-bit here)");
      int64_t m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      if (op == "%") return Value(m);
      return Value((x - m) / y);  // "//"
    }
    const double m = float_mod(p, q);
    if (op == "%") return Value(m);
    const double div = (p - m) / q;
    if (div == 0) return Value(std::copysign(0.0, p / q));
    double fl = std::floor(div);
    if (div - fl > 0.5) fl += 1.0;
    return Value(fl);  // "//"
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      in.check_string(a.str().size() + b.str().size());
      return Value(a.str() + b.str());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      in.charge(static_cast<int64_t>(a.list().items.size() + b.list().items.size()));
      std::vector<Value> items = a.list().items;
      items.insert(items.end(), b.list().items.begin(), b.list().items.end());
      return Value::list(std::move(items), a.is_tuple());
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool()))
      return repeat(in, a, b.as_int());
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool()))
      return repeat(in, b, a.as_int());
  }
  if (op == "%" && a.is_string()) fail("printf-style string formatting ('%') is not supported");
  bad_operands(op, a, b);
}

}  // namespace hyperion::text::jinja
