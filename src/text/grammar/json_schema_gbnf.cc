#include "text/grammar/json_schema_gbnf.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <optional>

#include "text/grammar/gbnf.h"
#include "text/grammar/json_schema_converter.h"
#include "text/grammar/json_schema_numbers.h"
#include "text/grammar/regex_gbnf.h"

namespace hyperion::text::schema_gbnf {

namespace {

// The shared rules, in the order they are written; each with the rules it uses.
struct Primitive {
  const char* name;
  const char* body;  // ws's is written from the options
  std::vector<const char*> uses;
};

const std::vector<Primitive>& primitives() {
  static const std::vector<Primitive> table = {
      {"value",
       "object | array | string | number | boolean | null",
       {"object", "array", "string", "number", "boolean", "null"}},
      {"object",
       "\"{\" ws ( string ws \":\" ws value ws ( \",\" ws string ws \":\" ws value ws )* )? \"}\"",
       {"ws", "string", "value"}},
      {"array", "\"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"", {"ws", "value"}},
      {"string", "\"\\\"\" char* \"\\\"\"", {"char"}},
      {"char", "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})", {}},
      {"char-escape", "\"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})", {}},
      {"number",
       "\"-\"? (\"0\" | [1-9] [0-9]{0,15}) (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,16})?",
       {}},
      {"integer", "\"-\"? (\"0\" | [1-9] [0-9]{0,15})", {}},
      {"boolean", "\"true\" | \"false\"", {}},
      {"null", "\"null\"", {}},
      {"date-string", "\"\\\"\" date \"\\\"\"", {"date"}},
      {"time-string", "\"\\\"\" time \"\\\"\"", {"time"}},
      {"date-time-string", "\"\\\"\" date-time \"\\\"\"", {"date-time"}},
      {"uuid-string", "\"\\\"\" uuid \"\\\"\"", {"uuid"}},
      {"email-string", "\"\\\"\" email \"\\\"\"", {"email"}},
      {"ipv4-string", "\"\\\"\" ipv4 \"\\\"\"", {"ipv4"}},
      {"date-time", "date [Tt] time", {"date", "time"}},
      {"date",
       "[0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01])",
       {}},
      {"time",
       "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" ([0-5] [0-9] | \"60\") (\".\" "
       "[0-9]{1,9})? "
       "([Zz] | [+\\-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])",
       {}},
      {"uuid",
       "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
       "[0-9a-fA-F]{12}",
       {}},
      {"email",
       "email-atom (\".\" email-atom)* \"@\" email-label (\".\" email-label)+",
       {"email-atom", "email-label"}},
      {"email-atom", "[A-Za-z0-9!#$%&'*+/=?\\^_`{|}~\\-]+", {}},
      {"email-label", "[A-Za-z0-9] ([A-Za-z0-9\\-]* [A-Za-z0-9])?", {}},
      {"ipv4", "ipv4-octet \".\" ipv4-octet \".\" ipv4-octet \".\" ipv4-octet", {"ipv4-octet"}},
      {"ipv4-octet",
       "\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9]",
       {}},
      {"ws", "", {}},
  };
  return table;
}

const std::set<std::string>& formats() {
  static const std::set<std::string> f{"date", "time", "date-time", "uuid", "email", "ipv4"};
  return f;
}

const std::vector<std::string>& all_types() {
  static const std::vector<std::string> t{"object", "array", "string", "number", "boolean", "null"};
  return t;
}

// Refused wherever they appear (the object and array ones: json_schema_containers.cc).
const std::set<std::string> kRefused{"not", "if", "then", "else", "$dynamicRef", "$recursiveRef"};

// visit() calls: $ref, allOf and anyOf can revisit parts of a schema.
constexpr size_t kMaxVisits = 4 * GrammarLimits::kMaxSchemaNodes;

// Whether `s` has keywords that constrain values besides `except`.
bool has_other_validation(const Json& s, std::initializer_list<const char*> except) {
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& key = it.key();
    if (is_annotation_keyword(key) || key == "$defs" || key == "definitions") continue;
    if (std::none_of(except.begin(), except.end(), [&](const char* e) { return key == e; }))
      return true;
  }
  return false;
}

// Refuses a schema of more than kMaxSchemaNodes objects (or 8 times as many JSON values
// of any kind) or nesting deeper than kMaxNesting objects, before any other work: a
// schema of 10^5 properties fails at once. A template: the nlohmann::json overload checks
// before converting (converting to ordered_json costs quadratic time in an object's size).
struct SizeCheck {
  std::vector<std::string> path;
  size_t objects = 0, values = 0;

  template <typename J>
  void walk(const J& j, int depth) {
    if (++values > 8 * GrammarLimits::kMaxSchemaNodes)
      fail("", fmt::format("the schema has more than {} JSON values",
                           8 * GrammarLimits::kMaxSchemaNodes));
    if (j.is_object()) {
      if (++objects > GrammarLimits::kMaxSchemaNodes)
        fail("",
             fmt::format("the schema has more than {} objects", GrammarLimits::kMaxSchemaNodes));
      if (++depth > GrammarLimits::kMaxNesting) {
        std::string at;
        for (const std::string& k : path) at = join(at, k);
        fail(at,
             fmt::format("the schema nests deeper than {} objects", GrammarLimits::kMaxNesting));
      }
    }
    if (!j.is_structured()) return;
    size_t i = 0;
    for (auto it = j.begin(); it != j.end(); ++it, ++i) {
      path.push_back(j.is_object() ? it.key() : std::to_string(i));
      walk(*it, depth);
      path.pop_back();
    }
  }
};

template <typename J>
void check_size(const J& schema) {
  SizeCheck().walk(schema, 0);
}

}  // namespace

std::string sanitize(const std::string& s) {
  std::string out;
  for (const char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    out += ok ? c : '-';
    if (out.size() >= 48) break;
  }
  return out.empty() ? "x" : out;
}

int count_keyword(const Json& s, const char* key, const std::string& path, int limit) {
  if (!s.contains(key)) return -1;
  const Json& v = s[key];
  const std::optional<Decimal> d = v.is_number() ? Decimal::parse(v.dump()) : std::nullopt;
  if (!d || d->negative || !d->frac_digits.empty())
    fail(join(path, key), "must be a non-negative integer");
  if (d->int_digits.size() > 9 || std::stol(d->int_digits) > limit)
    fail(join(path, key),
         fmt::format("{} is over the supported limit of {}", d->int_digits, limit));
  return static_cast<int>(std::stol(d->int_digits));
}

Converter::Converter(const Json& root, const JsonSchemaOptions& options)
    : root_(root), options_(options) {
  if (options.max_whitespace < 0 || options.max_whitespace > GrammarLimits::kMaxRepeat)
    fail("", fmt::format("max_whitespace must be in [0, {}]", GrammarLimits::kMaxRepeat));
  for (const Primitive& p : primitives()) taken_.insert(p.name);
  taken_.insert("root");
  pending_.insert("root");
  ref_names_["#"] = "root";
}

std::string Converter::run() {
  alias_ = {"#"};
  const std::string e = visit(root_, "", "root");
  if (pending_.count("root")) define("root", e);
  std::string out;
  for (const auto& [name, body] : rules_)
    if (name == "root") out += name + " ::= " + body + "\n";
  for (const auto& [name, body] : rules_)
    if (name != "root") out += name + " ::= " + body + "\n";
  for (const Primitive& p : primitives()) {
    if (!used_.count(p.name)) continue;
    const std::string body =
        std::string(p.name) == "ws"
            ? fmt::format("| \" \" | \"\\n\" [ \\t]{{0,{}}}", options_.max_whitespace)
            : p.body;
    out += std::string(p.name) + " ::= " + body + "\n";
  }
  if (out.size() > GrammarLimits::kMaxSourceBytes)
    fail("", fmt::format("the grammar would be {} bytes, over the limit of {}", out.size(),
                         GrammarLimits::kMaxSourceBytes));
  return out;
}

// -- Rules ----------------------------------------------------------------------------

std::string Converter::use(const std::string& name) {
  if (!used_.insert(name).second) return name;
  for (const Primitive& p : primitives())
    if (p.name == name)
      for (const char* u : p.uses) use(u);
  return name;
}
// The whitespace between tokens: nothing when max_whitespace is 0.
std::string Converter::ws() {
  return options_.max_whitespace > 0 ? use("ws") : "";
}

std::string Converter::unique_name(const std::string& hint) {
  std::string name = hint.size() > 120 ? hint.substr(0, 120) : hint;
  for (int k = 1; taken_.count(name); ++k) name = fmt::format("{}-{}", hint.substr(0, 120), k);
  taken_.insert(name);
  return name;
}

void Converter::define(const std::string& name, const std::string& body) {
  pending_.erase(name);
  rules_.emplace_back(name, body);
  if (rules_.size() > GrammarLimits::kMaxRules)
    fail("", fmt::format("the grammar needs more than {} rules", GrammarLimits::kMaxRules));
}

// A rule for `body` named after `hint` (exactly `hint` when that name was reserved
// for it); a body already written is shared.
std::string Converter::add_rule(const std::string& hint, const std::string& body) {
  if (pending_.count(hint)) {
    define(hint, body);
    return hint;
  }
  const auto it = by_body_.find(body);
  if (it != by_body_.end()) return it->second;
  const std::string name = unique_name(hint);
  define(name, body);
  by_body_[body] = name;
  return name;
}

// -- Schemas --------------------------------------------------------------------------

// The expression (an atom: a rule name or a literal) for values valid against `s`.
std::string Converter::visit(const Json& s, const std::string& path, const std::string& name) {
  if (++visits_ > kMaxVisits)
    fail(path, fmt::format("the schema expands to more than {} subschemas", kMaxVisits));
  if (depth_ >= GrammarLimits::kMaxNesting)
    fail(path, fmt::format("schemas nest deeper than {} (through $ref or allOf)",
                           GrammarLimits::kMaxNesting));
  ++depth_;
  std::string e = visit_schema(s, path, name);
  --depth_;
  return e;
}

std::string Converter::visit_schema(const Json& s, const std::string& path,
                                    const std::string& name) {
  if (s.is_boolean()) {
    if (s.get<bool>()) return use("value");
    fail(path, "the schema false matches nothing: no value can be generated");
  }
  if (!s.is_object()) fail(path, "a schema must be an object or a boolean");
  for (const auto& [key, v] : s.items())
    if (kRefused.count(key)) fail(join(path, key), fmt::format("'{}' is not supported", key));

  if (s.contains("$ref")) {
    if (!has_other_validation(s, {"$ref"})) return ref(s["$ref"], join(path, "$ref"));
    Json ref_only = Json{{"$ref", s["$ref"]}};
    Json rest = s;
    rest.erase("$ref");
    return visit(merge({{&ref_only, path}, {&rest, path}}), join(path, "allOf"), name);
  }
  if (s.contains("allOf")) {
    const Json& all = s["allOf"];
    if (!all.is_array() || all.empty()) fail(join(path, "allOf"), "must be a non-empty array");
    if (all.size() == 1 && !has_other_validation(s, {"allOf"}))
      return visit(all[0], join(path, "allOf.0"), name);
    return visit(merge({{&s, path}}), join(path, "allOf"), name);
  }
  if (s.contains("anyOf") || s.contains("oneOf")) return visit_any_of(s, path, name);
  if (s.contains("enum") || s.contains("const")) return visit_enum(s, path, name);

  const std::vector<std::string> types = types_of(s, path);
  if (!s.contains("type") && !has_other_validation(s, {})) return use("value");
  std::vector<std::string> alts;
  for (const std::string& t : types) {
    const std::string e = visit_type(t, s, path, types.size() == 1 ? name : name + "-" + t);
    if (std::find(alts.begin(), alts.end(), e) == alts.end()) alts.push_back(e);
  }
  return alts.size() == 1 ? alts[0] : add_rule(name, any_of(alts));
}

Json Converter::merge(const std::vector<SchemaPart>& parts) {
  return merge_schemas(parts, [this](const std::string& r, const std::string& at) -> const Json& {
    return *resolve(r, at).first;
  });
}

std::vector<std::string> Converter::types_of(const Json& s, const std::string& path) {
  std::vector<std::string> out;
  if (!s.contains("type")) {
    out = all_types();
  } else {
    const Json& t = s["type"];
    auto add = [&](const Json& v) {
      static const std::set<std::string> known{"string", "number", "integer", "boolean",
                                               "null",   "object", "array"};
      if (!v.is_string() || !known.count(v.get<std::string>()))
        fail(join(path, "type"), fmt::format("unknown type {}", v.dump()));
      if (std::find(out.begin(), out.end(), v.get<std::string>()) == out.end())
        out.push_back(v.get<std::string>());
    };
    if (t.is_array()) {
      if (t.empty()) fail(join(path, "type"), "an empty list of types matches nothing");
      for (const Json& v : t) add(v);
    } else {
      add(t);
    }
    if (std::find(out.begin(), out.end(), "number") != out.end())
      out.erase(std::remove(out.begin(), out.end(), "integer"), out.end());  // within number
  }
  if (s.contains("nullable") && s["nullable"] == Json(true) &&
      std::find(out.begin(), out.end(), "null") == out.end())
    out.push_back("null");
  return out;
}

std::string Converter::visit_type(const std::string& t, const Json& s, const std::string& path,
                                  const std::string& name) {
  if (t == "null") return use("null");
  if (t == "boolean") return use("boolean");
  if (t == "string") return visit_string(s, path, name);
  if (t == "integer" || t == "number") return visit_number(s, path, name, t == "integer");
  if (t == "object") return visit_object(s, path, name);
  return visit_array(s, path, name);
}

// -- $ref -----------------------------------------------------------------------------

// The schema a $ref names and the path to report for it: "#", "#/$defs/NAME",
// "#/definitions/NAME".
std::pair<const Json*, std::string> Converter::resolve(const std::string& ref,
                                                       const std::string& at) {
  if (ref == "#") return {&root_, ""};
  auto unsupported = [&] {
    fail(at, fmt::format("$ref '{}' is not supported (only #, #/$defs/NAME and #/definitions/NAME)",
                         ref));
  };
  if (ref.rfind("#/", 0) != 0) unsupported();
  std::string decoded;  // %XX, as in a URI fragment
  for (size_t i = 2; i < ref.size(); ++i) {
    if (ref[i] == '%' && i + 2 < ref.size() &&
        std::isxdigit(static_cast<unsigned char>(ref[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(ref[i + 2]))) {
      decoded += static_cast<char>(std::stoi(ref.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      decoded += ref[i];
    }
  }
  const size_t slash = decoded.find('/');
  if (slash == std::string::npos) unsupported();
  const std::string container = decoded.substr(0, slash);
  std::string def;
  for (size_t i = slash + 1; i < decoded.size(); ++i) {
    if (decoded[i] == '/') unsupported();
    if (decoded[i] == '~' && i + 1 < decoded.size() &&
        (decoded[i + 1] == '0' || decoded[i + 1] == '1')) {
      def += decoded[i + 1] == '0' ? '~' : '/';
      ++i;
    } else {
      def += decoded[i];
    }
  }
  if (container != "$defs" && container != "definitions") unsupported();
  if (!root_.contains(container) || !root_[container].is_object() ||
      !root_[container].contains(def))
    fail(at, fmt::format("$ref '{}': no such definition", ref));
  return {&root_[container][def], container + "." + def};
}

std::string Converter::ref(const Json& r, const std::string& at) {
  if (!r.is_string()) fail(at, "$ref must be a string");
  const std::string key = r.get<std::string>();
  if (std::find(alias_.begin(), alias_.end(), key) != alias_.end())
    fail(at, fmt::format(
                 "$ref '{}' refers back to itself before any value starts: it can never end", key));
  const auto known = ref_names_.find(key);
  if (known != ref_names_.end()) return known->second;
  const auto [target, target_path] = resolve(key, at);
  const size_t dot = target_path.find('.');
  const std::string name = unique_name(sanitize(target_path.substr(dot + 1)));
  pending_.insert(name);
  ref_names_[key] = name;
  alias_.push_back(key);
  const std::string e = visit(*target, target_path, name);
  alias_.pop_back();
  if (pending_.count(name)) define(name, e);
  return name;
}

// A value nested in an object or array: whatever it refers to, text comes before it,
// so a $ref back to an enclosing schema is recursion with progress.
std::string Converter::visit_nested(const Json& s, const std::string& path,
                                    const std::string& name) {
  std::vector<std::string> saved;
  std::swap(saved, alias_);
  std::string e = visit(s, path, name);
  std::swap(saved, alias_);
  return e;
}

// -- anyOf, enum ----------------------------------------------------------------------

std::string Converter::visit_any_of(const Json& s, const std::string& path,
                                    const std::string& name) {
  if (s.contains("anyOf") && s.contains("oneOf"))
    fail(join(path, "oneOf"), "anyOf and oneOf in one schema are not supported");
  const std::string key = s.contains("anyOf") ? "anyOf" : "oneOf";
  const Json& list = s[key];
  if (!list.is_array() || list.empty()) fail(join(path, key), "must be a non-empty array");
  Json siblings = s;
  siblings.erase(key);
  const bool merge_siblings = has_other_validation(siblings, {});
  std::vector<std::string> alts;
  std::set<std::string> seen;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = join(path, key + "." + std::to_string(i));
    if (list[i] == Json(false)) continue;  // contributes nothing
    const std::string e = merge_siblings ? visit(merge({{&siblings, path}, {&list[i], at}}), at,
                                                 fmt::format("{}-{}", name, i))
                                         : visit(list[i], at, fmt::format("{}-{}", name, i));
    if (seen.insert(e).second) alts.push_back(e);
  }
  if (alts.empty()) fail(join(path, key), "every alternative is false: no value can be generated");
  return alts.size() == 1 ? alts[0] : add_rule(name, any_of(alts));
}

std::string Converter::visit_enum(const Json& s, const std::string& path, const std::string& name) {
  for (const auto& [key, v] : s.items())
    if (key != "enum" && key != "const" && key != "type" && key != "nullable" && key != "$defs" &&
        key != "definitions" && !is_annotation_keyword(key))
      fail(join(path, key), fmt::format("'{}' together with enum or const is not supported", key));
  std::vector<Json> values;
  if (s.contains("enum")) {
    if (!s["enum"].is_array()) fail(join(path, "enum"), "must be an array");
    values.assign(s["enum"].begin(), s["enum"].end());
  }
  if (s.contains("const")) {
    const Json& c = s["const"];
    if (s.contains("enum")) {
      const bool listed = std::find(values.begin(), values.end(), c) != values.end();
      values.clear();
      if (listed) values.push_back(c);
    } else {
      values.push_back(c);
    }
  }
  if (s.contains("type")) {
    const std::vector<std::string> types = types_of(s, path);
    auto allowed = [&](const std::string& t) {
      return std::find(types.begin(), types.end(), t) != types.end();
    };
    values.erase(std::remove_if(values.begin(), values.end(),
                                [&](const Json& v) {
                                  if (v.is_null()) return !allowed("null");
                                  if (v.is_boolean()) return !allowed("boolean");
                                  if (v.is_string()) return !allowed("string");
                                  if (v.is_object()) return !allowed("object");
                                  if (v.is_array()) return !allowed("array");
                                  const bool integral =
                                      v.is_number_integer() ||
                                      Decimal::parse(v.dump())->frac_digits.empty();
                                  return !(allowed("number") || (integral && allowed("integer")));
                                }),
                 values.end());
  }
  const std::string at = join(path, s.contains("enum") ? "enum" : "const");
  if (values.empty()) fail(at, "no value satisfies enum/const together with type");
  std::vector<std::string> alts;
  std::set<std::string> seen;
  for (const Json& v : values) {
    try {
      const std::string text = v.dump();
      if (seen.insert(text).second) alts.push_back(value_text(v));
    } catch (const nlohmann::json::exception& e) {
      fail(at, fmt::format("a value cannot be written as JSON: {}", e.what()));
    }
  }
  return alts.size() == 1 && alts[0][0] == '"' ? alts[0] : add_rule(name, any_of(alts));
}

// One JSON value as written by nlohmann's dump, with the same whitespace between tokens
// as any other array or object here.
std::string Converter::value_text(const Json& v) {
  if (v.is_array()) {
    std::string items;
    for (size_t i = 0; i < v.size(); ++i)
      items = cat({items, i ? "\",\"" : "", i ? ws() : "", value_text(v[i]), ws()});
    return cat({"\"[\"", ws(), items, "\"]\""});
  }
  if (v.is_object()) {
    std::string members;
    for (auto it = v.begin(); it != v.end(); ++it)
      members =
          cat({members, members.empty() ? "" : "\",\"", members.empty() ? "" : ws(),
               gbnf_literal(Json(it.key()).dump()), ws(), "\":\"", ws(), value_text(*it), ws()});
    return cat({"\"{\"", ws(), members, "\"}\""});
  }
  return gbnf_literal(v.dump());
}

// -- Strings --------------------------------------------------------------------------

std::string Converter::visit_string(const Json& s, const std::string& path,
                                    const std::string& name) {
  const int min = count_keyword(s, "minLength", path, GrammarLimits::kMaxRepeat);
  const int max = count_keyword(s, "maxLength", path, GrammarLimits::kMaxRepeat);
  const bool lengths = min >= 0 || max >= 0;
  if (min >= 0 && max >= 0 && min > max)
    fail(join(path, "maxLength"), "maxLength is below minLength");
  if (s.contains("pattern")) {
    if (lengths)
      fail(join(path, "pattern"), "pattern together with minLength/maxLength is not supported");
    if (s.contains("format"))
      fail(join(path, "format"), "format together with pattern is not supported");
    if (!s["pattern"].is_string()) fail(join(path, "pattern"), "must be a string");
    std::string content;
    try {
      content =
          schema_pattern_to_gbnf(s["pattern"].get<std::string>(), RegexTarget::kJsonStringContent);
    } catch (const GrammarError& e) {
      fail(join(path, "pattern"), e.where.empty() ? e.detail : e.where + ": " + e.detail);
    }
    return add_rule(name, cat({"\"\\\"\"", add_rule(name + "-content", content), "\"\\\"\""}));
  }
  if (s.contains("format")) {
    const Json& f = s["format"];
    if (!f.is_string() || !formats().count(f.get<std::string>()))
      fail(join(path, "format"),
           fmt::format("unsupported format {} (supported: date, time, date-time, "
                       "uuid, email, ipv4)",
                       f.dump()));
    if (lengths)
      fail(join(path, "format"), "format together with minLength/maxLength is not supported");
    return use(f.get<std::string>() + "-string");
  }
  if (max < 0 && min <= 0) return use("string");
  return add_rule(name, cat({"\"\\\"\"", repeat(use("char"), std::max(min, 0), max), "\"\\\"\""}));
}

// -- Numbers --------------------------------------------------------------------------

std::string Converter::visit_number(const Json& s, const std::string& path, const std::string& name,
                                    bool integer) {
  if (s.contains("multipleOf")) fail(join(path, "multipleOf"), "multipleOf is not supported");
  std::optional<NumberBound> lo, hi;
  std::string lo_key, hi_key;
  auto bound = [&](const char* key, bool lower, bool exclusive) {
    const Json& v = s[key];
    if (!v.is_number()) fail(join(path, key), "must be a number");
    const Decimal d = *Decimal::parse(v.dump());
    if (std::max(d.int_digits.size(), d.frac_digits.size()) > static_cast<size_t>(kMaxBoundDigits))
      fail(join(path, key),
           fmt::format("a bound with more than {} digits on a side of the point", kMaxBoundDigits));
    std::optional<NumberBound>& b = lower ? lo : hi;
    const int c = b ? compare(d, b->value) : 0;
    if (!b || (lower ? c > 0 : c < 0) || (c == 0 && exclusive)) {
      b = NumberBound{d, exclusive};
      (lower ? lo_key : hi_key) = key;
    }
  };
  // Draft 4 wrote exclusiveMinimum: true beside minimum.
  auto flag = [&](const char* key) {
    if (!s.contains(key) || !s[key].is_boolean()) return false;
    return s[key].get<bool>();
  };
  if (s.contains("minimum")) bound("minimum", true, flag("exclusiveMinimum"));
  if (s.contains("maximum")) bound("maximum", false, flag("exclusiveMaximum"));
  if (s.contains("exclusiveMinimum") && !s["exclusiveMinimum"].is_boolean())
    bound("exclusiveMinimum", true, true);
  if (s.contains("exclusiveMaximum") && !s["exclusiveMaximum"].is_boolean())
    bound("exclusiveMaximum", false, true);
  if (!lo && !hi) return use(integer ? "integer" : "number");
  const std::optional<std::string> e =
      integer ? integer_range_gbnf(lo, hi) : decimal_range_gbnf(lo, hi);
  if (!e)
    fail(join(path, hi_key.empty() ? lo_key : hi_key),
         fmt::format("no {} satisfies the bounds{}{}", integer ? "integer" : "number",
                     lo ? fmt::format(" {} {}", lo->exclusive ? ">" : ">=", lo->value.str()) : "",
                     hi ? fmt::format(" {} {}", hi->exclusive ? "<" : "<=", hi->value.str()) : ""));
  return add_rule(name, *e);
}

}  // namespace hyperion::text::schema_gbnf

namespace hyperion::text {

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema,
                                const JsonSchemaOptions& options) {
  schema_gbnf::check_size(schema);
  return schema_gbnf::Converter(schema, options).run();
}

std::string json_schema_to_gbnf(const nlohmann::json& schema, const JsonSchemaOptions& options) {
  schema_gbnf::check_size(schema);
  return json_schema_to_gbnf(nlohmann::ordered_json(schema), options);
}

std::string json_object_gbnf(const JsonSchemaOptions& options) {
  return json_schema_to_gbnf(nlohmann::ordered_json{{"type", "object"}}, options);
}

}  // namespace hyperion::text
