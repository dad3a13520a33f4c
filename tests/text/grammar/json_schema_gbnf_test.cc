// JSON Schema as GBNF: the grammar text (deterministic names, shared rules), every
// refusal with the path of the keyword at fault, the limits, and the language of the
// grammar read by text/grammar/gbnf.h: values that must and must not match for each
// supported keyword, integer bounds exhaustively and decimal bounds on random decimals
// against a plain comparison, objects over every subset (and order) of their properties.
#include "text/grammar/json_schema_gbnf.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "text/grammar/gbnf.h"

namespace hyperion::text {
namespace {

using Json = nlohmann::ordered_json;

Grammar compile(const std::string& schema, const JsonSchemaOptions& options = {}) {
  return parse_gbnf(json_schema_to_gbnf(Json::parse(schema), options));
}

// "where: message" of the refusal, or "" when the schema converts.
std::string refusal(const std::string& schema) {
  try {
    json_schema_to_gbnf(Json::parse(schema));
  } catch (const GrammarError& e) {
    return e.where + ": " + e.detail;
  }
  return "";
}

void expect_language(const std::string& schema, const std::vector<std::string>& yes,
                     const std::vector<std::string>& no, const JsonSchemaOptions& options = {}) {
  const Grammar g = compile(schema, options);
  for (const std::string& t : yes)
    EXPECT_TRUE(grammar_accepts(g, t)) << schema << "\nshould accept " << t;
  for (const std::string& t : no)
    EXPECT_FALSE(grammar_accepts(g, t)) << schema << "\nshould reject " << t;
}

TEST(JsonSchemaGbnf, WritesADeterministicReadableGrammar) {
  const std::string schema = R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 5},
      "age": {"type": "integer", "minimum": 0, "maximum": 150},
      "first name": {"type": "string", "maxLength": 5},
      "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name"], "additionalProperties": false})";
  const std::string expected =
      "root ::= \"{\" ws \"\\\"name\\\"\" ws \":\" ws root-name ws (\",\" ws \"\\\"age\\\"\" ws "
      "\":\" ws root-age "
      "ws)? (\",\" ws \"\\\"first name\\\"\" ws \":\" ws root-name ws)? (\",\" ws \"\\\"tags\\\"\" "
      "ws \":\" ws "
      "root-tags ws)? \"}\"\n"
      "root-name ::= \"\\\"\" char{0,5} \"\\\"\"\n"
      "root-age ::= \"0\" | [1-9] [0-9]? | \"1\" ([0-4] [0-9] | \"50\")\n"
      "root-tags ::= \"[\" ws (string ws (\",\" ws string ws)*)? \"]\"\n"
      "string ::= \"\\\"\" char* \"\\\"\"\n"
      "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
      "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";
  EXPECT_EQ(json_schema_to_gbnf(Json::parse(schema)), expected);
  EXPECT_EQ(json_schema_to_gbnf(Json::parse(schema)), json_schema_to_gbnf(Json::parse(schema)));
  // $defs keep their names; one that would take a primitive's name gets a suffix.
  const std::string defs =
      json_schema_to_gbnf(Json::parse(R"({"$defs": {"string": {"type": "integer",
      "minimum": 1}, "a b": {"enum": ["x", "y"]}}, "type": "array",
      "prefixItems": [{"$ref": "#/$defs/string"}, {"$ref": "#/$defs/a%20b"}], "items": false})"));
  EXPECT_NE(defs.find("\nstring-1 ::= [1-9] [0-9]{0,15}\n"), std::string::npos) << defs;
  EXPECT_NE(defs.find("\na-b ::= \"\\\"x\\\"\" | \"\\\"y\\\"\"\n"), std::string::npos) << defs;
  EXPECT_EQ(defs.rfind("root ::= \"[\" ws (string-1 ws (\",\" ws a-b ws)?)? \"]\"\n", 0), 0u)
      << defs;
}

TEST(JsonSchemaGbnf, JsonObjectGrammarAcceptsAnyObject) {
  const std::string text = json_object_gbnf();
  EXPECT_EQ(text.rfind("root ::= object\n", 0), 0u) << text;
  const Grammar g = parse_gbnf(text);
  for (const char* yes :
       {"{}", "{ }", R"({"a": [1, {"b": null}], "c": "x\"y\u00e9", "d": -1.5e+3})",
        "{\n  \"a\" : true,\n  \"b\": [ ]\n}", R"({"a":{"a":{"a":{}}}})"})
    EXPECT_TRUE(grammar_accepts(g, yes)) << yes;
  for (const char* no : {"[]", "\"x\"", "1", "{\"a\":}", "{\"a\":1,}", " {}", "{} ", "{'a':1}",
                         "{\"a\":01}", "{\"a\":\"\x01\"}", "{\"a\":  1}", "{\"a\":\"\\q\"}"})
    EXPECT_FALSE(grammar_accepts(g, no)) << no;
}

TEST(JsonSchemaGbnf, WhitespaceIsBounded) {
  const std::string schema = R"({"type": "array", "items": {"type": "integer"}})";
  expect_language(schema, {"[1,2]", "[ 1, 2 ]", "[\n" + std::string(20, ' ') + "1]", "[\n\t1\n]"},
                  {"[  1]", "[\n" + std::string(21, ' ') + "1]", "[\n\n1]", "[\r1]"});
  JsonSchemaOptions none;
  none.max_whitespace = 0;
  expect_language(schema, {"[1,2]", "[]"}, {"[ 1]", "[1, 2]", "[\n1]"}, none);
  EXPECT_EQ(json_schema_to_gbnf(Json::parse(schema), none).find("ws"), std::string::npos);
  JsonSchemaOptions bad;
  bad.max_whitespace = -1;
  EXPECT_THROW(json_schema_to_gbnf(Json::parse(schema), bad), GrammarError);
}

TEST(JsonSchemaGbnf, RefusesWhatItDoesNotSupportNamingTheKeyword) {
  struct Case {
    const char* schema;
    const char* where;
    const char* message;
  };
  const Case cases[] = {
      {R"({"not": {"type": "string"}})", "not", "not supported"},
      {R"({"type": "object", "properties": {"a": {"if": {}, "then": {}}}})", "properties.a.if",
       "not supported"},
      {R"({"else": {}})", "else", "not supported"},
      {R"({"$dynamicRef": "#x"})", "$dynamicRef", "not supported"},
      {R"({"type": "object", "properties": {"n": {"type": "number", "multipleOf": 2}}})",
       "properties.n.multipleOf", "not supported"},
      {R"({"type": "object", "patternProperties": {"^a": {}}})", "patternProperties",
       "not supported"},
      {R"({"type": "object", "propertyNames": {"maxLength": 3}})", "propertyNames",
       "not supported"},
      {R"({"type": "object", "dependentRequired": {"a": ["b"]}})", "dependentRequired",
       "not supported"},
      {R"({"type": "object", "dependentSchemas": {"a": {}}})", "dependentSchemas", "not supported"},
      {R"({"type": "object", "dependencies": {"a": ["b"]}})", "dependencies", "not supported"},
      {R"({"type": "object", "unevaluatedProperties": false})", "unevaluatedProperties",
       "not supported"},
      {R"({"type": "array", "unevaluatedItems": false})", "unevaluatedItems", "not supported"},
      {R"({"type": "array", "contains": {"type": "integer"}})", "contains", "not supported"},
      {R"({"type": "array", "minContains": 2})", "minContains", "not supported"},
      {R"({"type": "array", "uniqueItems": true})", "uniqueItems", "not supported"},
      {R"({"type": "string", "format": "hostname"})", "format", "unsupported format"},
      {R"({"type": "string", "format": "date", "maxLength": 20})", "format", "not supported"},
      {R"({"type": "string", "pattern": "a+", "maxLength": 3})", "pattern", "not supported"},
      {R"j({"type": "object", "properties": {"code": {"type": "string", "pattern": "a(?=b)"}}})j",
       "properties.code.pattern", "offset 1: lookaround"},
      {R"({"type": "object", "required": ["a", "b"], "minProperties": 3})", "minProperties",
       "not supported"},
      {R"({"type": "object", "maxProperties": 3})", "maxProperties", "only supported"},
      {R"({"$ref": "http://example.com/s.json"})", "$ref", "not supported"},
      {R"({"$ref": "#/properties/a"})", "$ref", "not supported"},
      {R"({"$ref": "#/$defs/a/properties/b", "$defs": {"a": {}}})", "$ref", "not supported"},
      {R"({"type": "array", "items": {"$ref": "#/$defs/missing"}})", "items.$ref",
       "no such definition"},
      {R"(false)", "", "matches nothing"},
      {R"({"type": "object", "properties": {"a": false}, "required": ["a"]})", "properties.a",
       "matches nothing"},
      {R"({"type": "strin"})", "type", "unknown type"},
      {R"({"type": []})", "type", "matches nothing"},
      {R"({"type": "integer", "minimum": 5, "maximum": 3})", "maximum", "no integer satisfies"},
      {R"({"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 4})", "exclusiveMaximum",
       "no integer satisfies"},
      {R"({"type": "number", "minimum": 1.5, "exclusiveMaximum": 1.5})", "exclusiveMaximum",
       "no number satisfies"},
      {R"({"type": "number", "minimum": 1e-40})", "minimum", "more than 32 digits"},
      {R"({"type": "number", "minimum": "5"})", "minimum", "must be a number"},
      {R"({"type": "string", "enum": [1, 2]})", "enum", "no value satisfies"},
      {R"({"enum": ["a"], "minLength": 3})", "minLength", "together with enum"},
      {R"({"allOf": [{"type": "string"}, {"type": "integer"}]})", "allOf.1.type",
       "nothing in common"},
      {R"({"allOf": [{"pattern": "a"}, {"pattern": "b"}]})", "allOf.1.pattern", "cannot be merged"},
      {R"({"allOf": [{"type": "object", "properties": {"a": {}}, "additionalProperties": false},
                     {"properties": {"b": {}}}]})",
       "allOf.0.additionalProperties", "property 'b'"},
      {R"({"anyOf": [{}], "oneOf": [{}]})", "oneOf", "not supported"},
      {R"({"anyOf": [false, false]})", "anyOf", "every alternative is false"},
      {R"({"type": "object", "required": ["x"], "additionalProperties": false})", "required",
       "'x'"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "maxItems", "below minItems"},
      {R"({"type": "array", "prefixItems": [{}, {}], "items": false, "minItems": 3})", "minItems",
       "tuple"},
      {R"({"type": "string", "maxLength": 10001})", "maxLength", "over the supported limit"},
      {R"({"type": "string", "minLength": -1})", "minLength", "non-negative integer"},
      {R"({"type": "string", "maxLength": 2.5})", "maxLength", "non-negative integer"},
      {R"({"type": "string", "minLength": 3, "maxLength": 2})", "maxLength", "below minLength"},
      {R"({"$ref": "#"})", "$ref", "never end"},
      {R"({"anyOf": [{"$ref": "#"}, {"type": "null"}]})", "anyOf.0.$ref", "never end"},
      {R"({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"},
          "b": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/a"}]}}})",
       "$defs.b.anyOf.1.$ref", "never end"},
      {R"({"$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}, {"type": "object"}]}}, "$ref": "#/$defs/a"})",
       "$defs.a.allOf.0.$ref.allOf.0.$ref", "loops back"},
  };
  for (const Case& c : cases) {
    const std::string got = refusal(c.schema);
    EXPECT_EQ(got.rfind(std::string(c.where) + ": ", 0), 0u) << c.schema << "\n-> " << got;
    EXPECT_NE(got.find(c.message), std::string::npos) << c.schema << "\n-> " << got;
  }
}

TEST(JsonSchemaGbnf, LimitsFailFastWithAPath) {
  // 10^5 properties: refused before any work, through either overload.
  std::string big = R"({"type": "object", "properties": {)";
  for (int i = 0; i < 100000; ++i)
    big.append(i ? "," : "").append(fmt::format(R"("p{}": {{"type": "integer"}})", i));
  big += "}}";
  EXPECT_THROW(json_schema_to_gbnf(nlohmann::json::parse(big)), GrammarError);
  std::string bools = R"({"type": "object", "properties": {)";
  for (int i = 0; i < 100000; ++i) bools.append(i ? "," : "").append(fmt::format(R"("p{}": true)", i));
  bools += "}}";
  try {
    json_schema_to_gbnf(nlohmann::json::parse(bools));
    ADD_FAILURE() << "10^5 properties accepted";
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("JSON values"), std::string::npos) << e.what();
  }
  // Nesting: the path of the object too deep.
  std::string deep = "{}";
  for (int i = 0; i < 300; ++i) deep = R"({"type": "object", "properties": {"a": )" + deep + "}}";
  try {
    json_schema_to_gbnf(Json::parse(deep));
    ADD_FAILURE() << "300 levels accepted";
  } catch (const GrammarError& e) {
    EXPECT_EQ(e.where.rfind("properties.a.properties.a.", 0), 0u) << e.where;
    EXPECT_NE(e.detail.find("nests deeper than 256"), std::string::npos) << e.detail;
  }
  // 100 levels are fine.
  std::string fine = R"({"type": "integer"})";
  for (int i = 0; i < 100; ++i) fine = R"({"type": "array", "items": )" + fine + "}";
  EXPECT_NO_THROW(compile(fine));
}

// -- Numbers ------------------------------------------------------------------------------

// A decimal text as an integer count of millionths (the texts and bounds tested have at
// most 6 fraction digits).
int64_t micros(const std::string& text) {
  const bool neg = text[0] == '-';
  const std::string t = neg ? text.substr(1) : text;
  const size_t dot = t.find('.');
  const std::string ip = t.substr(0, dot);
  std::string fp = dot == std::string::npos ? "" : t.substr(dot + 1);
  fp.resize(6, '0');
  const int64_t v = std::stoll(ip) * 1000000 + std::stoll(fp);
  return neg ? -v : v;
}

TEST(JsonSchemaGbnf, IntegerBoundsAreExact) {
  struct Case {
    const char* bounds;
    int64_t lo, hi;  // inclusive
  };
  const Case cases[] = {
      {R"("minimum": -15, "maximum": 230)", -15, 230},
      {R"("exclusiveMinimum": -15, "exclusiveMaximum": 230)", -14, 229},
      {R"("minimum": 0)", 0, INT64_MAX},
      {R"("maximum": -7)", INT64_MIN, -7},
      {R"("exclusiveMaximum": 0)", INT64_MIN, -1},
      {R"("minimum": 7, "maximum": 7)", 7, 7},
      {R"("minimum": -1, "maximum": 0)", -1, 0},
      {R"("minimum": -2.5, "maximum": 10.5)", -2, 10},
      {R"("exclusiveMinimum": -2.5, "exclusiveMaximum": 10.5)", -2, 10},
      {R"("minimum": 99, "maximum": 1000)", 99, 1000},
      {R"("minimum": -999, "maximum": -100)", -999, -100},
      {R"("minimum": 3, "exclusiveMinimum": 3, "maximum": 9, "exclusiveMaximum": 10)", 4, 9},
  };
  for (const Case& c : cases) {
    const std::string schema = std::string(R"({"type": "integer", )") + c.bounds + "}";
    const Grammar g = compile(schema);
    for (int64_t v = -1000; v <= 1000; ++v)
      ASSERT_EQ(grammar_accepts(g, std::to_string(v)), v >= c.lo && v <= c.hi)
          << schema << " on " << v;
    for (const char* no : {"-0", "007", "+5", "5.0", " 5", "1e1", ""})
      EXPECT_FALSE(grammar_accepts(g, no)) << schema << no;
  }
  // Large bounds, checked at their edges and on random values.
  const Grammar g =
      compile(R"({"type": "integer", "minimum": -123456789012, "maximum": 987654321098})");
  std::mt19937_64 rng(4);
  std::vector<int64_t> values = {-123456789013,
                                 -123456789012,
                                 -123456789011,
                                 987654321097,
                                 987654321098,
                                 987654321099,
                                 0,
                                 -1,
                                 1,
                                 999999999999,
                                 -999999999999};
  for (int i = 0; i < 3000; ++i) {
    const int digits = static_cast<int>(rng() % 13) + 1;
    int64_t v = static_cast<int64_t>(rng() % static_cast<uint64_t>(std::pow(10.0, digits)));
    values.push_back(rng() % 2 ? -v : v);
  }
  for (const int64_t v : values)
    ASSERT_EQ(grammar_accepts(g, std::to_string(v)), v >= -123456789012 && v <= 987654321098) << v;
  // An open side: up to 16 digits (so that generation ends), or the bound's own count.
  expect_language(R"({"type": "integer", "minimum": 5})", {"9999999999999999"},
                  {"10000000000000000", "4"});
  expect_language(R"({"type": "integer", "minimum": 100000000000000000000})",
                  {"100000000000000000000", "999999999999999999999"}, {"99999999999999999999"});
  // Unbounded: JSON's integers (negative zero included) of at most 16 digits.
  expect_language(R"({"type": "integer"})", {"0", "-0", "-9999999999999999"},
                  {"01", "10000000000000000", "1.0"});
}

TEST(JsonSchemaGbnf, NumberBoundsAreExact) {
  struct Case {
    const char* bounds;
    const char *lo, *hi;  // null: open
    bool lo_exclusive, hi_exclusive;
  };
  const Case cases[] = {
      {R"("minimum": 0.5)", "0.5", nullptr, false, false},
      {R"("minimum": -2.5, "maximum": 3.75)", "-2.5", "3.75", false, false},
      {R"("exclusiveMinimum": 0, "exclusiveMaximum": 1)", "0", "1", true, true},
      {R"("minimum": -0.001, "exclusiveMaximum": 0.001)", "-0.001", "0.001", false, true},
      {R"("exclusiveMinimum": -10, "maximum": -9.99)", "-10", "-9.99", true, false},
      {R"("minimum": 100.25, "maximum": 100.5)", "100.25", "100.5", false, false},
      {R"("maximum": 0)", nullptr, "0", false, false},
      {R"("exclusiveMaximum": 0)", nullptr, "0", false, true},
      {R"("exclusiveMinimum": 12, "maximum": 1234.5678)", "12", "1234.5678", true, false},
      {R"("minimum": 7.25, "maximum": 7.25)", "7.25", "7.25", false, false},
      {R"("exclusiveMinimum": 0.0105, "exclusiveMaximum": 0.0107)", "0.0105", "0.0107", true, true},
      {R"("minimum": -5, "maximum": -5)", "-5", "-5", false, false},
  };
  // Random decimals around the bounds: up to 5 integer and 6 fraction digits, trailing
  // zeros included, and each bound itself with -1, 0, +1 millionth and trailing zeros.
  std::mt19937 rng(5);
  std::vector<std::string> texts;
  for (int i = 0; i < 6000; ++i) {
    std::string t = rng() % 2 ? "-" : "";
    const int int_digits = static_cast<int>(rng() % 5);
    t += int_digits == 0 ? "0"
                         : std::to_string(rng() % static_cast<uint32_t>(std::pow(10, int_digits)));
    const int frac_digits = static_cast<int>(rng() % 7);
    if (frac_digits > 0) {
      t += '.';
      for (int k = 0; k < frac_digits; ++k) t += static_cast<char>('0' + rng() % 10);
    }
    if (micros(t) != 0 || t[0] != '-') texts.push_back(t);  // -0 is never generated: checked below
  }
  for (const Case& c : cases) {
    for (const char* b : {c.lo, c.hi}) {
      if (!b) continue;
      for (const int64_t d : {-1, 0, 1}) {
        const int64_t v = micros(b) + d;
        const std::string abs =
            fmt::format("{}.{:06d}", std::llabs(v) / 1000000, std::llabs(v) % 1000000);
        texts.push_back((v < 0 ? "-" : "") + abs);
      }
      texts.push_back(std::string(b) +
                      (std::string(b).find('.') == std::string::npos ? ".000" : "00"));
      texts.push_back(b);
    }
  }
  for (const Case& c : cases) {
    const std::string schema = std::string(R"({"type": "number", )") + c.bounds + "}";
    const Grammar g = compile(schema);
    for (const std::string& t : texts) {
      const int64_t v = micros(t);
      bool in = true;
      if (c.lo) in = in && (c.lo_exclusive ? v > micros(c.lo) : v >= micros(c.lo));
      if (c.hi) in = in && (c.hi_exclusive ? v < micros(c.hi) : v <= micros(c.hi));
      if (v == 0 && t[0] == '-') in = false;  // negative zero is not generated
      ASSERT_EQ(grammar_accepts(g, t), in) << schema << " on " << t;
    }
    for (const char* no : {"-0", "-0.0", "1.", ".5", "01.5", "1e2", "+1", "0.5 "})
      EXPECT_FALSE(grammar_accepts(g, no)) << schema << " on " << no;
  }
  // Unbounded numbers: JSON's syntax with bounded digit counts.
  expect_language(R"({"type": "number"})",
                  {"0", "-1.5", "1e10", "2.5E-3", "1234567890123456.1234567890123456"},
                  {"1.", ".5", "01", "--1", "1e", "12345678901234567"});
}

// -- Strings ------------------------------------------------------------------------------

TEST(JsonSchemaGbnf, StringLengthsCountCharacters) {
  expect_language(
      R"({"type": "string", "minLength": 2, "maxLength": 3})",
      {R"("ab")", R"("abc")", R"("a\nb")", R"("\u00e9x")", "\"\u00e9\u00e9\"", R"("\"\\")"},
      {R"("a")", R"("abcd")", "\"\u00e9\"", R"("\u00e9")", R"(ab)", R"("a\qb")"});
  expect_language(R"({"type": "string"})", {R"("")", R"("x\/y\b\f\r\t\u12aB")", "\"\x7f\""},
                  {"\"\x1f\"", "\"a\"b\"", R"("\u12g4")", R"(")"});
}

TEST(JsonSchemaGbnf, FormatsMatchTheirSyntax) {
  expect_language(R"({"type": "string", "format": "date"})",
                  {R"("2024-02-29")", R"("2024-02-30")", R"("0001-12-31")", R"("1999-10-01")"},
                  {R"("2024-13-01")", R"("2024-00-10")", R"("2024-1-01")", R"("2024-12-32")",
                   R"("2024-12-00")", R"("24-12-01")", "2024-12-01"});
  expect_language(R"({"type": "string", "format": "time"})",
                  {R"("23:59:60Z")", R"("00:00:00+05:30")", R"("12:34:56.789Z")", R"("12:34:56z")",
                   R"("12:34:56-23:59")"},
                  {R"("24:00:00Z")", R"("12:34:56")", R"("12:60:00Z")", R"("12:34:61Z")",
                   R"("12:34:56+24:00")", R"("12:34:56.Z")"});
  expect_language(R"({"type": "string", "format": "date-time"})",
                  {R"("2024-02-29T12:00:00Z")", R"("2024-02-29t12:00:00.5-01:00")"},
                  {R"("2024-02-29 12:00:00Z")", R"("2024-02-29T12:00Z")", R"("2024-02-29")"});
  expect_language(
      R"({"type": "string", "format": "uuid"})",
      {R"("123e4567-e89b-12d3-a456-426614174000")", R"("123E4567-E89B-12D3-A456-426614174000")"},
      {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400")",
       R"("g23e4567-e89b-12d3-a456-426614174000")"});
  expect_language(R"({"type": "string", "format": "email"})",
                  {R"("a.b+c@example.co.uk")", R"("x_y@a-b.io")", R"("o'neil@x.org")"},
                  {R"("x@y")", R"("a..b@x.com")", R"(".a@x.com")", R"("a@-x.com")", R"("a@x-.com")",
                   R"("@x.com")", R"("a b@x.com")", R"("a@x..com")"});
  expect_language(
      R"({"type": "string", "format": "ipv4"})",
      {R"("0.0.0.0")", R"("255.255.255.255")", R"("192.168.1.10")"},
      {R"("256.1.1.1")", R"("01.2.3.4")", R"("1.2.3")", R"("1.2.3.4.5")", R"("1.2.3.-4")"});
}

TEST(JsonSchemaGbnf, PatternsSearchInsideTheString) {
  expect_language(R"({"type": "string", "pattern": "^[A-Z]{3}-\\d+$"})",
                  {R"("ABC-12")", R"("XYZ-0")"},
                  {R"("abc-12")", R"("ABC-")", R"("xABC-12")", R"(ABC-12)"});
  expect_language(R"({"type": "string", "pattern": "a\"b"})", {R"("a\"b")", R"("xx a\"b yy")"},
                  {R"("a"b")", R"("ab")", R"("a\\b")"});
  expect_language(R"({"type": "string", "pattern": "^\\S+$"})", {R"("x")", R"("\\\"")"},
                  {R"("")", R"("a b")", R"("a\tb")", R"("a\nb")"});
}

// -- Objects and arrays -------------------------------------------------------------------

// The object with the properties of `mask` (bit i: name i), in the order of `order`.
std::string object_text(const std::vector<std::string>& names, const std::vector<int>& order,
                        unsigned mask) {
  std::string out = "{";
  for (const int i : order) {
    if (!(mask & (1u << i))) continue;
    out +=
        fmt::format("{}\"{}\": {}", out.size() > 1 ? ", " : "", names[static_cast<size_t>(i)], i);
  }
  return out + "}";
}

TEST(JsonSchemaGbnf, ObjectsTakeEveryAllowedSetOfProperties) {
  const std::vector<std::string> names = {"a", "b", "c", "d"};
  const std::string schema =
      R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
      "c": {"type": "integer"}, "d": {"type": "integer"}}, "required": ["d", "b"], "additionalProperties": false})";
  const unsigned required = 0b1010;
  const Grammar in_order = compile(schema);
  JsonSchemaOptions any_order;
  any_order.strict_property_order = false;
  const Grammar unordered = compile(schema, any_order);
  std::vector<int> order = {0, 1, 2, 3};
  do {
    const bool schema_order = std::is_sorted(order.begin(), order.end());
    for (unsigned mask = 0; mask < 16; ++mask) {
      const std::string text = object_text(names, order, mask);
      const bool valid = (mask & required) == required;
      // Within one mask the orders differ only when 2+ properties are present.
      const bool same_text_as_sorted = text == object_text(names, {0, 1, 2, 3}, mask);
      ASSERT_EQ(grammar_accepts(in_order, text), valid && (schema_order || same_text_as_sorted))
          << text;
      ASSERT_EQ(grammar_accepts(unordered, text), valid) << text;
    }
  } while (std::next_permutation(order.begin(), order.end()));
  expect_language(
      schema, {"{ \"b\" : 1 , \"d\" : 2 }", "{\n  \"b\": 1,\n  \"d\": 2\n}"},
      {R"({"b": 1, "d": 2, "e": 3})", R"({"b": 1, "b": 1, "d": 2})", R"({"b": 1, "d": "x"})"});
  // Nine optional properties and a required one last: the tails become a chain of rules.
  std::string many =
      R"({"type": "object", "additionalProperties": false, "required": ["p9"], "properties": {)";
  std::vector<std::string> pnames;
  for (int i = 0; i < 10; ++i) {
    pnames.push_back(fmt::format("p{}", i));
    many += fmt::format(R"({}"p{}": {{"type": "integer"}})", i ? ", " : "", i);
  }
  many += "}}";
  const Grammar chain = compile(many);
  std::vector<int> sorted(10);
  for (int i = 0; i < 10; ++i) sorted[static_cast<size_t>(i)] = i;
  for (unsigned mask = 0; mask < 1024; ++mask)
    ASSERT_EQ(grammar_accepts(chain, object_text(pnames, sorted, mask)), (mask & 512u) != 0)
        << mask;
}

TEST(JsonSchemaGbnf, AdditionalProperties) {
  const std::string props =
      R"("type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}})";
  // Absent or true: any extra members after the declared ones.
  for (const char* ap : {"", R"(, "additionalProperties": true)"}) {
    expect_language("{" + props + ap + "}",
                    {"{}", R"({"a": 1})", R"({"a": 1, "zz": [1]})", R"({"zz": null, "yy": {}})",
                     R"({"b": "x", "c": 2})"},
                    {R"({"a": "x"})", R"({"zz": 1, "a": 1})", R"({"a": 1,})"});
  }
  expect_language(
      "{" + props + R"(, "additionalProperties": {"type": "integer"}, "required": ["x"]})",
      {R"({"x": 1})", R"({"a": 1, "x": 2, "y": 3})"},
      {R"({"a": 1})", R"({"x": "s"})", R"({"x": 1, "y": "s"})"});
  // An extra member may not take a declared name (so it cannot give one another type).
  expect_language(
      R"({"type": "object", "properties": {"a": {"type": "integer"}, "ab": {"type": "integer"}}})",
      {R"({"a": 1, "abc": "x"})", R"({"": 1})", R"({"b": 1, "a b": 2})", R"({"ab": 1, "a\"": 2})"},
      {R"({"a": 1, "a": 2})", R"({"a": 1, "ab": 2, "ab": 3})", R"({"b": 1, "ab": "x"})"});
  JsonSchemaOptions any_order;
  any_order.strict_property_order = false;
  expect_language("{" + props + R"(, "additionalProperties": {"type": "boolean"}})",
                  {R"({"zz": true, "b": "x", "a": 1})", R"({"a": 1, "q": false, "b": "x"})"},
                  {R"({"a": 1, "a": 2})", R"({"zz": 1})"}, any_order);
  // Schema order comes from the JSON as parsed: ordered_json keeps it, json sorts keys.
  const std::string ba =
      R"({"type": "object", "properties": {"b": {}, "a": {}}, "additionalProperties": false})";
  const Grammar ordered = parse_gbnf(json_schema_to_gbnf(Json::parse(ba)));
  const Grammar sorted = parse_gbnf(json_schema_to_gbnf(nlohmann::json::parse(ba)));
  EXPECT_TRUE(grammar_accepts(ordered, R"({"b": 1, "a": 2})"));
  EXPECT_FALSE(grammar_accepts(ordered, R"({"a": 2, "b": 1})"));
  EXPECT_TRUE(grammar_accepts(sorted, R"({"a": 2, "b": 1})"));
  // minProperties / maxProperties where the other keywords already imply them.
  expect_language(
      R"({"type": "object", "properties": {"a": {}}, "required": ["a"], "minProperties": 1,
                      "maxProperties": 1, "additionalProperties": false})",
      {R"({"a": 1})"}, {"{}"});
}

TEST(JsonSchemaGbnf, ArraysCountTheirItems) {
  const Grammar g =
      compile(R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4})");
  for (int n = 0; n <= 6; ++n) {
    std::string t = "[";
    for (int i = 0; i < n; ++i) t += (i ? ", " : "") + std::to_string(i);
    t += "]";
    EXPECT_EQ(grammar_accepts(g, t), n >= 2 && n <= 4) << t;
  }
  expect_language(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1})",
                  {"[1]", "[1,2,3]"}, {"[]", "[1,]"});
  expect_language(
      R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": false})",
      {"[]", "[1]", R"([1, "a"])"}, {R"([1, "a", 2])", R"(["a"])", R"([1, 2])"});
  expect_language(R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                      "items": {"type": "boolean"}, "minItems": 3})",
                  {R"([1, "a", true])", R"([1, "a", true, false])"},
                  {R"([1, "a"])", R"([1, "a", 2])"});
  expect_language(
      R"({"type": "array", "items": [{"const": 1}, {"const": 2}], "additionalItems": {"const": 3}})",
      {"[]", "[1]", "[1,2]", "[1,2,3,3]"}, {"[2]", "[1,2,4]"});
  expect_language(R"({"type": "array", "maxItems": 0})", {"[]", "[ ]"}, {"[1]"});
  // A long tuple with optional positions: groups every 32 become rules, not deep nesting.
  std::string tuple = R"({"type": "array", "items": false, "prefixItems": [)";
  for (int i = 0; i < 100; ++i) tuple += std::string(i ? ", " : "") + R"({"type": "integer"})";
  tuple += "]}";
  const Grammar t = compile(tuple);
  for (int n : {0, 1, 31, 32, 33, 64, 99, 100, 101}) {
    std::string text = "[";
    for (int i = 0; i < n; ++i) text.append(i ? "," : "").append(std::to_string(i));
    text += "]";
    EXPECT_EQ(grammar_accepts(t, text), n <= 100) << n;
  }
}

// -- Combinators, references ----------------------------------------------------------------

TEST(JsonSchemaGbnf, EnumConstAndTypes) {
  expect_language(
      R"({"enum": ["red", 1, null, {"a": [1, 2]}, true, 1.5]})",
      {R"("red")", "1", "null", R"({"a":[1,2]})", R"({ "a": [1, 2] })", "true", "1.5"},
      {R"("blue")", R"({"a": [2, 1]})", R"({"a": [1, 2], "b": 1})", "false", "2", "1.50"});
  expect_language(R"({"type": "string", "enum": ["a", 1]})", {R"("a")"}, {"1"});
  expect_language(R"({"type": "integer", "enum": [1, 1.0, 2.5, "x"]})", {"1", "1.0"},
                  {"2.5", R"("x")"});
  expect_language(R"({"const": "x", "enum": ["x", "y"], "type": "string", "title": "t"})",
                  {R"("x")"}, {R"("y")"});
  expect_language(R"({"type": ["string", "null"], "maxLength": 1})", {R"("a")", "null"},
                  {R"("ab")", "1"});
  expect_language(R"({"type": "string", "nullable": true})", {R"("a")", "null"}, {"1"});
  expect_language(R"({"type": ["integer", "number"]})", {"1", "1.5"}, {R"("1")"});
  // No type: any value, each type held to its own keywords.
  expect_language(R"({"minLength": 2, "minimum": 5})",
                  {R"("ab")", "5", "7.5", "null", "{}", "[1]", "true"}, {R"("a")", "4", "-1"});
  for (const char* any : {"true", "{}", R"({"description": "anything"})"})
    expect_language(any, {"1", R"("x")", R"({"a": [null]})", "[]", "false"}, {"", "nul"});
}

TEST(JsonSchemaGbnf, AnyOfOneOfAllOf) {
  for (const char* key : {"anyOf", "oneOf"})
    expect_language(
        fmt::format(
            R"({{"{}": [{{"type": "string", "maxLength": 2}}, {{"type": "integer", "minimum": 5}}]}})",
            key),
        {R"("ab")", "7"}, {R"("abc")", "4", "null"});
  // Sibling keywords apply to every alternative.
  expect_language(
      R"({"type": "object", "properties": {"kind": {"type": "string"}}, "required": ["kind"],
                      "anyOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                {"properties": {"b": {"type": "boolean"}}, "required": ["b"]}]})",
      {R"({"kind": "x", "a": 1})", R"({"kind": "x", "b": true})"},
      {R"({"kind": "x"})", R"({"a": 1})", R"({"kind": "x", "a": true})"});
  expect_language(
      R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                {"properties": {"b": {"type": "string"}, "a": {"minimum": 3}}, "required": ["b"]}]})",
      {R"({"a": 3, "b": "x"})"}, {R"({"a": 2, "b": "x"})", R"({"a": 3})", R"({"b": "x"})"});
  expect_language(
      R"({"type": "integer", "allOf": [{"minimum": 0}, {"maximum": 10}, {"exclusiveMaximum": 9}]})",
      {"0", "8"}, {"-1", "9", "10"});
  // Pydantic's inheritance and described references.
  expect_language(
      R"({"$defs": {"Base": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
                      "allOf": [{"$ref": "#/$defs/Base"}], "properties": {"name": {"type": "string"}}, "required": ["name"]})",
      {R"({"id": 1, "name": "x"})"}, {R"({"name": "x"})", R"({"id": 1})"});
  expect_language(R"({"$defs": {"Color": {"enum": ["r", "g"]}}, "type": "object",
                      "properties": {"c": {"allOf": [{"$ref": "#/$defs/Color"}], "description": "a color"}}})",
                  {R"({"c": "r"})"}, {R"({"c": "b"})"});
  expect_language(
      R"({"$defs": {"Pos": {"type": "integer", "minimum": 1}}, "$ref": "#/$defs/Pos", "maximum": 3})",
      {"1", "3"}, {"0", "4"});
}

TEST(JsonSchemaGbnf, ReferencesAndRecursion) {
  expect_language(
      R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"],
                      "additionalProperties": false}}, "$ref": "#/$defs/node"})",
      {R"({"v": 1})", R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4, "kids": []}]}]})"},
      {R"({"kids": []})", R"({"v": 1, "kids": [{}]})"});
  expect_language(R"({"definitions": {"list": {"anyOf": [{"type": "null"}, {"type": "object",
                      "properties": {"v": {"type": "integer"}, "next": {"$ref": "#/definitions/list"}},
                      "required": ["v", "next"], "additionalProperties": false}]}}, "$ref": "#/definitions/list"})",
                  {"null", R"({"v": 1, "next": {"v": 2, "next": null}})"},
                  {R"({"v": 1})", R"({"v": 1, "next": 2})"});
  expect_language(R"({"type": "array", "items": {"$ref": "#"}})", {"[]", "[[], [[]]]"},
                  {"[1]", "[[1]]"});
  expect_language(R"({"$defs": {"a~b/c": {"type": "boolean"}}, "$ref": "#/$defs/a~0b~1c"})",
                  {"true"}, {"1"});
  // A recursion without a base case can never end: refused when the grammar is read.
  try {
    compile(R"({"type": "object", "properties": {"self": {"$ref": "#"}}, "required": ["self"],
                "additionalProperties": false})");
    ADD_FAILURE() << "an object that requires itself was accepted";
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("never end"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hyperion::text
