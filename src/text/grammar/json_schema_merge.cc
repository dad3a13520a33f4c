#include "text/grammar/json_schema_merge.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "text/grammar/json_schema_numbers.h"

namespace hyperion::text {

namespace {

using Json = nlohmann::ordered_json;

std::string join(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

// A merge reads at most this many keywords (allOf through $ref can repeat schemas).
constexpr size_t kMaxMergedKeywords = 100000;
constexpr int kMaxRefHops = 32;

const std::set<std::string>& type_names() {
  static const std::set<std::string> names{"string", "number", "integer", "boolean",
                                           "null",   "object", "array"};
  return names;
}

std::set<std::string> types_of(const Json& t, const std::string& path) {
  std::set<std::string> out;
  auto add = [&](const Json& v) {
    if (!v.is_string() || !type_names().count(v.get<std::string>()))
      throw GrammarError(path, fmt::format("unknown type {}", v.dump()));
    out.insert(v.get<std::string>());
  };
  if (t.is_array())
    for (const Json& v : t) add(v);
  else
    add(t);
  return out;
}

Decimal number_of(const Json& v, const std::string& path) {
  if (!v.is_number()) throw GrammarError(path, "must be a number");
  return *Decimal::parse(v.dump());
}

class Merger {
 public:
  explicit Merger(const SchemaResolver& resolve) : resolve_(resolve) {}

  Json run(const std::vector<SchemaPart>& parts) {
    for (const SchemaPart& p : parts) add(*p.schema, p.path, 0);
    check_additional_properties();
    return acc_;
  }

 private:
  struct Closed {  // a part's additionalProperties other than true
    std::set<std::string> declared;
    std::string path;
  };

  void add(const Json& part, const std::string& path, int hops) {
    if (part.is_boolean()) {
      if (part.get<bool>()) return;
      throw GrammarError(path, "false in allOf: no value satisfies it");
    }
    if (!part.is_object()) throw GrammarError(path, "a schema must be an object or a boolean");
    if (part.contains("$ref")) {
      const std::string at = join(path, "$ref");
      if (!part["$ref"].is_string()) throw GrammarError(at, "$ref must be a string");
      const std::string ref = part["$ref"].get<std::string>();
      if (std::find(refs_.begin(), refs_.end(), ref) != refs_.end())
        throw GrammarError(at, fmt::format("$ref '{}' loops back to itself through allOf", ref));
      if (hops >= kMaxRefHops)
        throw GrammarError(at, fmt::format("more than {} $ref hops inside allOf", kMaxRefHops));
      refs_.push_back(ref);
      add(resolve_(ref, at), at, hops + 1);
      refs_.pop_back();
    }
    if (part.contains("allOf")) {
      const Json& all = part["allOf"];
      if (!all.is_array() || all.empty())
        throw GrammarError(join(path, "allOf"), "must be a non-empty array");
      for (size_t i = 0; i < all.size(); ++i)
        add(all[i], join(join(path, "allOf"), std::to_string(i)), hops + 1);
    }
    if (part.contains("additionalProperties") && part["additionalProperties"] != Json(true)) {
      Closed c{{}, join(path, "additionalProperties")};
      if (part.contains("properties") && part["properties"].is_object())
        for (const auto& [k, v] : part["properties"].items()) c.declared.insert(k);
      closed_.push_back(std::move(c));
    }
    for (const auto& [key, value] : part.items()) {
      if (key == "$ref" || key == "allOf" || key == "$defs" || key == "definitions" ||
          is_annotation_keyword(key))
        continue;
      if (++keywords_ > kMaxMergedKeywords)
        throw GrammarError(path,
                           fmt::format("allOf merges more than {} keywords", kMaxMergedKeywords));
      merge_key(key, value, join(path, key));
    }
  }

  void merge_key(const std::string& key, const Json& v, const std::string& path) {
    if (!acc_.contains(key)) {
      acc_[key] = v;
      return;
    }
    Json& a = acc_[key];
    if (a == v) return;
    if (key == "type") {
      const std::set<std::string> x = types_of(a, path), y = types_of(v, path);
      auto admits = [](const std::set<std::string>& s, const std::string& t) {
        return s.count(t) > 0 || (t == "integer" && s.count("number") > 0);
      };
      const bool number = admits(x, "number") && admits(y, "number");
      Json both = Json::array();
      for (const std::string& t : type_names())  // integer is within number
        if (admits(x, t) && admits(y, t) && !(t == "integer" && number)) both.push_back(t);
      if (both.empty()) throw GrammarError(path, "the allOf parts' types have nothing in common");
      a = both.size() == 1 ? both[0] : both;
    } else if (key == "properties") {
      if (!a.is_object() || !v.is_object()) throw GrammarError(path, "must be an object");
      for (const auto& [name, schema] : v.items()) {
        if (a.contains(name))
          a[name] = Json{{"allOf", Json::array({a[name], schema})}};
        else
          a[name] = schema;
      }
    } else if (key == "required") {
      if (!a.is_array() || !v.is_array()) throw GrammarError(path, "must be an array of strings");
      for (const Json& name : v)
        if (std::find(a.begin(), a.end(), name) == a.end()) a.push_back(name);
    } else if (key == "minimum" || key == "minLength" || key == "minItems" ||
               key == "minProperties" ||
               (key == "exclusiveMinimum" && a.is_number() && v.is_number())) {
      if (compare(number_of(v, path), number_of(a, path)) > 0) a = v;
    } else if (key == "maximum" || key == "maxLength" || key == "maxItems" ||
               key == "maxProperties" ||
               (key == "exclusiveMaximum" && a.is_number() && v.is_number())) {
      if (compare(number_of(v, path), number_of(a, path)) < 0) a = v;
    } else if (key == "enum") {
      if (!a.is_array() || !v.is_array()) throw GrammarError(path, "must be an array");
      Json both = Json::array();
      for (const Json& x : a)
        if (std::find(v.begin(), v.end(), x) != v.end()) both.push_back(x);
      if (both.empty()) throw GrammarError(path, "the allOf parts' enums have no value in common");
      a = both;
    } else if (key == "items" || key == "additionalItems" || key == "additionalProperties") {
      if (a == Json(false) || v == Json(true)) return;
      if (v == Json(false) || a == Json(true))
        a = v;
      else
        a = Json{{"allOf", Json::array({a, v})}};
    } else if (key == "prefixItems" && a.is_array() && v.is_array() && a.size() == v.size()) {
      for (size_t i = 0; i < a.size(); ++i) a[i] = Json{{"allOf", Json::array({a[i], v[i]})}};
    } else if (key == "uniqueItems" && a.is_boolean() && v.is_boolean()) {
      a = a.get<bool>() || v.get<bool>();
    } else if (key == "nullable" && a.is_boolean() && v.is_boolean()) {
      a = a.get<bool>() && v.get<bool>();
    } else if (key == "const") {
      throw GrammarError(path, "the allOf parts' consts differ: no value satisfies them");
    } else {
      throw GrammarError(path,
                         fmt::format("allOf parts with different '{}' cannot be merged", key));
    }
  }

  // A part's additionalProperties governs every property it does not declare itself; the
  // merged schema applies it only beyond the merged properties, so refuse where those differ.
  void check_additional_properties() const {
    std::vector<std::string> names;
    if (acc_.contains("properties") && acc_["properties"].is_object())
      for (const auto& [k, v] : acc_["properties"].items()) names.push_back(k);
    if (acc_.contains("required") && acc_["required"].is_array())
      for (const Json& r : acc_["required"])
        if (r.is_string()) names.push_back(r.get<std::string>());
    for (const Closed& c : closed_)
      for (const std::string& n : names)
        if (!c.declared.count(n))
          throw GrammarError(c.path,
                             fmt::format("this additionalProperties would govern property '{}' of "
                                         "another allOf part: not supported",
                                         n));
  }

  const SchemaResolver& resolve_;
  Json acc_ = Json::object();
  std::vector<Closed> closed_;
  std::vector<std::string> refs_;  // the $refs being merged, outermost first
  size_t keywords_ = 0;
};

}  // namespace

bool is_annotation_keyword(const std::string& k) {
  static const std::set<std::string> annotations{
      "title",           "description",      "examples",     "example",
      "default",         "$schema",          "$id",          "$anchor",
      "$dynamicAnchor",  "$recursiveAnchor", "$comment",     "$vocabulary",
      "deprecated",      "readOnly",         "writeOnly",    "contentMediaType",
      "contentEncoding", "contentSchema",    "discriminator"};
  return annotations.count(k) > 0;
}

Json merge_schemas(const std::vector<SchemaPart>& parts, const SchemaResolver& resolve) {
  return Merger(resolve).run(parts);
}

}  // namespace hyperion::text
