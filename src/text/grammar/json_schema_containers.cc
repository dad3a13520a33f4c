// Objects and arrays for the JSON Schema converter (json_schema_converter.h).
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <map>

#include "text/grammar/gbnf.h"
#include "text/grammar/json_schema_converter.h"
#include "text/grammar/regex_syntax.h"

namespace hyperion::text::schema_gbnf {

namespace {

using regex::append_utf8;

const std::set<std::string> kRefusedObject{"patternProperties", "propertyNames",
                                           "dependentRequired", "dependentSchemas", "dependencies"};
const std::set<std::string> kRefusedArray{"contains", "minContains", "maxContains"};

// Without strict_property_order, objects of at most this many properties take them in any
// order: one rule per set of properties seen, 2^n of them.
constexpr size_t kMaxUnorderedProperties = 8;
// Up to this many leading optional properties, each alternative's tail is written inline;
// beyond, the tails become a chain of rules (the text stays linear in the properties).
constexpr size_t kMaxInlineOptional = 4;
// Tuple positions that may be absent nest one group each; a rule every this many.
constexpr int kMaxInlineTupleNesting = 32;

// The code points of a property name; false where one needs an escape in JSON (a quote,
// a backslash, a control) or the name is not valid UTF-8.
bool code_points(const std::string& s, std::vector<uint32_t>& out) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    if (len == 0 || i + len > s.size()) return false;
    uint32_t cp = len == 1 ? c : c & (0x7Fu >> len);
    for (size_t k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < 0x20 || cp == '"' || cp == '\\') return false;
    out.push_back(cp);
    i += len;
  }
  return true;
}

// Code point c as an item of a GBNF character class.
std::string class_item(uint32_t c) {
  if (c == ']' || c == '[' || c == '-' || c == '^') return std::string{'\\', static_cast<char>(c)};
  if (c < 0x7F) return std::string(1, static_cast<char>(c));
  return c <= 0xFFFF ? fmt::format("\\u{:04X}", c) : fmt::format("\\U{:08X}", c);
}

}  // namespace

std::string Converter::visit_object(const Json& s, const std::string& path,
                                    const std::string& name) {
  for (const auto& [key, v] : s.items())
    if (kRefusedObject.count(key)) fail(join(path, key), fmt::format("'{}' is not supported", key));
  if (s.contains("unevaluatedProperties") && s["unevaluatedProperties"] != Json(true))
    fail(join(path, "unevaluatedProperties"),
         "unevaluatedProperties is not supported (additionalProperties is)");

  struct Property {
    std::string key;
    const Json* schema;
    std::string path;
  };
  std::vector<Property> props;
  if (s.contains("properties")) {
    const Json& p = s["properties"];
    if (!p.is_object()) fail(join(path, "properties"), "must be an object");
    for (auto it = p.begin(); it != p.end(); ++it)
      props.push_back({it.key(), &*it, join(join(path, "properties"), it.key())});
  }
  std::vector<std::string> required;  // in the schema's order
  std::set<std::string> required_set, declared;
  for (const Property& p : props) declared.insert(p.key);
  if (s.contains("required")) {
    const Json& r = s["required"];
    if (!r.is_array()) fail(join(path, "required"), "must be an array of strings");
    for (const Json& k : r) {
      if (!k.is_string()) fail(join(path, "required"), "must be an array of strings");
      if (required_set.insert(k.get<std::string>()).second)
        required.push_back(k.get<std::string>());
    }
  }
  static const Json kAny = true;
  const Json* extra = &kAny;  // the schema of members beyond the declared ones; null: none
  const std::string extra_path = join(path, "additionalProperties");
  if (s.contains("additionalProperties")) {
    const Json& ap = s["additionalProperties"];
    if (!ap.is_boolean() && !ap.is_object()) fail(extra_path, "must be a schema");
    extra = ap == Json(false) ? nullptr : &ap;
  }
  // A required name that is not declared: present, with any value extra members may have.
  for (const std::string& r : required) {
    if (declared.count(r)) continue;
    if (!extra)
      fail(join(path, "required"),
           fmt::format(
               "required property '{}' is not in properties and additionalProperties is false", r));
    props.push_back({r, extra, extra_path});
  }
  const int min_props = count_keyword(s, "minProperties", path, INT_MAX);
  if (min_props > static_cast<int>(required.size()))
    fail(join(path, "minProperties"),
         "minProperties above the number of required properties is not supported");
  const int max_props = count_keyword(s, "maxProperties", path, INT_MAX);
  if (max_props >= 0 && (extra || max_props < static_cast<int>(props.size())))
    fail(join(path, "maxProperties"),
         "maxProperties is only supported where additionalProperties is false and all properties "
         "fit");
  if (props.empty() && extra && *extra == Json(true)) return use("object");

  std::vector<std::string> kv;
  std::vector<bool> is_required;
  for (const Property& p : props) {
    const std::string value = visit_nested(*p.schema, p.path, name + "-" + sanitize(p.key));
    std::string key;
    try {
      key = gbnf_literal(Json(p.key).dump());
    } catch (const nlohmann::json::exception&) {
      fail(p.path, "a property name that is not valid UTF-8");
    }
    kv.push_back(cat({key, ws(), "\":\"", ws(), value, ws()}));
    is_required.push_back(required_set.count(p.key) > 0);
  }
  std::string extra_kv;
  if (extra) {
    std::vector<std::string> keys;
    for (const Property& p : props) keys.push_back(p.key);
    const std::string value = visit_nested(*extra, extra_path, name + "-additional");
    extra_kv = cat({key_except(keys, name), ws(), "\":\"", ws(), value, ws()});
  }
  const bool in_order = options_.strict_property_order || props.size() > kMaxUnorderedProperties;
  return add_rule(name, in_order ? object_in_order(name, kv, is_required, extra_kv)
                                 : object_any_order(name, kv, is_required, extra_kv));
}

// The quoted names an extra member may have: any JSON string but the declared names, so
// that an extra member never stands in for a declared one with another value. Compared
// as spelled: a name written with escapes it does not need (\u0061 for a) is not caught,
// and declared names that need escapes (a quote, a backslash, a control) are not excluded.
// A trie of the names: after each prefix, the next character of some name continues it,
// any other character ends the exclusion (then anything may follow), and the text may end
// there unless the prefix is a name.
std::string Converter::key_except(const std::vector<std::string>& keys, const std::string& name) {
  struct TrieNode {
    std::map<uint32_t, size_t> kids;
    bool name = false;
  };
  std::vector<TrieNode> trie(1);
  for (const std::string& k : keys) {
    std::vector<uint32_t> cps;
    if (!code_points(k, cps)) continue;
    size_t v = 0;
    for (const uint32_t c : cps) {
      const auto it = trie[v].kids.find(c);
      if (it != trie[v].kids.end()) {
        v = it->second;
        continue;
      }
      trie[v].kids[c] = trie.size();
      v = trie.size();
      trie.emplace_back();
    }
    trie[v].name = true;
  }
  if (trie.size() == 1 && !trie[0].name) return use("string");
  use("char");
  // A node's text needs its children's: children come after their parent in `trie`.
  std::vector<std::string> text(trie.size());
  std::vector<int> nesting(trie.size(), 0);
  for (size_t v = trie.size(); v-- > 0;) {
    const TrieNode& n = trie[v];
    std::vector<std::string> alts;
    std::string others;
    int nest = 0;
    for (const auto& [c, u] : n.kids) {
      std::string spelled;
      append_utf8(spelled, c);
      alts.push_back(cat({gbnf_literal(spelled), text[u]}));
      others += class_item(c);
      nest = std::max(nest, nesting[u]);
    }
    alts.push_back(n.kids.empty()
                       ? "char+"
                       : "([^\"\\\\\\x00-\\x1F" + others + "] | " + use("char-escape") + ") char*");
    std::string t =
        alts.size() == 1 && n.name ? alts[0] : "(" + any_of(alts) + ")" + (n.name ? "" : "?");
    nesting[v] = nest + 1;
    if (nesting[v] >= kMaxInlineTupleNesting && v > 0) {
      t = add_rule(fmt::format("{}-key-{}", name, v), t);
      nesting[v] = 0;
    }
    text[v] = t;
  }
  return add_rule(name + "-key", cat({"\"\\\"\"", text[0], "\"\\\"\""}));
}

// Members in the schema's order, each optional one present or not: the first member
// present is one of the properties up to the first required one, and after it each
// property is `"," kv` (required) or `("," kv)?` (optional); extra members come last.
std::string Converter::object_in_order(const std::string& name, const std::vector<std::string>& kv,
                                       const std::vector<bool>& required,
                                       const std::string& extra_kv) {
  const std::string w = ws();
  const size_t n = kv.size();
  const size_t first_required =
      static_cast<size_t>(std::find(required.begin(), required.end(), true) - required.begin());
  auto item = [&](size_t i) {
    const std::string s = cat({"\",\"", w, kv[i]});
    return required[i] ? s : "(" + s + ")?";
  };
  const std::string extras = extra_kv.empty() ? "" : "(" + cat({"\",\"", w, extra_kv}) + ")*";
  // tail[j]: the members after a first member j - 1 (properties j.. then the extras).
  const size_t last =
      std::min(first_required, n == 0 ? 0 : n - 1);  // the last possible first member
  const bool chain = first_required > kMaxInlineOptional;
  std::vector<std::string> tail(n + 2);
  {
    std::string t;
    for (size_t j = last + 1; j < n; ++j) t = cat({t, item(j)});
    t = cat({t, extras});
    tail[last + 1] =
        chain && !t.empty() ? add_rule(fmt::format("{}-tail-{}", name, last + 1), t) : t;
  }
  for (size_t j = last + 1; j-- > 1;) {
    const std::string t = cat({item(j), tail[j + 1]});
    tail[j] = chain ? add_rule(fmt::format("{}-tail-{}", name, j), t) : t;
  }
  std::vector<std::string> alts;
  for (size_t i = 0; n > 0 && i <= last; ++i) alts.push_back(cat({kv[i], tail[i + 1]}));
  const bool may_be_empty = first_required >= n;
  if (may_be_empty && !extra_kv.empty()) alts.push_back(cat({extra_kv, extras}));
  std::string members;
  if (!alts.empty())
    members = alts.size() == 1 && !may_be_empty
                  ? alts[0]
                  : "(" + any_of(alts) + ")" + (may_be_empty ? "?" : "");
  return cat({"\"{\"", w, members, "\"}\""});
}

// Members in any order: after the first member, a rule per set of declared properties
// seen, offering each property not yet seen (and extra members), and the end once every
// required one is in.
std::string Converter::object_any_order(const std::string& name, const std::vector<std::string>& kv,
                                        const std::vector<bool>& required,
                                        const std::string& extra_kv) {
  const std::string w = ws();
  const size_t n = kv.size();
  const unsigned full = (1u << n) - 1;
  unsigned need = 0;
  for (size_t i = 0; i < n; ++i)
    if (required[i]) need |= 1u << i;
  std::vector<std::string> state(full + 1);
  for (unsigned m = 0; m <= full; ++m) state[m] = unique_name(fmt::format("{}-seen-{}", name, m));
  // The rest of the object after the members in `m` (nothing more once all are in, if no extras).
  auto after = [&](unsigned m) { return m == full && extra_kv.empty() ? std::string() : state[m]; };
  for (unsigned m = 0; m <= full; ++m) {
    if ((m == 0 && extra_kv.empty()) || (m == full && extra_kv.empty())) continue;
    std::vector<std::string> alts;
    for (size_t i = 0; i < n; ++i)
      if (!(m & (1u << i))) alts.push_back(cat({"\",\"", w, kv[i], after(m | (1u << i))}));
    if (!extra_kv.empty()) alts.push_back(cat({"\",\"", w, extra_kv, state[m]}));
    define(state[m], (m & need) == need ? "(" + any_of(alts) + ")?" : any_of(alts));
  }
  std::vector<std::string> alts;
  for (size_t i = 0; i < n; ++i) alts.push_back(cat({kv[i], after(1u << i)}));
  if (!extra_kv.empty()) alts.push_back(cat({extra_kv, after(0)}));
  std::string members;
  if (!alts.empty()) members = "(" + any_of(alts) + ")" + (need == 0 ? "?" : "");
  return cat({"\"{\"", w, members, "\"}\""});
}

// Items: the tuple's positions (prefixItems, or draft 4's items array) one by one, each
// present only if the one before is, then the rest as a bounded repetition.
std::string Converter::visit_array(const Json& s, const std::string& path,
                                   const std::string& name) {
  for (const auto& [key, v] : s.items())
    if (kRefusedArray.count(key)) fail(join(path, key), fmt::format("'{}' is not supported", key));
  if (s.contains("unevaluatedItems") && s["unevaluatedItems"] != Json(true))
    fail(join(path, "unevaluatedItems"), "unevaluatedItems is not supported");
  if (s.contains("uniqueItems") && s["uniqueItems"] != Json(false))
    fail(join(path, "uniqueItems"), "uniqueItems is not supported");
  static const Json kAny = true;
  std::vector<const Json*> prefix;
  std::string prefix_key, rest_key = "items";
  const Json* rest = &kAny;
  auto tuple = [&](const char* key) {
    const Json& t = s[key];
    if (!t.is_array()) fail(join(path, key), "must be an array of schemas");
    for (const Json& e : t) prefix.push_back(&e);
    prefix_key = key;
  };
  if (s.contains("prefixItems")) {
    tuple("prefixItems");
    if (s.contains("items")) rest = &s["items"];
  } else if (s.contains("items") && s["items"].is_array()) {
    tuple("items");
    if (s.contains("additionalItems")) rest = &s["additionalItems"], rest_key = "additionalItems";
  } else if (s.contains("items")) {
    rest = &s["items"];
  }
  if (!rest->is_boolean() && !rest->is_object()) fail(join(path, rest_key), "must be a schema");
  const bool no_rest = *rest == Json(false);
  const int p = static_cast<int>(prefix.size());
  const int min = std::max(0, count_keyword(s, "minItems", path, GrammarLimits::kMaxRepeat));
  const int max_items = count_keyword(s, "maxItems", path, GrammarLimits::kMaxRepeat);
  const int max =
      no_rest ? (max_items < 0 ? p : std::min(max_items, p)) : max_items;  // -1: unbounded
  if (max >= 0 && min > max)
    fail(join(path, max_items >= 0 && max_items < min ? "maxItems" : "minItems"),
         no_rest && (max_items < 0 || max_items >= min)
             ? "minItems is above the number of items the tuple allows"
             : "maxItems is below minItems");
  if (p == 0 && *rest == Json(true) && min == 0 && max < 0) return use("array");

  const std::string w = ws();
  const int shown = max < 0 ? p : std::min(p, max);  // tuple positions that can appear
  std::vector<std::string> el;
  for (int i = 0; i < shown; ++i)
    el.push_back(cat({visit_nested(*prefix[static_cast<size_t>(i)],
                                   join(join(path, prefix_key), std::to_string(i)),
                                   fmt::format("{}-{}", name, i)),
                      w}));
  const bool rest_used = !no_rest && (max < 0 || max > p);
  const std::string x =
      rest_used ? cat({visit_nested(*rest, join(path, rest_key), name + "-item"), w}) : "";
  std::string more = "(";
  more.append(cat({"\",\"", w, x})).append(")");
  std::string inner;
  if (p == 0) {
    if (max != 0) inner = cat({x, repeat(more, std::max(min, 1) - 1, max < 0 ? -1 : max - 1)});
  } else {
    std::string tail = rest_used ? repeat(more, std::max(0, min - p), max < 0 ? -1 : max - p) : "";
    int nesting = 0;
    for (int i = shown - 1; i >= 1; --i) {
      const std::string seg = cat({"\",\"", w, el[static_cast<size_t>(i)], tail});
      if (i < min) {
        tail = seg;
      } else {
        tail = "(" + seg + ")?";
        if (++nesting >= kMaxInlineTupleNesting) {
          tail = add_rule(fmt::format("{}-from-{}", name, i), tail);
          nesting = 0;
        }
      }
    }
    if (shown > 0) inner = cat({el[0], tail});
  }
  const std::string items = inner.empty() ? "" : min == 0 ? "(" + inner + ")?" : inner;
  return add_rule(name, cat({"\"[\"", w, items, "\"]\""}));
}

}  // namespace hyperion::text::schema_gbnf
