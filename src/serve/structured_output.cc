#include "serve/structured_output.h"

#include <fmt/format.h>

#include "serve/api_fields.h"
#include "text/grammar/json_schema_gbnf.h"
#include "text/grammar/regex_gbnf.h"

namespace hyperion::serve {

using ojson = nlohmann::ordered_json;

namespace {

const char* kFields[] = {"response_format", "guided_json",    "guided_regex", "guided_choice",
                         "guided_grammar",  "grammar",        "json_schema"};

const char* ojson_type(const ojson& v) {
  return v.is_object() ? "an object" : v.is_array() ? "an array" : v.is_string() ? "a string"
         : v.is_boolean() ? "a boolean" : v.is_number() ? "a number" : "null";
}

// Runs `make` (which writes GBNF), turning a GrammarError into a 400 naming `param`.
template <class F>
std::string gbnf_or_400(const std::string& param, F&& make) {
  try {
    return make();
  } catch (const text::GrammarError& e) {
    bad(param, fmt::format("'{}' {}{}", param, e.where.empty() ? "" : "at " + e.where + ": ", e.detail));
  }
}

std::string schema_gbnf(const std::string& param, const ojson& schema) {
  if (!schema.is_object() && !schema.is_boolean())
    bad(param, fmt::format("'{}' must be a JSON schema (an object), got {}", param, ojson_type(schema)));
  return gbnf_or_400(param, [&] { return text::json_schema_to_gbnf(schema); });
}

std::string response_format_gbnf(const ojson& v) {
  if (!v.is_object())
    bad("response_format", fmt::format("'response_format' must be an object, got {}", ojson_type(v)));
  const auto type = v.find("type");
  if (type == v.end() || !type->is_string())
    bad("response_format.type", "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
  const std::string t = type->get<std::string>();
  for (const auto& [k, val] : v.items())
    if (k != "type" && !(k == "json_schema" && t == "json_schema"))
      bad("response_format." + k, fmt::format("unknown field 'response_format.{}' for type \"{}\"", k, t));
  if (t == "text") return "";
  if (t == "json_object") return text::json_object_gbnf();
  if (t != "json_schema")
    bad("response_format.type",
        fmt::format("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got \"{}\"", t));
  const auto js = v.find("json_schema");
  if (js == v.end() || !js->is_object())
    bad("response_format.json_schema",
        "'response_format.json_schema' must be an object {\"name\", \"schema\", \"strict\"}");
  const ojson* schema = nullptr;
  for (const auto& [k, val] : js->items()) {
    const std::string p = "response_format.json_schema." + k;
    if (k == "schema") {
      schema = &val;
    } else if (k == "name" || k == "description") {
      if (!val.is_string()) bad(p, fmt::format("'{}' must be a string", p));
    } else if (k == "strict") {
      if (!val.is_boolean() && !val.is_null()) bad(p, fmt::format("'{}' must be a boolean", p));
    } else {
      bad(p, fmt::format("unknown field '{}'", p));
    }
  }
  // OpenAI: no schema means any JSON object.
  if (schema == nullptr) return text::json_object_gbnf();
  return schema_gbnf("response_format.json_schema.schema", *schema);
}

}  // namespace

void check_structured_output_size(const std::string& field, const nlohmann::json& value) {
  size_t n = 0;
  std::vector<const nlohmann::json*> todo{&value};
  while (!todo.empty()) {
    const nlohmann::json* v = todo.back();
    todo.pop_back();
    if (++n > kMaxStructuredOutputValues)
      bad(field, fmt::format("'{}' holds more than {} JSON values; a schema or grammar that large is not "
                             "accepted",
                             field, kMaxStructuredOutputValues));
    if (v->is_object() && v->size() > kMaxStructuredObjectMembers)
      bad(field, fmt::format("'{}' holds an object of {} members, over the limit of {}", field, v->size(),
                             kMaxStructuredObjectMembers));
    if (v->is_structured())
      for (const auto& item : *v) todo.push_back(&item);
  }
}

bool is_structured_output_field(const std::string& key) {
  for (const char* f : kFields)
    if (key == f) return true;
  return false;
}

StructuredOutput read_structured_output(const ojson& body) {
  StructuredOutput out;
  for (const auto& [key, v] : body.items()) {
    if (!is_structured_output_field(key) || v.is_null()) continue;
    std::string gbnf;
    if (key == "response_format") {
      gbnf = response_format_gbnf(v);
    } else if (key == "guided_json" || key == "json_schema") {
      if (v.is_string()) {
        ojson parsed;
        try {
          parsed = ojson::parse(v.get<std::string>());
        } catch (const nlohmann::json::exception& e) {
          bad(key, fmt::format("'{}' is not valid JSON: {}", key, e.what()));
        }
        gbnf = schema_gbnf(key, parsed);
      } else {
        gbnf = schema_gbnf(key, v);
      }
    } else if (key == "guided_regex") {
      if (!v.is_string()) bad(key, fmt::format("'{}' must be a string, got {}", key, ojson_type(v)));
      const std::string re = v.get<std::string>();
      gbnf = "root ::= " + gbnf_or_400(key, [&] { return text::regex_to_gbnf(re); }) + "\n";
    } else if (key == "guided_choice") {
      if (!v.is_array() || v.empty())
        bad(key, fmt::format("'{}' must be a non-empty array of strings", key));
      gbnf = "root ::= ";
      for (size_t i = 0; i < v.size(); ++i) {
        if (!v[i].is_string())
          bad(fmt::format("{}[{}]", key, i), fmt::format("'{}[{}]' must be a string, got {}", key, i, ojson_type(v[i])));
        gbnf += (i ? " | " : "") + text::gbnf_literal(v[i].get<std::string>());
      }
      gbnf += "\n";
    } else {  // grammar, guided_grammar
      if (!v.is_string()) bad(key, fmt::format("'{}' must be GBNF text (a string), got {}", key, ojson_type(v)));
      gbnf = v.get<std::string>();
      // Parsed now so that a syntax error names this field (the cache parses it again).
      gbnf_or_400(key, [&] {
        text::parse_gbnf(gbnf);
        return std::string();
      });
    }
    if (gbnf.empty()) continue;  // response_format text
    if (!out.field.empty())
      bad(key, fmt::format("'{}' and '{}' both constrain the output; send one", out.field, key));
    out.field = key;
    out.gbnf = std::move(gbnf);
  }
  return out;
}

std::shared_ptr<const text::CompiledGrammar> compile_structured_output(const StructuredOutput& out,
                                                                       text::GrammarCache* cache) {
  if (out.gbnf.empty()) return nullptr;
  if (cache == nullptr)
    bad(out.field, fmt::format("'{}' needs a tokenizer; this server serves token ids only", out.field));
  try {
    return cache->get(out.gbnf);
  } catch (const text::GrammarError& e) {
    bad(out.field, fmt::format("'{}' {}{}", out.field, e.where.empty() ? "" : "at " + e.where + ": ", e.detail));
  }
}

}  // namespace hyperion::serve
