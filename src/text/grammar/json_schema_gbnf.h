// JSON Schema as GBNF (text/grammar/gbnf.h): the grammar of the JSON texts a schema
// accepts, for response_format {"type": "json_schema"} and tool parameters; and the
// grammar of any JSON object, for {"type": "json_object"}.
//
// The text: one JSON value, no whitespace before or after it; inside, whitespace runs
// after `{ [ , :` and before `} ]` are bounded (`ws ::= | " " | "\n" [ \t]{0,N}`, N =
// max_whitespace; 0: none). Unbounded numbers have at most 16 integer, fraction and
// exponent digits (llama.cpp's bounds, so that generation ends). Rule names are
// deterministic: `root`, then rules named after the schema path (`root-age`,
// `root-tags-item`), each $defs entry under its own name, shared primitives last (`ws`,
// `string`, `char`, `number`, `integer`, `boolean`, `null`, `value`, `object`, `array`,
// format rules); identical rules are written once.
//
// Supported (everything else that changes validity is refused: GrammarError naming the
// keyword's path, "properties.age.minimum", "$defs.node.items", "" for the root):
//   type: string, number, integer, boolean, null, object, array, or a list of them; no
//     type: any JSON value, each type held to its own keywords; OpenAPI's nullable: true
//     adds null. Schema `true` (or {}) is any value.
//   enum, const: their values as nlohmann writes them (scalars as dumped, object members
//     in the schema's order) with the usual whitespace between tokens, kept where `type`
//     allows them; no other keyword beside them.
//   anyOf, oneOf (as anyOf: exclusivity is not enforced), sibling keywords merged into
//     each alternative; allOf where its parts merge (json_schema_merge.h).
//   $ref to "#", "#/$defs/NAME", "#/definitions/NAME" (JSON pointer escapes ~0 ~1 and
//     %XX): each target one rule, so recursion works; beside other keywords, merged with
//     them as allOf. A $ref loop that reads nothing (`{"$ref": "#"}`) is refused naming
//     its path; a recursion with no way out (an object requiring itself) is refused by
//     parse_gbnf.
//   objects: properties, required, additionalProperties (absent or true: extra members of
//     any value after the declared ones; false: none; a schema: extra members of that
//     schema). An extra member's name is any string but a declared one (compared as
//     spelled: "\u0061" is not caught for "a", and declared names that need escapes are
//     not excluded), so it cannot give a declared property another value. Properties come
//     in the schema's order (parse the request with nlohmann::ordered_json to keep it):
//     required ones always, optional ones present or not in their place (llama.cpp's
//     way). Without strict_property_order, objects of at most 8 properties take them in
//     any order (a rule per set of properties seen); larger ones keep schema order.
//     minProperties / maxProperties only where the other keywords imply them.
//   arrays: items, prefixItems (and draft 4's items: [...] with additionalItems),
//     minItems, maxItems, uniqueItems: false; counts as bounded repetitions.
//   strings: minLength, maxLength (characters: one unescaped character or one escape, so
//     a surrogate pair written as two \u escapes counts 2), pattern (regex_gbnf.h,
//     ECMA-262 search semantics), format date, time, date-time (RFC 3339; date checks
//     month 01-12 and day 01-31 only), uuid, email (a dot-atom address, a dotted
//     domain), ipv4. A JSON string's content is any character but `"`, `\` and
//     U+0000-U+001F, or the escapes \" \\ \/ \b \f \n \r \t \uXXXX.
//   numbers: minimum, maximum, exclusiveMinimum, exclusiveMaximum (and draft 4's boolean
//     forms), exact (json_schema_numbers.h), bounded numbers written without exponent.
//     Bounds are read as nlohmann parsed them: an integer beyond 64 bits is a double.
//   Ignored, as JSON Schema ignores them for validity: title, description, examples,
//     example, default, $schema, $id, $anchor, $comment, deprecated, readOnly, writeOnly,
//     contentMediaType, contentEncoding, contentSchema, discriminator, keywords JSON
//     Schema does not define, and a type's keywords where that type is not allowed.
// Refused: `false` (nothing can be generated), not, if/then/else, multipleOf,
//   patternProperties, propertyNames, dependentRequired, dependentSchemas, dependencies,
//   unevaluatedProperties / unevaluatedItems other than true, contains, minContains,
//   maxContains, uniqueItems: true, $dynamicRef, $recursiveRef, other $ref targets,
//   unknown formats, pattern or format together with length bounds, counts over
//   GrammarLimits::kMaxRepeat, bounds of more than 32 digits, constraints no value meets
//   (minimum above maximum, an enum emptied by type), and schemas of more than
//   GrammarLimits::kMaxSchemaNodes objects (or 8 times as many JSON values) or nesting
//   deeper than GrammarLimits::kMaxNesting.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "text/grammar/grammar_error.h"

namespace hyperion::text {

struct JsonSchemaOptions {
  int max_whitespace = 20;            // bound on whitespace runs: "\n" then up to this many [ \t]
  bool strict_property_order = true;  // properties in the schema's order (llama.cpp does this)
};

// A GBNF grammar (with `root`) for JSON texts valid against `schema`. Throws GrammarError.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema,
                                const JsonSchemaOptions& = {});
// The same for a schema parsed without order: properties come in key order.
std::string json_schema_to_gbnf(const nlohmann::json& schema, const JsonSchemaOptions& = {});

// The grammar for any JSON object (OpenAI's response_format {"type": "json_object"}):
// root is an object, its values any JSON.
std::string json_object_gbnf(const JsonSchemaOptions& = {});

}  // namespace hyperion::text
