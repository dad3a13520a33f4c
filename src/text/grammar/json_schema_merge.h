// allOf for the JSON Schema front end (json_schema_gbnf.h): schemas that must all hold,
// merged into one schema where that is simple and exact; anything else is refused.
//
//   type: intersected (integer within number); properties: united, a property in two
//   parts gets {"allOf": [both]}; required: united; minimum, exclusiveMinimum, minLength,
//   minItems, minProperties: the largest; their max counterparts: the smallest; enum:
//   intersected; items, additionalItems, additionalProperties: {"allOf": [both]} (false
//   wins); prefixItems of one length: position by position; nullable: both; equal values
//   of any keyword: kept once. A $ref part is replaced by its target, a nested allOf is
//   flattened. Refused (GrammarError naming the keyword): other keywords whose values
//   differ (pattern, format, const, anyOf in two parts, ...), types or enums with nothing
//   in common, a `false` part, and a part's additionalProperties (other than true) where
//   another part declares or requires a property that part does not declare (that would
//   be additionalProperties applying across parts, which this merge does not model).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "text/grammar/grammar_error.h"

namespace hyperion::text {

struct SchemaPart {
  const nlohmann::ordered_json* schema;
  std::string path;  // where it is, for errors: "allOf.1"
};

// The schema $ref `ref` names (found at `path`); throws GrammarError for one it cannot follow.
using SchemaResolver =
    std::function<const nlohmann::ordered_json&(const std::string& ref, const std::string& path)>;

// One schema equivalent to all of `parts`; without allOf or $ref at its top level.
nlohmann::ordered_json merge_schemas(const std::vector<SchemaPart>& parts,
                                     const SchemaResolver& resolve);

// Keywords that only annotate (title, description, ...): never change validity.
bool is_annotation_keyword(const std::string& keyword);

}  // namespace hyperion::text
