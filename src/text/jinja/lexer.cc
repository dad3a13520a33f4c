#include "text/jinja/lexer.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "base/error.h"
#include "text/jinja/value.h"

namespace hyperion::text::jinja {
namespace {

bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || (c >= '0' && c <= '9');
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

class Lexer {
 public:
  Lexer(std::string_view source, const std::string& origin) : origin_(origin) {
    // Newlines normalized to "\n"; one trailing newline dropped.
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_.push_back(source[i]);
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    size_t p = 0;
    bool line_starting = true;
    const size_t n = src_.size();
    while (p < n) {
      const size_t t = find_tag(p);
      if (t == std::string::npos) {
        emit_text(p, src_.substr(p));
        break;
      }
      const char kind = src_[t + 1];
      const char sign = t + 2 < n && (src_[t + 2] == '-' || src_[t + 2] == '+') ? src_[t + 2] : 0;
      size_t raw_end = 0;
      const bool raw = kind == '%' && match_raw_tag(t, "raw", &raw_end);
      emit_text(p, strip_before(src_.substr(p, t - p), sign, kind != '{', line_starting));
      if (kind == '#') {
        p = skip_comment(t, sign);
      } else if (raw) {
        p = lex_raw(t, raw_end);
      } else {
        p = lex_tag(t, kind, sign);
      }
      line_starting = p > 0 && src_[p - 1] == '\n';
    }
    tokens_.push_back(Token{Tok::kEof, "", 0, 0, pos_at(n)});
    return std::move(tokens_);
  }

 private:
  Pos pos_at(size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const auto line = static_cast<size_t>(it - line_starts_.begin());
    return Pos{static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }

  template <typename... Args>
  [[noreturn]] void error(size_t offset, fmt::format_string<Args...> f, Args&&... args) const {
    const Pos pos = pos_at(offset);
    fail("{}:{}:{}: {}", origin_, pos.line, pos.col, fmt::format(f, std::forward<Args>(args)...));
  }

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    }
    return std::string::npos;
  }

  // The whitespace control before a tag: `-` strips all whitespace; otherwise
  // lstrip_blocks strips spaces and tabs back to the line start before a block or comment.
  static std::string strip_before(std::string text, char sign, bool block_like,
                                  bool line_starting) {
    if (sign == '-') {
      rstrip_space(text);
    } else if (sign != '+' && block_like) {
      const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      if ((l_pos > 0 || line_starting) &&
          text.find_first_not_of(" \t", l_pos) == std::string::npos) {
        text.resize(l_pos);
      }
    }
    return text;
  }

  static void rstrip_space(std::string& text) {
    const auto cps = decode_utf8(text);
    size_t keep = cps.size();
    while (keep > 0 && is_py_space(cps[keep - 1])) --keep;
    if (keep == cps.size()) return;
    std::string out;
    for (size_t i = 0; i < keep; ++i) append_utf8(out, cps[i]);
    text = std::move(out);
  }

  // After `-%}`: all whitespace that follows (Python's \s, Unicode included).
  size_t skip_space_after(size_t p) const {
    while (p < src_.size()) {
      const auto c = static_cast<unsigned char>(src_[p]);
      if (c < 0x80) {
        if (!is_py_space(c)) break;
        ++p;
        continue;
      }
      size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      len = std::min(len, src_.size() - p);
      const auto cps = decode_utf8(std::string_view(src_).substr(p, len));
      if (cps.size() != 1 || !is_py_space(cps[0])) break;
      p += len;
    }
    return p;
  }

  // After a block or comment end: `-` strips whitespace, `+` keeps it, else trim_blocks.
  size_t after_block_end(size_t p, char end_sign) const {
    if (end_sign == '-') return skip_space_after(p);
    if (end_sign == 0 && p < src_.size() && src_[p] == '\n') return p + 1;
    return p;
  }

  void emit_text(size_t offset, std::string text) {
    if (!text.empty()) tokens_.push_back(Token{Tok::kText, std::move(text), 0, 0, pos_at(offset)});
  }

  // `{%[-+]? WORD [-+]?%}` at t; on success *end is the offset just past `%}` and
  // *end_sign_out the sign before it.
  bool match_raw_tag(size_t t, std::string_view word, size_t* end,
                     char* end_sign_out = nullptr) const {
    size_t i = t + 2;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
    while (i < src_.size() && is_ascii_space(src_[i])) ++i;
    if (src_.compare(i, word.size(), word) != 0) return false;
    i += word.size();
    if (i < src_.size() && is_name_char(src_[i])) return false;
    while (i < src_.size() && is_ascii_space(src_[i])) ++i;
    char end_sign = 0;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) end_sign = src_[i++];
    if (src_.compare(i, 2, "%}") != 0) return false;
    *end = i + 2;
    if (end_sign_out != nullptr) *end_sign_out = end_sign;
    return true;
  }

  size_t skip_comment(size_t t, char sign) {
    const size_t from = t + 2 + (sign ? 1 : 0);
    const size_t k = src_.find("#}", from);
    if (k == std::string::npos) error(t, "missing end of comment tag");
    const char end_sign = k > from && (src_[k - 1] == '-' || src_[k - 1] == '+') ? src_[k - 1] : 0;
    return after_block_end(k + 2, end_sign);
  }

  size_t lex_raw(size_t t, size_t begin_end) {
    // The raw tag itself: `-%}` strips what follows; no trim_blocks here (as jinja2).
    size_t p = src_[begin_end - 3] == '-' ? skip_space_after(begin_end) : begin_end;
    for (size_t k = src_.find("{%", p); k != std::string::npos; k = src_.find("{%", k + 1)) {
      size_t end = 0;
      char end_sign = 0;
      if (!match_raw_tag(k, "endraw", &end, &end_sign)) continue;
      const char sign =
          k + 2 < src_.size() && (src_[k + 2] == '-' || src_[k + 2] == '+') ? src_[k + 2] : 0;
      const bool line_starting = p > 0 && src_[p - 1] == '\n';
      emit_text(p, strip_before(src_.substr(p, k - p), sign, true, line_starting));
      return after_block_end(end, end_sign);
    }
    error(t, "missing end of raw directive");
  }

  size_t lex_tag(size_t t, char kind, char sign) {
    const bool block = kind == '%';
    tokens_.push_back(Token{block ? Tok::kBlockBegin : Tok::kVarBegin, "", 0, 0, pos_at(t)});
    size_t p = t + 2 + (sign ? 1 : 0);
    int depth = 0;
    const char close = block ? '%' : '}';
    while (true) {
      while (p < src_.size() && is_ascii_space(src_[p])) ++p;
      if (p >= src_.size())
        error(t, "unexpected end of template: the tag opened here is not closed");
      if (depth == 0) {
        char end_sign = 0;
        size_t q = p;
        if (src_[q] == '-' || (block && src_[q] == '+')) end_sign = src_[q++];
        if (src_.compare(q, 2, std::string{close, '}'}) == 0) {
          tokens_.push_back(Token{block ? Tok::kBlockEnd : Tok::kVarEnd, "", 0, 0, pos_at(p)});
          if (block) return after_block_end(q + 2, end_sign);
          return end_sign == '-' ? skip_space_after(q + 2) : q + 2;
        }
      }
      p = lex_one(p, depth);
    }
  }

  size_t lex_one(size_t p, int& depth) {
    const char c = src_[p];
    if (is_name_start(c)) {
      size_t e = p;
      while (e < src_.size() && is_name_char(src_[e])) ++e;
      tokens_.push_back(Token{Tok::kName, src_.substr(p, e - p), 0, 0, pos_at(p)});
      return e;
    }
    if (is_digit(c)) return lex_number(p);
    if (c == '\'' || c == '"') return lex_string(p);
    static constexpr std::string_view kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "*",
                                                "/",  "%",  "~",  "(",  ")",  "[",  "]", "{", "}",
                                                "=",  ".",  ":",  "|",  ",",  ">",  "<", ";"};
    for (std::string_view op : kOps) {
      if (src_.compare(p, op.size(), op) != 0) continue;
      if (op == "(" || op == "[" || op == "{") ++depth;
      if (op == ")" || op == "]" || op == "}") {
        if (depth == 0) error(p, "unexpected '{}'", op);
        --depth;
      }
      tokens_.push_back(Token{Tok::kOp, std::string(op), 0, 0, pos_at(p)});
      return p + op.size();
    }
    error(p, "unexpected character '{}'", c);
  }

  size_t lex_digits(size_t p, std::string& out) const {
    while (p < src_.size() && (is_digit(src_[p]) ||
                               (src_[p] == '_' && p + 1 < src_.size() && is_digit(src_[p + 1])))) {
      if (src_[p] != '_') out.push_back(src_[p]);
      ++p;
    }
    return p;
  }

  size_t lex_number(size_t start) {
    std::string text;
    size_t p = lex_digits(start, text);
    bool is_float = false;
    if (p + 1 < src_.size() && src_[p] == '.' && is_digit(src_[p + 1])) {
      text.push_back('.');
      p = lex_digits(p + 1, text);
      is_float = true;
    }
    if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      std::string exp = "e";
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) exp.push_back(src_[q++]);
      if (q < src_.size() && is_digit(src_[q])) {
        p = lex_digits(q, exp);
        text += exp;
        is_float = true;
      }
    }
    Token tok{is_float ? Tok::kFloat : Tok::kInt, text, 0, 0, pos_at(start)};
    errno = 0;
    if (is_float) {
      tok.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      tok.int_value = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) error(start, "integer literal {} is too large", text);
    }
    tokens_.push_back(std::move(tok));
    return p;
  }

  static int hex_value(char c) {
    if (is_digit(c)) return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // A quoted literal with Python's escapes (as jinja2 decodes them: unicode-escape).
  size_t lex_string(size_t start) {
    const char quote = src_[start];
    std::string out;
    size_t p = start + 1;
    while (true) {
      if (p >= src_.size()) error(start, "unterminated string literal");
      const char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        out.push_back(c);
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) error(start, "unterminated string literal");
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case '\n':
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
        case 'u':
        case 'U': {
          const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int k = 0; k < digits; ++k, ++p) {
            const int h = p < src_.size() ? hex_value(src_[p]) : -1;
            if (h < 0)
              error(p - 2 - static_cast<size_t>(k), "truncated \\{} escape in string literal", e);
            cp = cp * 16 + static_cast<uint32_t>(h);
          }
          if (cp > 0x10FFFF) error(start, "illegal Unicode character in string literal");
          append_utf8(out, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++k, ++p)
              cp = cp * 8 + static_cast<uint32_t>(src_[p] - '0');
            append_utf8(out, cp);
          } else {
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
    tokens_.push_back(Token{Tok::kString, std::move(out), 0, 0, pos_at(start)});
    return p + 1;
  }

  const std::string& origin_;
  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(std::string_view source, const std::string& origin) {
  return Lexer(source, origin).run();
}

}  // namespace hyperion::text::jinja
