// The JSON Schema -> GBNF converter behind json_schema_gbnf.h, shared by its two source
// files: json_schema_gbnf.cc (dispatch, $ref, anyOf, enum, strings, numbers, the rules
// written) and json_schema_containers.cc (objects and arrays). Internal to them.
//
// visit() returns an atom for the values a schema accepts: a rule name or a literal. A
// schema that needs more than a shared primitive gets a rule named after its path
// (add_rule, which also shares identical bodies); a $ref target gets its rule name before
// it is visited, so recursion refers to it. Cycles: `alias_` holds the $refs followed since
// the last text was read; meeting one again is a loop that reads nothing (left recursion:
// refused). An object's or array's members come after a '{' or '[', so visiting them
// (visit_nested) starts a new alias list.
#pragma once

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "text/grammar/json_schema_gbnf.h"
#include "text/grammar/json_schema_merge.h"

namespace hyperion::text::schema_gbnf {

using Json = nlohmann::ordered_json;

inline std::string join(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

[[noreturn]] inline void fail(const std::string& path, const std::string& message) {
  throw GrammarError(path, message);
}

// Sequence items joined by spaces, empty ones (an absent `ws`) left out.
inline std::string cat(std::initializer_list<std::string> parts) {
  std::string out;
  for (const std::string& p : parts) {
    if (p.empty()) continue;
    if (!out.empty()) out += ' ';
    out += p;
  }
  return out;
}

inline std::string any_of(const std::vector<std::string>& alts) {
  std::string out;
  for (const std::string& a : alts) out += (out.empty() ? "" : " | ") + a;
  return out;
}

// unit{min,max} (max -1: unbounded; "" for none); `unit` must be an atom.
inline std::string repeat(const std::string& unit, int min, int max) {
  if (max == 0) return "";
  if (min == 1 && max == 1) return unit;
  if (max < 0) return unit + (min == 0 ? "*" : min == 1 ? "+" : fmt::format("{{{},}}", min));
  if (min == 0 && max == 1) return unit + "?";
  if (min == max) return unit + fmt::format("{{{}}}", min);
  return unit + fmt::format("{{{},{}}}", min, max);
}

// A name usable in a rule name: [a-zA-Z0-9_-], at most 48 characters of it.
std::string sanitize(const std::string& s);

// A count keyword (minLength, maxItems, ...): a non-negative integer at most `limit`;
// absent: -1.
int count_keyword(const Json& s, const char* key, const std::string& path, int limit);

class Converter {
 public:
  Converter(const Json& root, const JsonSchemaOptions& options);
  std::string run();  // the grammar

 private:
  // Rules.
  std::string use(const std::string& primitive);
  std::string ws();  // the whitespace between tokens: "" when max_whitespace is 0
  std::string unique_name(const std::string& hint);
  void define(const std::string& name, const std::string& body);
  std::string add_rule(const std::string& hint, const std::string& body);

  // Schemas.
  std::string visit(const Json& s, const std::string& path, const std::string& name);
  std::string visit_schema(const Json& s, const std::string& path, const std::string& name);
  std::string visit_nested(const Json& s, const std::string& path, const std::string& name);
  std::vector<std::string> types_of(const Json& s, const std::string& path);
  std::string visit_type(const std::string& t, const Json& s, const std::string& path,
                         const std::string& name);
  Json merge(const std::vector<SchemaPart>& parts);
  std::pair<const Json*, std::string> resolve(const std::string& ref, const std::string& at);
  std::string ref(const Json& r, const std::string& at);
  std::string visit_any_of(const Json& s, const std::string& path, const std::string& name);
  std::string visit_enum(const Json& s, const std::string& path, const std::string& name);
  std::string value_text(const Json& v);
  std::string visit_string(const Json& s, const std::string& path, const std::string& name);
  std::string visit_number(const Json& s, const std::string& path, const std::string& name,
                           bool integer);
  // json_schema_containers.cc
  std::string visit_object(const Json& s, const std::string& path, const std::string& name);
  std::string key_except(const std::vector<std::string>& keys, const std::string& name);
  std::string object_in_order(const std::string& name, const std::vector<std::string>& kv,
                              const std::vector<bool>& required, const std::string& extra_kv);
  std::string object_any_order(const std::string& name, const std::vector<std::string>& kv,
                               const std::vector<bool>& required, const std::string& extra_kv);
  std::string visit_array(const Json& s, const std::string& path, const std::string& name);

  const Json& root_;
  JsonSchemaOptions options_;
  std::vector<std::pair<std::string, std::string>> rules_;  // in the order written
  std::map<std::string, std::string> by_body_;
  std::set<std::string> taken_, pending_, used_;
  std::map<std::string, std::string> ref_names_;  // $ref -> its rule
  std::vector<std::string> alias_;
  size_t visits_ = 0;
  int depth_ = 0;
};

}  // namespace hyperion::text::schema_gbnf
