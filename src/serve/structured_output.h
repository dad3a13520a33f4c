// The structured-output fields of an OpenAI-style request, turned into one grammar.
//
//   response_format  {"type": "text"} (no constraint) | {"type": "json_object"} |
//                    {"type": "json_schema", "json_schema": {"name", "schema", "strict",
//                    "description"}}  (OpenAI; both endpoints)
//   guided_json      a JSON schema, as an object or a string (vLLM)
//   guided_regex     a regular expression the whole output matches (vLLM)
//   guided_choice    an array of strings, one of which is the whole output (vLLM)
//   guided_grammar, grammar   GBNF text (vLLM, llama.cpp; text/grammar/gbnf.h)
//   json_schema      a JSON schema (llama.cpp)
// At most one of them per request. A schema, regex or grammar that cannot be compiled is
// a 400 naming the field and the place in it ("response_format.json_schema.schema:
// properties.age.minimum: ..."); compiled grammars are cached by their text
// (text/grammar/grammar_cache.h), so a schema many requests send compiles once.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "text/grammar/grammar_cache.h"

namespace hyperion::serve {

// Whether `key` is one of the fields above.
bool is_structured_output_field(const std::string& key);

struct StructuredOutput {
  std::string field;  // the request field it came from ("" when none)
  std::string gbnf;   // the grammar ("" when none)
};

// Refuses (400 naming `field`) a structured-output value of more than
// kMaxStructuredOutputValues JSON values or an object of more than
// kMaxStructuredObjectMembers members, before any work proportional to its square.
inline constexpr size_t kMaxStructuredOutputValues = 100000;
// (nlohmann's ordered objects insert in time linear in their size)
inline constexpr size_t kMaxStructuredObjectMembers = 10000;
void check_structured_output_size(const std::string& field, const nlohmann::json& value);

// The grammar the body's structured-output fields ask for (from `body`, parsed keeping
// key order, so that properties keep the schema's order). Throws ApiException (400).
StructuredOutput read_structured_output(const nlohmann::ordered_json& body);

// The compiled grammar; a GrammarError becomes a 400 naming `out.field`. `cache` null: the
// server has no tokenizer, and structured output is refused.
std::shared_ptr<const text::CompiledGrammar> compile_structured_output(const StructuredOutput& out,
                                                                       text::GrammarCache* cache);

}  // namespace hyperion::serve
