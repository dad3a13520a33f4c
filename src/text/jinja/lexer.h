// The Jinja lexer, configured as Hugging Face configures jinja2 for chat templates:
// trim_blocks (the first newline after a block or comment tag is dropped), lstrip_blocks
// (spaces and tabs before a block or comment tag at the start of a line are dropped),
// `-` and `+` whitespace control on tags, newlines normalized to "\n" and one trailing
// newline of the template removed (keep_trailing_newline=False). Comments vanish and raw
// blocks become text here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hyperion::text::jinja {

struct Pos {
  int line = 1;
  int col = 1;
};

enum class Tok : uint8_t {
  kText,        // template data
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,  // text holds the decoded value
  kInt,
  kFloat,
  kOp,  // text holds the operator: + - * / // % ** ~ ( ) [ ] { } == != < <= > >= = . : | ,
  kEof,
};

struct Token {
  Tok type;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  Pos pos;
};

// Throws hyperion::Error "ORIGIN:LINE:COL: message" on malformed input.
std::vector<Token> lex(std::string_view source, const std::string& origin);

}  // namespace hyperion::text::jinja
