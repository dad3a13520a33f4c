#include "text/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "base/error.h"
#include "base/utf8.h"

namespace hyperion::text::jinja {

// ---- UTF-8 ------------------------------------------------------------------------------

namespace {
// An invalid byte b decodes to kRawByte + b, and encodes back to the byte itself.
constexpr uint32_t kRawByte = 0x110000;
}  // namespace

std::vector<uint32_t> decode_utf8(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    int len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
    uint32_t cp = len == 1 ? b0 : len == 2 ? (b0 & 0x1F) : len == 3 ? (b0 & 0x0F) : (b0 & 0x07);
    bool ok = len > 0 && i + static_cast<size_t>(len) <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((b & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (b & 0x3F);
    }
    if (ok) {
      static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    }
    if (!ok) {
      out.push_back(kRawByte + b0);
      ++i;
    } else {
      out.push_back(cp);
      i += static_cast<size_t>(len);
    }
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp >= kRawByte) {
    out.push_back(static_cast<char>(cp - kRawByte));
  } else {
    hyperion::append_utf8(out, cp);
  }
}

size_t count_code_points(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  // Stray continuation bytes are code points of their own in decode_utf8; recount then.
  bool plain = true;
  for (char c : s) plain = plain && static_cast<unsigned char>(c) < 0x80;
  return plain ? n : decode_utf8(s).size();
}

bool is_py_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// ---- construction -----------------------------------------------------------------------

Value::Value(std::string s) : v_(std::make_shared<const std::string>(std::move(s))) {}

int Value::depth() const {
  if (is_list()) return list().depth;
  if (kind() == Kind::kDict) return dict_obj().depth;
  return 0;
}

Value Value::list(std::vector<Value> items, bool tuple) {
  auto l = std::make_shared<ListObj>();
  int depth = 0;
  for (const Value& v : items) depth = std::max(depth, v.depth());
  HYP_CHECK(depth < kMaxValueDepth, "lists and dicts nest deeper than {} levels", kMaxValueDepth);
  l->depth = depth + 1;
  l->items = std::move(items);
  l->tuple = tuple;
  return Value(std::move(l));
}

Value Value::dict() {
  return Value(std::make_shared<DictObj>());
}

Value Value::namespace_obj() {
  auto d = std::make_shared<DictObj>();
  d->is_namespace = true;
  return Value(std::move(d));
}

Value Value::function(std::string name, NativeFn fn) {
  return Value(std::make_shared<FuncObj>(FuncObj{std::move(name), std::move(fn)}));
}

bool Value::is_tuple() const {
  return is_list() && list().tuple;
}
bool Value::is_dict() const {
  return kind() == Kind::kDict && !dict_obj().is_namespace;
}
bool Value::is_namespace() const {
  return kind() == Kind::kDict && dict_obj().is_namespace;
}

// ---- dict -------------------------------------------------------------------------------

namespace {
// The hash key of a dict key: numbers that compare equal share one.
std::optional<std::string> hash_key(const Value& k) {
  switch (k.kind()) {
    case Value::Kind::kNone:
      return std::string("n");
    case Value::Kind::kBool:
    case Value::Kind::kInt:
      return "i" + std::to_string(k.as_int());
    case Value::Kind::kFloat: {
      const double d = k.as_float();
      if (std::nearbyint(d) == d && std::fabs(d) < 9.2e18)
        return "i" + std::to_string(static_cast<int64_t>(d));
      return "f" + float_repr(d);
    }
    case Value::Kind::kString:
      return "s" + k.str();
    default:
      return std::nullopt;
  }
}
}  // namespace

const Value* DictObj::find(const Value& key) const {
  const auto h = hash_key(key);
  if (!h) return nullptr;
  const auto it = index_.find(*h);
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

const Value* DictObj::find(std::string_view key) const {
  std::string h = "s";
  h.append(key);
  const auto it = index_.find(h);
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

void DictObj::set(const Value& key, Value value) {
  const auto h = hash_key(key);
  HYP_CHECK(h.has_value(), "unhashable type: '{}'", key.type_name());
  HYP_CHECK(value.depth() < kMaxValueDepth, "lists and dicts nest deeper than {} levels",
            kMaxValueDepth);
  depth = std::max(depth, value.depth() + 1);
  const auto [it, fresh] = index_.emplace(*h, items_.size());
  if (fresh) {
    items_.emplace_back(key, std::move(value));
  } else {
    items_[it->second].second = std::move(value);
  }
}

// ---- truth, names, equality -------------------------------------------------------------

bool Value::truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return as_bool();
    case Kind::kInt:
      return as_int() != 0;
    case Kind::kFloat:
      return as_float() != 0.0;
    case Kind::kString:
      return !str().empty();
    case Kind::kList:
      return !list().items.empty();
    case Kind::kDict:
      return is_namespace() || dict_obj().size() != 0;
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return is_tuple() ? "tuple" : "list";
    case Kind::kDict:
      return is_namespace() ? "Namespace" : "dict";
    case Kind::kFunction:
      return "function";
  }
  return "object";
}

bool operator==(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.str() == b.str();
    case Value::Kind::kList: {
      if (a.is_tuple() != b.is_tuple()) return false;
      const auto& x = a.list().items;
      const auto& y = b.list().items;
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (x[i] != y[i]) return false;
      return true;
    }
    case Value::Kind::kDict: {
      if (a.is_namespace() || b.is_namespace()) return a.same_as(b);
      const DictObj& x = a.dict_obj();
      const DictObj& y = b.dict_obj();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x.items()) {
        const Value* w = y.find(k);
        if (w == nullptr || *w != v) return false;
      }
      return true;
    }
    default:
      return a.same_as(b);
  }
}

bool Value::same_as(const Value& other) const {
  if (kind() != other.kind()) return false;
  switch (kind()) {
    case Kind::kList:
      return &list() == &other.list();
    case Kind::kDict:
      return &dict_obj() == &other.dict_obj();
    case Kind::kFunction:
      return &function() == &other.function();
    case Kind::kString:
      return str() == other.str();
    default:
      return *this == other;
  }
}

int Value::compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_float(), y = b.as_float();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.list().items;
    const auto& y = b.list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (x[i] == y[i]) continue;
      return compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  fail("'<' not supported between instances of '{}' and '{}'", a.type_name(), b.type_name());
}

// ---- printing ---------------------------------------------------------------------------

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // [-]D[.DDD]e[+-]XX, shortest round trip
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out;
  if (exp < -4 || exp >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  } else if (exp < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else {
    const auto point = static_cast<size_t>(exp) + 1;
    if (digits.size() <= point) {
      out = digits + std::string(point - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, point) + "." + digits.substr(point);
    }
  }
  return sign + out;
}

namespace {
// Python's str.isprintable() for the code points templates meet (controls, separators
// other than the space, and the common format characters are not printable).
bool py_printable(uint32_t cp) {
  if (cp >= 0x110000) return false;  // a raw byte
  if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return false;
  if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F))
    return false;
  if ((cp >= 0x205F && cp <= 0x2064) || cp == 0x3000 || cp == 0xFEFF) return false;
  if ((cp >= 0xD800 && cp <= 0xF8FF) || (cp >= 0xFFF9 && cp <= 0xFFFB)) return false;
  return true;
}
}  // namespace

std::string string_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (uint32_t cp : decode_utf8(s)) {
    char buf[16];
    if (cp == static_cast<uint32_t>(quote) || cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(cp));
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (py_printable(cp)) {
      append_utf8(out, cp);
    } else {
      // A raw byte is shown as Python shows a surrogate escape: '\udcXX'.
      if (cp >= kRawByte) {
        std::snprintf(buf, sizeof buf, "\\udc%02x", cp - kRawByte);
      } else if (cp <= 0xFF) {
        std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      } else if (cp <= 0xFFFF) {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      } else {
        std::snprintf(buf, sizeof buf, "\\U%08x", cp);
      }
      out += buf;
    }
  }
  out.push_back(quote);
  return out;
}

namespace {
void repr_into(const Value& v, std::string& out, std::vector<const void*>& open);

void repr_items(const Value& v, std::string& out, std::vector<const void*>& open) {
  if (v.is_list()) {
    const ListObj& l = v.list();
    out += l.tuple ? "(" : "[";
    for (size_t i = 0; i < l.items.size(); ++i) {
      if (i) out += ", ";
      repr_into(l.items[i], out, open);
    }
    out += l.tuple ? (l.items.size() == 1 ? ",)" : ")") : "]";
    return;
  }
  const DictObj& d = v.dict_obj();
  if (std::find(open.begin(), open.end(), &d) != open.end()) {
    out += "{...}";
    return;
  }
  open.push_back(&d);
  out += "{";
  bool first = true;
  for (const auto& [k, x] : d.items()) {
    if (!first) out += ", ";
    first = false;
    repr_into(k, out, open);
    out += ": ";
    repr_into(x, out, open);
  }
  out += "}";
  open.pop_back();
}

void repr_into(const Value& v, std::string& out, std::vector<const void*>& open) {
  HYP_CHECK(open.size() < static_cast<size_t>(kMaxValueDepth), "value nests too deep to print");
  switch (v.kind()) {
    case Value::Kind::kString:
      out += string_repr(v.str());
      return;
    case Value::Kind::kList:
      repr_items(v, out, open);
      return;
    case Value::Kind::kDict:
      if (v.is_namespace()) {
        out += "<Namespace ";
        repr_items(v, out, open);
        out += ">";
      } else {
        repr_items(v, out, open);
      }
      return;
    case Value::Kind::kUndefined:
      return;
    default:
      out += v.to_str();
      return;
  }
}
}  // namespace

std::string Value::to_str() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return as_bool() ? "True" : "False";
    case Kind::kInt:
      return std::to_string(as_int());
    case Kind::kFloat:
      return float_repr(as_float());
    case Kind::kString:
      return str();
    case Kind::kFunction:
      return "<function " + function().name + ">";
    default:
      return repr();
  }
}

std::string Value::repr() const {
  std::string out;
  std::vector<const void*> open;
  repr_into(*this, out, open);
  return out;
}

// ---- JSON -------------------------------------------------------------------------------

namespace {
void json_string(std::string_view s, bool ensure_ascii, std::string& out) {
  out.push_back('"');
  for (uint32_t cp : decode_utf8(s)) {
    char buf[16];
    switch (cp) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (cp >= kRawByte) {
      // Python holds an undecodable byte as a lone surrogate, which json.dumps escapes.
      std::snprintf(buf, sizeof buf, "\\udc%02x", cp - kRawByte);
      out += buf;
    } else if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
      if (cp >= 0x10000) {
        const uint32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      }
      out += buf;
    } else {
      append_utf8(out, cp);
    }
  }
  out.push_back('"');
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return float_repr(d);
}

struct JsonWriter {
  const Value::JsonOptions& o;
  std::string item_sep, key_sep;
  std::string out;
  std::vector<const void*> open;

  void newline(size_t level) {
    out.push_back('\n');
    for (size_t i = 0; i < level; ++i) out += *o.indent;
  }
  void check_size() const {
    HYP_CHECK(out.size() <= o.max_bytes, "tojson: output exceeds {} bytes", o.max_bytes);
  }
  void write(const Value& v, size_t level) {
    check_size();
    switch (v.kind()) {
      case Value::Kind::kNone:
        out += "null";
        return;
      case Value::Kind::kBool:
        out += v.as_bool() ? "true" : "false";
        return;
      case Value::Kind::kInt:
        out += std::to_string(v.as_int());
        return;
      case Value::Kind::kFloat:
        out += json_float(v.as_float());
        return;
      case Value::Kind::kString:
        json_string(v.str(), o.ensure_ascii, out);
        return;
      case Value::Kind::kList:
        write_list(v, level);
        return;
      case Value::Kind::kDict:
        if (!v.is_namespace()) {
          write_dict(v, level);
          return;
        }
        break;
      default:
        break;
    }
    fail("Object of type {} is not JSON serializable", v.type_name());
  }
  void enter(const void* p) {
    HYP_CHECK(std::find(open.begin(), open.end(), p) == open.end(), "Circular reference detected");
    open.push_back(p);
  }
  void write_list(const Value& v, size_t level) {
    const auto& items = v.list().items;
    if (items.empty()) {
      out += "[]";
      return;
    }
    enter(&v.list());
    out += "[";
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += item_sep;
      if (o.indent) newline(level + 1);
      write(items[i], level + 1);
    }
    if (o.indent) newline(level);
    out += "]";
    open.pop_back();
  }
  static std::string key_text(const Value& k) {
    switch (k.kind()) {
      case Value::Kind::kString:
        return k.str();
      case Value::Kind::kNone:
        return "null";
      case Value::Kind::kBool:
        return k.as_bool() ? "true" : "false";
      case Value::Kind::kInt:
        return std::to_string(k.as_int());
      case Value::Kind::kFloat:
        return json_float(k.as_float());
      default:
        fail("keys must be str, int, float, bool or None, not {}", k.type_name());
    }
  }
  void write_dict(const Value& v, size_t level) {
    const DictObj& d = v.dict_obj();
    if (d.size() == 0) {
      out += "{}";
      return;
    }
    enter(&d);
    std::vector<const std::pair<Value, Value>*> items;
    for (const auto& kv : d.items()) items.push_back(&kv);
    if (o.sort_keys) {
      std::stable_sort(items.begin(), items.end(), [](const auto* a, const auto* b) {
        return Value::compare(a->first, b->first) < 0;
      });
    }
    out += "{";
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += item_sep;
      if (o.indent) newline(level + 1);
      json_string(key_text(items[i]->first), o.ensure_ascii, out);
      out += key_sep;
      write(items[i]->second, level + 1);
    }
    if (o.indent) newline(level);
    out += "}";
    open.pop_back();
  }
};
}  // namespace

std::string Value::to_json(const JsonOptions& options) const {
  JsonWriter w{options, options.indent ? "," : ", ", ": ", {}, {}};
  if (options.separators) {
    w.item_sep = options.separators->first;
    w.key_sep = options.separators->second;
  }
  w.write(*this, 0);
  w.check_size();
  return std::move(w.out);
}

}  // namespace hyperion::text::jinja
