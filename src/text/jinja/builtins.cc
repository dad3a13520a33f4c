// jinja2's filters, tests and globals, with Hugging Face's tojson, raise_exception and
// strftime_now.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string_view>
#include <unordered_map>

#include "base/error.h"
#include "text/jinja/eval.h"

namespace hyperion::text::jinja {
namespace {

// The range() cap of jinja2's sandbox.
constexpr int64_t kMaxRange = 100000;

Value arg(const CallArgs& a, size_t i, std::string_view name, Value def = Value::none()) {
  if (i < a.pos.size()) return a.pos[i];
  for (const auto& [k, v] : a.kw)
    if (k == name) return v;
  return def;
}

bool has_arg(const CallArgs& a, size_t i, std::string_view name) {
  if (i < a.pos.size()) return true;
  return std::any_of(a.kw.begin(), a.kw.end(), [&](const auto& kv) { return kv.first == name; });
}

int64_t int_of(const Value& v, const char* what) {
  if (v.is_undefined()) undefined_error(v);
  HYP_CHECK(v.is_int() || v.is_bool(), "{} must be an integer, not {}", what, v.type_name());
  return v.as_int();
}

std::string str_of(const Value& v) {
  return v.is_string() ? v.str() : v.to_str();
}

// ---- filters ----------------------------------------------------------------------------

Value f_trim(Interp&, const Value& s, CallArgs& a) {
  const Value chars = arg(a, 0, "chars");
  HYP_CHECK(chars.is_none() || chars.is_string(), "trim: chars must be a string");
  return Value(strip_string(str_of(s), chars.is_none() ? nullptr : &chars.str(), true, true));
}

Value f_tojson(Interp& in, const Value& v, CallArgs& a) {
  // Hugging Face: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  Value::JsonOptions o;
  o.ensure_ascii = arg(a, 0, "ensure_ascii", Value(false)).truthy();
  const Value indent = arg(a, 1, "indent");
  if (indent.is_string()) {
    o.indent = indent.str();
  } else if (!indent.is_none()) {
    const int64_t n = int_of(indent, "tojson indent");
    HYP_CHECK(n <= 1024, "tojson indent {} is too large", n);
    o.indent = std::string(static_cast<size_t>(std::max<int64_t>(n, 0)), ' ');
  }
  const Value seps = arg(a, 2, "separators");
  if (!seps.is_none()) {
    HYP_CHECK(seps.is_list() && seps.list().items.size() == 2 && seps.list().items[0].is_string() &&
                  seps.list().items[1].is_string(),
              "tojson separators must be a pair of strings");
    o.separators = std::make_pair(seps.list().items[0].str(), seps.list().items[1].str());
  }
  o.sort_keys = arg(a, 3, "sort_keys", Value(false)).truthy();
  o.max_bytes = in.options().max_output_bytes;
  std::string s = v.to_json(o);
  in.check_string(s.size());
  return Value(std::move(s));
}

Value f_length(Interp&, const Value& v, CallArgs&) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return Value(0);
    case Value::Kind::kString:
      return Value(static_cast<int64_t>(count_code_points(v.str())));
    case Value::Kind::kList:
      return Value(static_cast<int64_t>(v.list().items.size()));
    case Value::Kind::kDict:
      if (!v.is_namespace()) return Value(static_cast<int64_t>(v.dict_obj().size()));
      break;
    default:
      break;
  }
  fail("object of type '{}' has no len()", v.type_name());
}

Value f_upper(Interp&, const Value& v, CallArgs&) {
  return Value(to_upper(str_of(v)));
}
Value f_lower(Interp&, const Value& v, CallArgs&) {
  return Value(to_lower(str_of(v)));
}

Value f_capitalize(Interp&, const Value& v, CallArgs&) {
  const std::string s = str_of(v);
  return Value(to_upper(s.substr(0, 1)) + to_lower(s.size() > 1 ? s.substr(1) : ""));
}

Value f_title(Interp&, const Value& v, CallArgs&) {
  // jinja2: words begin after runs of -, whitespace, ( { [ <; first letter up, rest down.
  const std::string s = str_of(v);
  std::string out;
  bool word_start = true;
  for (char c : s) {
    const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || c == ' ' ||
                     c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
    if (sep) {
      out.push_back(c);
      word_start = true;
      continue;
    }
    out += word_start ? to_upper(std::string(1, c)) : to_lower(std::string(1, c));
    word_start = false;
  }
  return Value(std::move(out));
}

Value f_replace(Interp& in, const Value& v, CallArgs& a) {
  CallArgs m;
  m.pos = {arg(a, 0, "old"), arg(a, 1, "new")};
  if (has_arg(a, 2, "count") && !arg(a, 2, "count").is_none()) m.pos.push_back(arg(a, 2, "count"));
  for (Value& p : m.pos) p = Value(str_of(p));
  if (m.pos.size() == 3) m.pos[2] = arg(a, 2, "count");
  return in.call(get_attr(Value(str_of(v)), "replace"), m);
}

Value f_default(Interp&, const Value& v, CallArgs& a) {
  const bool boolean = arg(a, 1, "boolean", Value(false)).truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) return arg(a, 0, "default_value", Value(""));
  return v;
}

Value f_first(Interp&, const Value& v, CallArgs&) {
  const auto items = iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Interp&, const Value& v, CallArgs&) {
  HYP_CHECK(!v.is_dict(), "'dict' object is not reversible");
  const auto items = iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0.
Value attr_path(const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return get_item(item, attribute);
  Value v = item;
  const std::string& path = attribute.str();
  size_t from = 0;
  while (true) {
    const size_t dot = path.find('.', from);
    const std::string part =
        path.substr(from, dot == std::string::npos ? std::string::npos : dot - from);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                                     [](char c) { return c >= '0' && c <= '9'; });
    v = digits && part.size() < 18 ? get_item(v, Value(static_cast<int64_t>(std::stoll(part))))
                                   : get_item(v, Value(part));
    if (dot == std::string::npos) return v;
    from = dot + 1;
  }
}

Value f_join(Interp& in, const Value& v, CallArgs& a) {
  const std::string sep = str_of(arg(a, 0, "d", Value("")));
  const Value attribute = arg(a, 1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& item : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += str_of(attribute.is_none() ? item : attr_path(item, attribute));
    in.check_string(out.size());
  }
  return Value(std::move(out));
}

Value f_list(Interp& in, const Value& v, CallArgs&) {
  auto items = iterate(v);
  in.charge(static_cast<int64_t>(items.size()));
  return Value::list(std::move(items));
}

Value f_items(Interp& in, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::list({});
  HYP_CHECK(v.is_dict(), "Can only get item pairs from a mapping.");
  CallArgs none;
  return in.call(get_attr(v, "items"), none);
}

Value f_string(Interp&, const Value& v, CallArgs&) {
  return Value(str_of(v));
}

std::optional<double> parse_float(std::string s) {
  s = strip_string(s, nullptr, true, true);
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size()) return std::nullopt;
  return d;
}

Value f_int(Interp&, const Value& v, CallArgs& a) {
  const Value def = arg(a, 0, "default", Value(0));
  const int64_t base = int_of(arg(a, 1, "base", Value(10)), "int base");
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) {
    const double d = v.as_float();
    if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return def;
    return Value(static_cast<int64_t>(d));
  }
  if (v.is_string()) {
    std::string s = strip_string(v.str(), nullptr, true, true);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    if (!s.empty() && base >= 2 && base <= 36) {
      char* end = nullptr;
      errno = 0;
      const long long r = std::strtoll(s.c_str(), &end, static_cast<int>(base));
      if (end == s.c_str() + s.size() && errno == 0) return Value(static_cast<int64_t>(r));
    }
    if (const auto d = parse_float(v.str()); d && std::isfinite(*d) && std::fabs(*d) < 9.2e18)
      return Value(static_cast<int64_t>(*d));
  }
  return def;
}

Value f_float(Interp&, const Value& v, CallArgs& a) {
  const Value def = arg(a, 0, "default", Value(0.0));
  if (v.is_number()) return Value(v.as_float());
  if (v.is_string()) {
    if (const auto d = parse_float(v.str())) return Value(*d);
  }
  return def;
}

Value f_abs(Interp&, const Value& v, CallArgs&) {
  if (v.is_undefined()) undefined_error(v);
  HYP_CHECK(v.is_number(), "bad operand type for abs(): '{}'", v.type_name());
  if (v.is_float()) return Value(std::fabs(v.as_float()));
  HYP_CHECK(v.as_int() != INT64_MIN, "integer overflow (integers are 64-bit here)");
  return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
}

Value f_round(Interp&, const Value& v, CallArgs& a) {
  const int64_t precision = int_of(arg(a, 0, "precision", Value(0)), "round precision");
  const Value method = arg(a, 1, "method", Value("common"));
  HYP_CHECK(method.is_string() &&
                (method.str() == "common" || method.str() == "ceil" || method.str() == "floor"),
            "method must be 'common', 'ceil' or 'floor'");
  if (v.is_undefined()) undefined_error(v);
  HYP_CHECK(v.is_number(), "type {} doesn't define __round__ method", v.type_name());
  if (method.str() == "common") {
    if (!v.is_float()) return Value(v.as_int());  // Python: round(int, n) stays an int
    const double d = v.as_float();
    if (!std::isfinite(d) || precision > 300 || precision < -300) return Value(d);
    if (precision >= 0) {  // printf rounds the exact binary value, half to even, as Python
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), d);
      return Value(std::strtod(buf, nullptr));
    }
    const double scale = std::pow(10.0, static_cast<double>(-precision));
    return Value(std::nearbyint(d / scale) * scale);
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_float() * scale;
  return Value((method.str() == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value f_map(Interp& in, const Value& v, CallArgs& a) {
  std::vector<Value> out;
  const Value attribute = arg(a, SIZE_MAX, "attribute", Value());
  if (!attribute.is_undefined()) {
    const Value def = arg(a, SIZE_MAX, "default", Value());
    for (const Value& item : iterate(v)) {
      Value x = attr_path(item, attribute);
      out.push_back(x.is_undefined() && !def.is_undefined() ? def : x);
    }
  } else {
    HYP_CHECK(!a.pos.empty() && a.pos[0].is_string(),
              "map: a filter name or attribute= is required");
    CallArgs rest;
    rest.pos.assign(a.pos.begin() + 1, a.pos.end());
    rest.kw = a.kw;
    for (const Value& item : iterate(v)) {
      in.charge(1);
      CallArgs copy = rest;
      out.push_back(in.apply_filter(a.pos[0].str(), item, copy));
    }
  }
  return Value::list(std::move(out));
}

// select/reject/selectattr/rejectattr.
Value select_impl(Interp& in, const Value& v, CallArgs& a, bool by_attr, bool keep) {
  size_t next = 0;
  Value attribute;
  if (by_attr) {
    HYP_CHECK(!a.pos.empty(), "selectattr/rejectattr: missing the attribute");
    attribute = a.pos[next++];
  }
  std::string test;
  if (next < a.pos.size()) test = str_of(a.pos[next++]);
  CallArgs targs;
  targs.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(std::min(next, a.pos.size())),
                   a.pos.end());
  targs.kw = a.kw;
  std::vector<Value> out;
  for (const Value& item : iterate(v)) {
    in.charge(1);
    const Value x = by_attr ? attr_path(item, attribute) : item;
    CallArgs copy = targs;
    const bool pass = test.empty() ? x.truthy() : in.apply_test(test, x, copy);
    if (pass == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}
Value f_select(Interp& in, const Value& v, CallArgs& a) {
  return select_impl(in, v, a, false, true);
}
Value f_reject(Interp& in, const Value& v, CallArgs& a) {
  return select_impl(in, v, a, false, false);
}
Value f_selectattr(Interp& in, const Value& v, CallArgs& a) {
  return select_impl(in, v, a, true, true);
}
Value f_rejectattr(Interp& in, const Value& v, CallArgs& a) {
  return select_impl(in, v, a, true, false);
}

// The sort and unique key: the attribute, lower-cased strings unless case_sensitive.
Value sort_key(const Value& item, const Value& attribute, bool case_sensitive) {
  Value k = attribute.is_none() ? item : attr_path(item, attribute);
  if (!case_sensitive && k.is_string()) return Value(to_lower(k.str()));
  return k;
}

Value f_sort(Interp& in, const Value& v, CallArgs& a) {
  const bool reverse = arg(a, 0, "reverse", Value(false)).truthy();
  const bool case_sensitive = arg(a, 1, "case_sensitive", Value(false)).truthy();
  const Value attribute = arg(a, 2, "attribute");
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& item : iterate(v))
    keyed.emplace_back(sort_key(item, attribute, case_sensitive), std::move(item));
  in.charge(static_cast<int64_t>(keyed.size()) * 8);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? Value::compare(y.first, x.first) < 0 : Value::compare(x.first, y.first) < 0;
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::list(std::move(out));
}

Value f_unique(Interp& in, const Value& v, CallArgs& a) {
  const bool case_sensitive = arg(a, 0, "case_sensitive", Value(false)).truthy();
  const Value attribute = arg(a, 1, "attribute");
  std::vector<Value> seen, out;
  for (const Value& item : iterate(v)) {
    Value k = sort_key(item, attribute, case_sensitive);
    in.charge(static_cast<int64_t>(seen.size()) / 16 + 1);
    if (std::find(seen.begin(), seen.end(), k) != seen.end()) continue;
    seen.push_back(std::move(k));
    out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_reverse(Interp& in, const Value& v, CallArgs&) {
  if (v.is_string()) {
    auto cps = decode_utf8(v.str());
    std::reverse(cps.begin(), cps.end());
    std::string out;
    for (uint32_t c : cps) append_utf8(out, c);
    return Value(std::move(out));
  }
  auto items = iterate(v);
  in.charge(static_cast<int64_t>(items.size()));
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_indent(Interp& in, const Value& v, CallArgs& a) {
  const Value width = arg(a, 0, "width", Value(4));
  std::string pad;
  if (width.is_string()) {
    pad = width.str();
  } else {
    const int64_t n = int_of(width, "indent width");
    HYP_CHECK(n <= 1024, "indent width {} is too large", n);
    pad.assign(static_cast<size_t>(std::max<int64_t>(n, 0)), ' ');
  }
  const bool first = arg(a, 1, "first", Value(false)).truthy();
  const bool blank = arg(a, 2, "blank", Value(false)).truthy();
  // s + "\n" split into lines, as Python's splitlines (on \n, \r\n and \r).
  const std::string s = str_of(v) + "\n";
  std::vector<std::string> lines;
  size_t from = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\n' && s[i] != '\r') continue;
    lines.push_back(s.substr(from, i - from));
    if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
    from = i + 1;
  }
  in.check_string(s.size() + lines.size() * pad.size());
  std::string out = lines.empty() ? "" : lines[0];
  for (size_t i = 1; i < lines.size(); ++i) {
    out += "\n";
    if (blank || !lines[i].empty()) out += pad;
    out += lines[i];
  }
  if (first) out = pad + out;
  return Value(std::move(out));
}

Value f_safe(Interp&, const Value& v, CallArgs&) {
  return v;
}

Value f_escape(Interp& in, const Value& v, CallArgs&) {
  std::string out;
  for (char c : str_of(v)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  in.check_string(out.size());
  return Value(std::move(out));
}

Value f_wordcount(Interp&, const Value& v, CallArgs&) {
  int64_t n = 0;
  bool in_word = false;
  for (char c : str_of(v)) {
    const bool w = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                   c == '_' || (static_cast<unsigned char>(c) >= 0x80);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

Value f_attr(Interp&, const Value& v, CallArgs& a) {
  return get_attr(v, str_of(arg(a, 0, "name")));
}

Value f_minmax(Interp&, const Value& v, CallArgs& a, bool want_max) {
  const bool case_sensitive = arg(a, 0, "case_sensitive", Value(false)).truthy();
  const Value attribute = arg(a, 1, "attribute");
  const auto items = iterate(v);
  if (items.empty())
    return Value::undefined(std::string("No aggregated item, sequence was empty."));
  size_t best = 0;
  Value best_key = sort_key(items[0], attribute, case_sensitive);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = sort_key(items[i], attribute, case_sensitive);
    const int c = Value::compare(k, best_key);
    if (want_max ? c > 0 : c < 0) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}
Value f_max(Interp& in, const Value& v, CallArgs& a) {
  return f_minmax(in, v, a, true);
}
Value f_min(Interp& in, const Value& v, CallArgs& a) {
  return f_minmax(in, v, a, false);
}

Value f_sum(Interp& in, const Value& v, CallArgs& a) {
  const Value attribute = arg(a, 0, "attribute");
  Value total = arg(a, 1, "start", Value(0));
  for (const Value& item : iterate(v))
    total = binary_op(in, "+", total, attribute.is_none() ? item : attr_path(item, attribute));
  return total;
}

Value f_dictsort(Interp& in, const Value& v, CallArgs& a) {
  HYP_CHECK(v.is_dict(), "dictsort: a dict is required, not {}", v.type_name());
  const bool case_sensitive = arg(a, 0, "case_sensitive", Value(false)).truthy();
  const bool by_value = str_of(arg(a, 1, "by", Value("key"))) == "value";
  const bool reverse = arg(a, 2, "reverse", Value(false)).truthy();
  std::vector<Value> pairs;
  for (const auto& [k, x] : v.dict_obj().items()) pairs.push_back(Value::list({k, x}, true));
  in.charge(static_cast<int64_t>(pairs.size()) * 8);
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& p, const Value& q) {
    const Value kp = sort_key(p.list().items[by_value ? 1 : 0], Value::none(), case_sensitive);
    const Value kq = sort_key(q.list().items[by_value ? 1 : 0], Value::none(), case_sensitive);
    return reverse ? Value::compare(kq, kp) < 0 : Value::compare(kp, kq) < 0;
  });
  return Value::list(std::move(pairs));
}

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> kFilters = {
      {"trim", f_trim},
      {"tojson", f_tojson},
      {"length", f_length},
      {"count", f_length},
      {"upper", f_upper},
      {"lower", f_lower},
      {"title", f_title},
      {"capitalize", f_capitalize},
      {"replace", f_replace},
      {"default", f_default},
      {"d", f_default},
      {"first", f_first},
      {"last", f_last},
      {"join", f_join},
      {"list", f_list},
      {"items", f_items},
      {"string", f_string},
      {"int", f_int},
      {"float", f_float},
      {"abs", f_abs},
      {"round", f_round},
      {"map", f_map},
      {"select", f_select},
      {"reject", f_reject},
      {"selectattr", f_selectattr},
      {"rejectattr", f_rejectattr},
      {"unique", f_unique},
      {"sort", f_sort},
      {"reverse", f_reverse},
      {"indent", f_indent},
      {"safe", f_safe},
      {"e", f_escape},
      {"escape", f_escape},
      {"forceescape", f_escape},
      {"wordcount", f_wordcount},
      {"attr", f_attr},
      {"max", f_max},
      {"min", f_min},
      {"sum", f_sum},
      {"dictsort", f_dictsort},
  };
  return kFilters;
}

// ---- tests ------------------------------------------------------------------------------

bool t_defined(Interp&, const Value& v, CallArgs&) {
  return !v.is_undefined();
}
bool t_undefined(Interp&, const Value& v, CallArgs&) {
  return v.is_undefined();
}
bool t_none(Interp&, const Value& v, CallArgs&) {
  return v.is_none();
}
bool t_boolean(Interp&, const Value& v, CallArgs&) {
  return v.is_bool();
}
bool t_true(Interp&, const Value& v, CallArgs&) {
  return v.is_bool() && v.as_bool();
}
bool t_false(Interp&, const Value& v, CallArgs&) {
  return v.is_bool() && !v.as_bool();
}
bool t_integer(Interp&, const Value& v, CallArgs&) {
  return v.is_int();
}
bool t_float(Interp&, const Value& v, CallArgs&) {
  return v.is_float();
}
bool t_number(Interp&, const Value& v, CallArgs&) {
  return v.is_number();
}
bool t_string(Interp&, const Value& v, CallArgs&) {
  return v.is_string();
}
bool t_mapping(Interp&, const Value& v, CallArgs&) {
  return v.is_dict();
}
bool t_iterable(Interp&, const Value& v, CallArgs&) {
  return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
}
bool t_sequence(Interp&, const Value& v, CallArgs&) {
  return v.is_string() || v.is_list() || v.is_dict();
}
bool t_callable(Interp&, const Value& v, CallArgs&) {
  return v.is_function();
}
bool t_escaped(Interp&, const Value&, CallArgs&) {
  return false;
}
bool t_sameas(Interp&, const Value& v, CallArgs& a) {
  return v.same_as(arg(a, 0, "other"));
}
int64_t mod_of(Interp& in, const Value& v, const Value& n) {
  const Value r = binary_op(in, "%", v, n);
  return r.is_float() ? (r.as_float() == 0 ? 0 : 1) : r.as_int();
}
bool t_even(Interp& in, const Value& v, CallArgs&) {
  return mod_of(in, v, Value(2)) == 0;
}
bool t_odd(Interp& in, const Value& v, CallArgs&) {
  return mod_of(in, v, Value(2)) == 1;
}
bool t_divisibleby(Interp& in, const Value& v, CallArgs& a) {
  return mod_of(in, v, arg(a, 0, "num")) == 0;
}
bool t_eq(Interp&, const Value& v, CallArgs& a) {
  return v == arg(a, 0, "other");
}
bool t_ne(Interp&, const Value& v, CallArgs& a) {
  return v != arg(a, 0, "other");
}
int cmp_arg(const Value& v, CallArgs& a) {
  const Value other = arg(a, 0, "other");
  if (v.is_undefined()) undefined_error(v);
  if (other.is_undefined()) undefined_error(other);
  return Value::compare(v, other);
}
bool t_lt(Interp&, const Value& v, CallArgs& a) {
  return cmp_arg(v, a) < 0;
}
bool t_le(Interp&, const Value& v, CallArgs& a) {
  return cmp_arg(v, a) <= 0;
}
bool t_gt(Interp&, const Value& v, CallArgs& a) {
  return cmp_arg(v, a) > 0;
}
bool t_ge(Interp&, const Value& v, CallArgs& a) {
  return cmp_arg(v, a) >= 0;
}
bool t_in(Interp&, const Value& v, CallArgs& a) {
  return contains(arg(a, 0, "seq"), v);
}
bool t_lower(Interp&, const Value& v, CallArgs&) {
  const std::string s = str_of(v);
  return to_upper(s) != s && to_lower(s) == s;
}
bool t_upper(Interp&, const Value& v, CallArgs&) {
  const std::string s = str_of(v);
  return to_lower(s) != s && to_upper(s) == s;
}
bool t_filter(Interp&, const Value& v, CallArgs&) {
  return v.is_string() && find_filter(v.str()) != nullptr;
}
bool t_test(Interp&, const Value& v, CallArgs&) {
  return v.is_string() && find_test(v.str()) != nullptr;
}

const std::unordered_map<std::string, TestFn>& tests() {
  static const std::unordered_map<std::string, TestFn> kTests = {
      {"defined", t_defined},
      {"undefined", t_undefined},
      {"none", t_none},
      {"boolean", t_boolean},
      {"true", t_true},
      {"false", t_false},
      {"integer", t_integer},
      {"float", t_float},
      {"number", t_number},
      {"string", t_string},
      {"mapping", t_mapping},
      {"iterable", t_iterable},
      {"sequence", t_sequence},
      {"callable", t_callable},
      {"escaped", t_escaped},
      {"sameas", t_sameas},
      {"even", t_even},
      {"odd", t_odd},
      {"divisibleby", t_divisibleby},
      {"eq", t_eq},
      {"equalto", t_eq},
      {"==", t_eq},
      {"ne", t_ne},
      {"!=", t_ne},
      {"lt", t_lt},
      {"lessthan", t_lt},
      {"<", t_lt},
      {"le", t_le},
      {"<=", t_le},
      {"gt", t_gt},
      {"greaterthan", t_gt},
      {">", t_gt},
      {"ge", t_ge},
      {">=", t_ge},
      {"in", t_in},
      {"lower", t_lower},
      {"upper", t_upper},
      {"filter", t_filter},
      {"test", t_test},
  };
  return kTests;
}

// ---- globals ----------------------------------------------------------------------------

Value g_range(Interp& in, CallArgs& a) {
  HYP_CHECK(a.kw.empty(), "range() takes no keyword arguments");
  HYP_CHECK(!a.pos.empty() && a.pos.size() <= 3, "range expected 1 to 3 arguments, got {}",
            a.pos.size());
  int64_t start = 0, stop = 0, step = 1;
  if (a.pos.size() == 1) {
    stop = int_of(a.pos[0], "range() argument");
  } else {
    start = int_of(a.pos[0], "range() argument");
    stop = int_of(a.pos[1], "range() argument");
    if (a.pos.size() == 3) step = int_of(a.pos[2], "range() argument");
  }
  HYP_CHECK(step != 0, "range() arg 3 must not be zero");
  const long double span =
      step > 0 ? static_cast<long double>(stop) - start : static_cast<long double>(start) - stop;
  const long double count =
      span <= 0 ? 0 : std::ceil(span / std::fabs(static_cast<long double>(step)));
  HYP_CHECK(count <= kMaxRange,
            "Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).", kMaxRange);
  in.charge(static_cast<int64_t>(count));
  std::vector<Value> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) out.emplace_back(start + i * step);
  return Value::list(std::move(out));
}

Value g_namespace(Interp& in, CallArgs& a) {
  Value ns = in.make_namespace();
  for (const Value& init : a.pos) {
    HYP_CHECK(init.is_dict(), "namespace() takes keyword arguments or a dict, not {}",
              init.type_name());
    for (const auto& [k, v] : init.dict_obj().items()) ns.dict_obj().set(k, v);
  }
  for (const auto& [k, v] : a.kw) ns.dict_obj().set(Value(k), v);
  return ns;
}

Value g_dict(Interp&, CallArgs& a) {
  Value d = Value::dict();
  for (const Value& init : a.pos) {
    HYP_CHECK(init.is_dict(), "dict() takes keyword arguments or a dict, not {}", init.type_name());
    for (const auto& [k, v] : init.dict_obj().items()) d.dict_obj().set(k, v);
  }
  for (const auto& [k, v] : a.kw) d.dict_obj().set(Value(k), v);
  return d;
}

Value g_raise_exception(Interp&, CallArgs& a) {
  throw Error("raise_exception: " + str_of(arg(a, 0, "message", Value(""))));
}

Value g_strftime_now(Interp& in, CallArgs& a) {
  const Value format = arg(a, 0, "format");
  HYP_CHECK(format.is_string(), "strftime_now: the format must be a string");
  HYP_CHECK(format.str().size() <= 256, "strftime_now: the format is longer than 256 bytes");
  const std::time_t t = std::chrono::system_clock::to_time_t(in.options().now());
  std::tm tm{};
  localtime_r(&t, &tm);
  if (format.str().empty()) return Value("");
  std::string buf(64 + format.str().size() * 64, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), format.str().c_str(), &tm);
  buf.resize(n);
  return Value(std::move(buf));
}

Value g_joiner(Interp&, CallArgs& a) {
  const std::string sep = str_of(arg(a, 0, "sep", Value(", ")));
  auto used = std::make_shared<bool>(false);
  return Value::function("joiner", [sep, used](Interp&, CallArgs&) -> Value {
    if (!*used) {
      *used = true;
      return Value("");
    }
    return Value(sep);
  });
}

}  // namespace

FilterFn find_filter(const std::string& name) {
  const auto it = filters().find(name);
  return it == filters().end() ? nullptr : it->second;
}

TestFn find_test(const std::string& name) {
  const auto it = tests().find(name);
  return it == tests().end() ? nullptr : it->second;
}

void add_globals(Scope& scope) {
  scope.vars["range"] = Value::function("range", g_range);
  scope.vars["namespace"] = Value::function("namespace", g_namespace);
  scope.vars["dict"] = Value::function("dict", g_dict);
  scope.vars["joiner"] = Value::function("joiner", g_joiner);
  scope.vars["raise_exception"] = Value::function("raise_exception", g_raise_exception);
  scope.vars["strftime_now"] = Value::function("strftime_now", g_strftime_now);
}

}  // namespace hyperion::text::jinja
