#include "serve/tool_calls.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "base/error.h"
#include "serve/api_fields.h"
#include "text/grammar/gbnf.h"
#include "text/grammar/grammar_error.h"
#include "text/grammar/json_schema_gbnf.h"
#include "text/tokenizer.h"

namespace hyperion::serve {

using ojson = nlohmann::ordered_json;

const char* tool_format_name(ToolFormat f) {
  switch (f) {
    case ToolFormat::kLlama3Json:
      return "llama3_json";
    case ToolFormat::kHermes:
      return "hermes";
    case ToolFormat::kMistral:
      return "mistral";
    case ToolFormat::kGemma:
      return "gemma";
    case ToolFormat::kNone:
      break;
  }
  return "none";
}

bool ToolSyntax::needs_special_text() const {
  switch (format) {
    case ToolFormat::kLlama3Json:
      return python_tag.special;
    case ToolFormat::kHermes:
      return open.special || close.special;
    case ToolFormat::kMistral:
      return tool_calls.special || args.special;
    case ToolFormat::kGemma:
    case ToolFormat::kNone:
      break;
  }
  return false;
}

ToolSyntax detect_tool_syntax(const std::string& tpl,
                              const std::function<int32_t(std::string_view)>& token_id,
                              const std::function<bool(int32_t)>& is_special) {
  ToolSyntax s;
  const auto has = [&tpl](std::string_view part) { return tpl.find(part) != std::string::npos; };
  if (has("[TOOL_CALLS]"))
    s.format = ToolFormat::kMistral;
  else if (has("<tool_call>"))
    s.format = ToolFormat::kHermes;
  else if (has("<|python_tag|>") || (has("<|start_header_id|>") && has("parameters")))
    s.format = ToolFormat::kLlama3Json;
  else if (has("<start_of_turn>") && has("tools"))
    s.format = ToolFormat::kGemma;
  for (ToolMarker* m : {&s.python_tag, &s.tool_calls, &s.args, &s.open, &s.close}) {
    m->token = token_id ? token_id(m->text) : -1;
    m->special = m->token >= 0 && is_special && is_special(m->token);
  }
  s.mistral_args = s.format == ToolFormat::kMistral && (s.args.token >= 0 || has("[ARGS]"));
  return s;
}

ToolSyntax detect_tool_syntax(const std::string& chat_template, const text::Tokenizer& tok) {
  return detect_tool_syntax(
      chat_template, [&tok](std::string_view t) { return tok.token_id(t); },
      [&tok](int32_t id) { return tok.is_special(id); });
}

ToolFormat detect_tool_format(const std::string& chat_template, const text::Tokenizer& tok) {
  return detect_tool_syntax(chat_template, tok).format;
}

std::string new_tool_call_id(ToolFormat f) {
  static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof(kAlnum) - 2);
  const bool mistral = f == ToolFormat::kMistral;
  std::string id = mistral ? "" : "call_";
  for (int i = 0; i < (mistral ? 9 : 24); ++i) id += kAlnum[pick(rng)];
  return id;
}

namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '_' || c == '-';
}

// One JSON value checked a byte at a time (RFC 8259; bytes >= 0x80 inside strings are
// taken as they are: the engine's text is valid UTF-8).
class JsonValueScan {
 public:
  enum Result {
    kMore,        // the byte is part of the value, which goes on
    kDone,        // the byte ended the value
    kDoneBefore,  // the value (a number) ended before this byte, which is not part of it
    kError
  };
  Result feed(char c) {
    switch (st_) {
      case kString:
        if (c == '"') {
          if (key_) {
            st_ = kColon;
            return kMore;
          }
          return value_done();
        }
        if (c == '\\') st_ = kEscape;
        return static_cast<unsigned char>(c) < 0x20 ? kError : kMore;
      case kEscape:
        if (c == 'u') {
          st_ = kUnicode;
          hex_left_ = 4;
          return kMore;
        }
        st_ = kString;
        return c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't'
                   ? kMore
                   : kError;
      case kUnicode:
        if (!is_hex(c)) return kError;
        if (--hex_left_ == 0) st_ = kString;
        return kMore;
      case kNumber:
        if (number_step(c)) return kMore;
        if (num_ != kZero && num_ != kInt && num_ != kFrac && num_ != kExp) return kError;
        if (value_done() == kDone) return kDoneBefore;
        return feed(c);  // a delimiter of the container
      case kLiteral:
        if (c != *lit_) return kError;
        return *++lit_ == '\0' ? value_done() : kMore;
      case kValue:
      case kValueOrClose:
        if (is_ws(c)) return kMore;
        if (st_ == kValueOrClose && c == ']') return close();
        return begin_value(c);
      case kKey:
      case kKeyOrClose:
        if (is_ws(c)) return kMore;
        if (st_ == kKeyOrClose && c == '}') return close();
        if (c != '"') return kError;
        st_ = kString;
        key_ = true;
        return kMore;
      case kColon:
        if (is_ws(c)) return kMore;
        if (c != ':') return kError;
        st_ = kValue;
        return kMore;
      case kAfter:
        if (is_ws(c)) return kMore;
        if (c == ',') {
          st_ = stack_.back() == '{' ? kKey : kValue;
          return kMore;
        }
        if (c == (stack_.back() == '{' ? '}' : ']')) return close();
        return kError;
      case kEnd:
        break;
    }
    return kError;
  }
  bool in_string() const { return st_ == kString || st_ == kEscape || st_ == kUnicode; }

 private:
  enum St { kValue, kValueOrClose, kKey, kKeyOrClose, kColon, kAfter, kString, kEscape, kUnicode, kNumber, kLiteral, kEnd };
  enum Num { kSign, kZero, kInt, kDot, kFrac, kE, kESign, kExp };
  static constexpr size_t kMaxDepth = 256;

  Result begin_value(char c) {
    key_ = false;
    switch (c) {
      case '{':
      case '[':
        if (stack_.size() >= kMaxDepth) return kError;
        stack_.push_back(c);
        st_ = c == '{' ? kKeyOrClose : kValueOrClose;
        return kMore;
      case '"':
        st_ = kString;
        return kMore;
      case 't':
        lit_ = "rue";
        st_ = kLiteral;
        return kMore;
      case 'f':
        lit_ = "alse";
        st_ = kLiteral;
        return kMore;
      case 'n':
        lit_ = "ull";
        st_ = kLiteral;
        return kMore;
      default:
        if (c != '-' && !is_digit(c)) return kError;
        st_ = kNumber;
        num_ = c == '-' ? kSign : c == '0' ? kZero : kInt;
        return kMore;
    }
  }
  bool number_step(char c) {
    const bool e = c == 'e' || c == 'E';
    switch (num_) {
      case kSign:
        if (!is_digit(c)) return false;
        num_ = c == '0' ? kZero : kInt;
        return true;
      case kZero:
        if (c != '.' && !e) return false;
        num_ = e ? kE : kDot;
        return true;
      case kInt:
        if (is_digit(c)) return true;
        if (c != '.' && !e) return false;
        num_ = e ? kE : kDot;
        return true;
      case kDot:
        if (!is_digit(c)) return false;
        num_ = kFrac;
        return true;
      case kFrac:
        if (is_digit(c)) return true;
        if (!e) return false;
        num_ = kE;
        return true;
      case kE:
        if (c == '+' || c == '-') {
          num_ = kESign;
          return true;
        }
        [[fallthrough]];
      case kESign:
        if (!is_digit(c)) return false;
        num_ = kExp;
        return true;
      case kExp:
        return is_digit(c);
    }
    return false;
  }
  Result close() {
    stack_.pop_back();
    return value_done();
  }
  Result value_done() {
    if (stack_.empty()) {
      st_ = kEnd;
      return kDone;
    }
    st_ = kAfter;
    return kMore;
  }

  St st_ = kValue;
  Num num_ = kInt;
  bool key_ = false;
  int hex_left_ = 0;
  const char* lit_ = "";
  std::string stack_;
};

// The text of a JSON string's content (between its quotes), decoded; false when it does
// not decode.
bool decode_json_string(const std::string& raw, std::string* out) {
  try {
    *out = nlohmann::json::parse("\"" + raw + "\"").get<std::string>();
    return true;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

}  // namespace

// ---- The parser ----
//
// Modes: kStart (the reply's first bytes, where Llama's and Gemma's bare JSON may begin),
// kContent (text; a marker opens a list), kList (between the calls of a list: separators,
// whitespace, array brackets, a terminator such as </tool_call>, more markers), kObject (a
// call object {"name", "arguments"}), kMistralName and kArgs (Mistral's name[ARGS]{...}).
// `raw_` holds what the current attempt consumed since its list opened (or since its last
// committed call); an attempt that fails before committing gives the opener back as content
// and reads the rest again as text, so every failure moves on by at least one byte.
struct ToolCallStream::Impl {
  Impl(ToolSyntax s, std::vector<std::string> n) : syn(std::move(s)), names(std::move(n)) {
    switch (syn.format) {
      case ToolFormat::kLlama3Json:
        markers = {syn.python_tag.text};
        break;
      case ToolFormat::kHermes:
        markers = {syn.open.text};
        break;
      case ToolFormat::kMistral:
        markers = {syn.tool_calls.text};
        break;
      case ToolFormat::kGemma:
        markers = {"```tool_code", "```json"};
        break;
      case ToolFormat::kNone:
        break;
    }
    bare_start = syn.format == ToolFormat::kLlama3Json || syn.format == ToolFormat::kGemma;
    mode = bare_start ? kStart : kContent;
  }

  enum Mode { kStart, kContent, kList, kObject, kMistralName, kArgs };
  enum ObjState { kKeyOrEnd, kKey, kInKey, kColon, kValue, kInValue, kCommaOrEnd };
  enum Role { kSkip, kName, kArguments };

  struct CallInfo {
    bool complete = false;
    std::string raw;  // the call's text (for a whole reply that drops an unfinished call)
  };

  ToolSyntax syn;
  std::vector<std::string> names;
  std::vector<std::string> markers;  // open a list
  bool bare_start = false;

  std::string pending;  // input not consumed yet (from pos)
  size_t pos = 0;
  bool ended = false;
  Mode mode = kContent;
  std::vector<ToolDelta>* out = nullptr;

  // Content: whitespace at a segment's start is held until something else comes.
  bool seg_start = true;
  bool drop_ws = false;  // after a list of calls: that whitespace is dropped
  std::string ws_hold;

  // The list being read.
  std::string raw;        // this attempt's text
  size_t unit_len = 0;    // its opener (a marker, or the bare '{' / '['): given back on failure
  std::string prefix_ws;  // the held whitespace before the opener
  std::string terminator;  // "</tool_call>", "```", or none
  bool list_committed = false;
  bool in_array = false;
  bool after_call = false;  // a call ended last: a separator may come
  bool any_element = false;

  // The call being read.
  ObjState ost = kKeyOrEnd;
  JsonValueScan val;
  Role role = kSkip;
  std::string key_raw, name_raw, name, args_buf;
  bool name_done = false;
  int args_state = 0;  // 0 none yet, 1 reading, 2 read
  bool committed = false;
  int index = -1;

  int calls = 0;
  std::vector<CallInfo> infos;

  // ---- output ----
  // Content and argument pieces join the delta before them when it is of their kind (a
  // call's header is never joined: its arguments stay "", as OpenAI sends them).
  void emit(ToolDelta::Kind kind, std::string_view text, int idx = 0) {
    if (kind != ToolDelta::kCallStart && !out->empty()) {
      ToolDelta& back = out->back();
      if (back.kind == kind && (kind == ToolDelta::kContent || back.index == idx)) {
        back.text.append(text);
        return;
      }
    }
    ToolDelta d;
    d.kind = kind;
    d.text = std::string(text);
    d.index = idx;
    out->push_back(std::move(d));
  }
  // Content text, holding a segment's leading whitespace.
  void content(std::string_view s) {
    for (size_t i = 0; i < s.size(); ++i) {
      if (seg_start) {
        if (is_ws(s[i])) {
          ws_hold += s[i];
          continue;
        }
        if (!drop_ws && !ws_hold.empty()) emit(ToolDelta::kContent, ws_hold);
        ws_hold.clear();
        seg_start = false;
      }
      emit(ToolDelta::kContent, s.substr(i, 1));
    }
  }

  // ---- markers ----
  // Whether pending[at..] starts with `m` (1), may still (2: the input ends inside it), or
  // not (0).
  int match(size_t at, const std::string& m) const {
    const size_t have = pending.size() - at;
    if (have >= m.size()) return pending.compare(at, m.size(), m) == 0 ? 1 : 0;
    if (ended) return 0;
    return pending.compare(at, have, m, 0, have) == 0 ? 2 : 0;
  }

  // ---- lists ----
  void open_list(const std::string& opener, bool bare) {
    prefix_ws = seg_start ? ws_hold : "";
    ws_hold.clear();
    raw = opener;
    unit_len = opener.size();
    terminator.clear();
    if (syn.format == ToolFormat::kHermes && !bare) terminator = syn.close.text;
    if (syn.format == ToolFormat::kGemma && !bare) terminator = "```";
    list_committed = false;
    in_array = bare && opener == "[";
    after_call = false;
    any_element = false;
    pos += opener.size();
    if (bare && opener == "{")
      begin_object();
    else
      mode = kList;
  }
  // What followed a list's last call, less the separators right after it.
  std::string after_last_call() const {
    const size_t from = raw.find_first_not_of(" \t\r\n,;");
    return from == std::string::npos ? "" : raw.substr(from);
  }
  // The list ended where it should (a terminator, its ']', the end).
  void end_list() {
    if (!list_committed) return fail_list();
    // Only its closing after the last call: done; anything more (a marker that opened no
    // call) is read again as text.
    const std::string rest = after_last_call();
    if (!rest.empty() && rest != "]" && rest != terminator) refeed(rest);
    raw.clear();
    to_content(true);
  }
  // The list cannot go on.
  void fail_list() {
    if (list_committed) {
      // Its calls stand; what came after the last one is read again as text.
      refeed(after_last_call());
      raw.clear();
      return to_content(true);
    }
    // Nothing committed: the opener is content, the rest is read again.
    ws_hold = prefix_ws;
    prefix_ws.clear();
    mode = kContent;
    const std::string rest = raw.substr(unit_len);
    content(std::string_view(raw).substr(0, unit_len));
    raw.clear();
    refeed(rest);
  }
  void to_content(bool drop) {
    mode = kContent;
    seg_start = true;
    drop_ws = drop;
    ws_hold.clear();
  }
  void refeed(const std::string& text) {
    pending.replace(0, pos, text);
    pos = 0;
  }

  // ---- calls ----
  bool valid_name(const std::string& n) const {
    if (n.empty()) return false;
    return names.empty() || std::find(names.begin(), names.end(), n) != names.end();
  }
  void begin_object() {
    mode = kObject;
    ost = kKeyOrEnd;
    role = kSkip;
    name_raw.clear();
    name.clear();
    args_buf.clear();
    name_done = false;
    args_state = 0;
    committed = false;
    any_element = true;
  }
  void commit() {
    committed = true;
    list_committed = true;
    prefix_ws.clear();
    index = calls++;
    ToolDelta d;
    d.kind = ToolDelta::kCallStart;
    d.index = index;
    d.id = new_tool_call_id(syn.format);
    d.name = name;
    out->push_back(std::move(d));
    if (!args_buf.empty()) emit(ToolDelta::kArguments, args_buf, index);
    args_buf.clear();
  }
  void args_char(char c) {
    if (committed)
      emit(ToolDelta::kArguments, std::string_view(&c, 1), index);
    else
      args_buf += c;
  }
  // The call object (or Mistral's arguments) is complete.
  void call_done() {
    if (!committed) {
      if (!name_done || !valid_name(name)) return fail_list();
      commit();
    }
    if (args_state == 0) emit(ToolDelta::kArguments, "{}", index);
    infos.push_back({true, raw});
    committed = false;
    raw.clear();
    mode = kList;
    after_call = true;
  }
  // A byte that breaks the call being read (not consumed).
  void call_error() {
    if (!committed) return fail_list();
    // Sent already: the call stays, unfinished; the rest is text.
    infos.push_back({false, raw});
    committed = false;
    raw.clear();
    to_content(true);
  }

  // ---- the machine ----
  // Consumes from pos; false when it needs more input.
  bool step() {
    switch (mode) {
      case kStart: {
        const char c = pending[pos];
        if (is_ws(c)) {
          ws_hold += c;
          ++pos;
          return true;
        }
        mode = kContent;
        if (c == '{' || (c == '[' && syn.format == ToolFormat::kGemma)) open_list(std::string(1, c), true);
        return true;
      }
      case kContent:
        return step_content();
      case kList:
        return step_list();
      case kObject:
        return step_object();
      case kMistralName:
        return step_mistral_name();
      case kArgs:
        return step_args();
    }
    return false;
  }

  bool step_content() {
    size_t j = pos;
    for (; j < pending.size(); ++j) {
      int best = 0;
      const std::string* found = nullptr;
      for (const std::string& m : markers) {
        const int r = match(j, m);
        if (r == 1) found = &m;
        best = std::max(best, r);
      }
      if (best == 0) continue;
      content(std::string_view(pending).substr(pos, j - pos));
      pos = j;
      if (found != nullptr) {
        if (seg_start && drop_ws) ws_hold.clear();
        open_list(*found, false);
        return true;
      }
      return false;  // a marker may begin here
    }
    content(std::string_view(pending).substr(pos));
    pos = pending.size();
    return true;
  }

  bool step_list() {
    const char c = pending[pos];
    if (is_ws(c) || ((c == ',' || c == ';') && after_call)) {
      if (c == ',' || c == ';') after_call = false;
      raw += c;
      ++pos;
      return true;
    }
    // A terminator, or a marker that opens more calls.
    std::vector<const std::string*> cands;
    if (!terminator.empty()) cands.push_back(&terminator);
    for (const std::string& m : markers) cands.push_back(&m);
    bool partial = false;
    const std::string* full = nullptr;
    for (const std::string* m : cands) {
      const int r = match(pos, *m);
      if (r == 2) partial = true;
      if (r == 1 && (full == nullptr || m->size() > full->size())) full = m;
    }
    if (partial) return false;
    if (full != nullptr) {
      pos += full->size();
      raw += *full;
      if (full == &terminator)
        end_list();
      else
        after_call = false;  // more calls (Mistral's [TOOL_CALLS]f[ARGS]{..}[TOOL_CALLS]g...)
      return true;
    }
    if (c == '[' && !in_array && !any_element) {
      in_array = true;
      raw += c;
      ++pos;
      return true;
    }
    if (c == ']' && in_array) {
      raw += c;
      ++pos;
      in_array = false;
      end_list();
      return true;
    }
    if (c == '{') {
      raw += c;
      ++pos;
      begin_object();
      return true;
    }
    if (syn.format == ToolFormat::kMistral && is_name_char(c) && !in_array && !after_call) {
      any_element = true;
      name_raw.clear();
      name_done = false;
      args_state = 0;
      committed = false;
      args_buf.clear();
      mode = kMistralName;
      return true;
    }
    fail_list();
    return true;
  }

  bool step_object() {
    const char c = pending[pos];
    raw += c;
    ++pos;
    switch (ost) {
      case kKeyOrEnd:
      case kKey:
        if (is_ws(c)) return true;
        if (c == '}' && ost == kKeyOrEnd) {
          call_done();
          return true;
        }
        if (c != '"') return unread_error();
        val = JsonValueScan();
        val.feed('"');
        key_raw.clear();
        ost = kInKey;
        return true;
      case kInKey: {
        // A key is a string value to the scanner: it ends at its closing quote.
        const JsonValueScan::Result r = val.feed(c);
        if (r == JsonValueScan::kError) return unread_error();
        if (r == JsonValueScan::kDone) {
          std::string key;
          if (!decode_json_string(key_raw, &key)) return unread_error();
          role = kSkip;
          if (key == "name" && !name_done) role = kName;
          if ((key == "arguments" || key == "parameters") && args_state == 0) role = kArguments;
          ost = kColon;
        } else {
          key_raw += c;
        }
        return true;
      }
      case kColon:
        if (is_ws(c)) return true;
        if (c != ':') return unread_error();
        ost = kValue;
        return true;
      case kValue:
        if (is_ws(c)) return true;
        if ((role == kName && c != '"') || (role == kArguments && c != '{')) return unread_error();
        val = JsonValueScan();
        if (val.feed(c) == JsonValueScan::kError) return unread_error();
        ost = kInValue;
        if (role == kArguments) {
          args_state = 1;
          args_char(c);
          maybe_commit();
        }
        return true;
      case kInValue: {
        const bool in_string = val.in_string();
        const JsonValueScan::Result r = val.feed(c);
        if (r == JsonValueScan::kError) return unread_error();
        if (r == JsonValueScan::kDoneBefore) {  // a number ended: c is the object's
          raw.pop_back();
          --pos;
          ost = kCommaOrEnd;
          return true;
        }
        if (role == kName && r != JsonValueScan::kDone) name_raw += c;
        if (role == kArguments && (in_string || !is_ws(c))) args_char(c);
        if (r == JsonValueScan::kDone) {
          ost = kCommaOrEnd;
          if (role == kName) {
            name_done = true;
            if (!decode_json_string(name_raw, &name) || !valid_name(name)) return unread_error();
            maybe_commit();
          }
          if (role == kArguments) args_state = 2;
        }
        return true;
      }
      case kCommaOrEnd:
        if (is_ws(c)) return true;
        if (c == ',') {
          ost = kKey;
          return true;
        }
        if (c == '}') {
          call_done();
          return true;
        }
        return unread_error();
    }
    return true;
  }
  // The byte just taken breaks the call: put it back and fail.
  bool unread_error() {
    if (committed) {
      raw.pop_back();
      --pos;
    }
    call_error();
    return true;
  }
  void maybe_commit() {
    if (!committed && name_done && valid_name(name) && args_state >= 1) commit();
  }

  bool step_mistral_name() {
    const char c = pending[pos];
    if (is_name_char(c) && name_raw.size() < 64) {
      name_raw += c;
      raw += c;
      ++pos;
      return true;
    }
    const int r = match(pos, syn.args.text);
    if (r == 2) return false;
    if (r == 1 || c == '{') {
      name = name_raw;
      name_done = true;
      if (!valid_name(name)) {
        fail_list();
        return true;
      }
      if (r == 1) {
        raw += syn.args.text;
        pos += syn.args.text.size();
      }
      mode = kArgs;
      val = JsonValueScan();
      return true;
    }
    fail_list();
    return true;
  }

  bool step_args() {
    const char c = pending[pos];
    raw += c;
    ++pos;
    if (args_state == 0) {
      if (is_ws(c)) return true;
      if (c != '{') {
        fail_list();
        return true;
      }
      args_state = 1;
      val.feed(c);
      args_char(c);
      commit();
      return true;
    }
    const bool in_string = val.in_string();
    const JsonValueScan::Result r = val.feed(c);
    if (r == JsonValueScan::kError) return unread_error();
    if (in_string || !is_ws(c)) args_char(c);
    if (r == JsonValueScan::kDone) {
      args_state = 2;
      call_done();
    }
    return true;
  }

  void run() {
    while (pos < pending.size())
      if (!step()) break;
    pending.erase(0, pos);
    pos = 0;
  }

  // The input has ended: settles whatever mode it ended in; false when nothing is left.
  bool settle() {
    switch (mode) {
      case kStart:
      case kContent:
        if (!drop_ws && !ws_hold.empty()) emit(ToolDelta::kContent, ws_hold);
        ws_hold.clear();
        return false;
      case kList:
        end_list();
        return true;
      case kObject:
      case kArgs:
        if (committed) {
          infos.push_back({false, raw});  // cut off
          committed = false;
          raw.clear();
          to_content(true);
          return true;
        }
        fail_list();
        return true;
      case kMistralName:
        fail_list();
        return true;
    }
    return false;
  }
};

ToolCallStream::ToolCallStream(ToolSyntax syntax, std::vector<std::string> tool_names)
    : impl_(std::make_unique<Impl>(std::move(syntax), std::move(tool_names))) {}
ToolCallStream::~ToolCallStream() = default;
ToolCallStream::ToolCallStream(ToolCallStream&&) noexcept = default;
ToolCallStream& ToolCallStream::operator=(ToolCallStream&&) noexcept = default;

void ToolCallStream::feed(std::string_view text, std::vector<ToolDelta>& out) {
  Impl& s = *impl_;
  if (s.ended) return;
  s.out = &out;
  if (s.syn.format == ToolFormat::kNone) {
    if (!text.empty()) s.emit(ToolDelta::kContent, text);
    return;
  }
  s.pending.append(text);
  s.run();
}

void ToolCallStream::finish(std::vector<ToolDelta>& out) {
  Impl& s = *impl_;
  if (s.ended) return;
  s.out = &out;
  s.ended = true;
  // Each round either consumes input or settles a mode for good; failures give back at
  // least one byte as content, so this ends.
  for (;;) {
    s.run();
    if (!s.settle()) break;
  }
}

int ToolCallStream::calls() const { return impl_->calls; }

ParsedReply parse_tool_calls(const ToolSyntax& syntax, const std::vector<std::string>& tool_names,
                             std::string_view text) {
  ToolCallStream stream(syntax, tool_names);
  std::vector<ToolDelta> deltas;
  stream.feed(text, deltas);
  stream.finish(deltas);
  const auto& infos = stream.impl_->infos;
  ParsedReply r;
  std::vector<int> slot(infos.size(), -1);  // call index -> position in r.calls
  for (const ToolDelta& d : deltas) {
    const size_t i = static_cast<size_t>(d.index);
    switch (d.kind) {
      case ToolDelta::kContent:
        r.content += d.text;
        break;
      case ToolDelta::kCallStart:
        if (i < infos.size() && infos[i].complete) {
          slot[i] = static_cast<int>(r.calls.size());
          r.calls.push_back({d.id, d.name, ""});
        } else if (i < infos.size()) {
          r.content += infos[i].raw;  // never finished: text after all
        }
        break;
      case ToolDelta::kArguments:
        if (i < slot.size() && slot[i] >= 0) r.calls[static_cast<size_t>(slot[i])].arguments += d.text;
        break;
    }
  }
  return r;
}

nlohmann::json tool_delta_json(const ToolDelta& d) {
  if (d.kind == ToolDelta::kCallStart)
    return {{"index", d.index},
            {"id", d.id},
            {"type", "function"},
            {"function", {{"name", d.name}, {"arguments", ""}}}};
  return {{"index", d.index}, {"function", {{"arguments", d.text}}}};
}

// ---- Requests ----

namespace {

const char* ojson_type(const ojson& v) {
  return v.is_object() ? "an object" : v.is_array() ? "an array" : v.is_string() ? "a string"
         : v.is_boolean() ? "a boolean" : v.is_number() ? "a number" : "null";
}

bool valid_function_name(const std::string& n) {
  return !n.empty() && n.size() <= 64 && std::all_of(n.begin(), n.end(), is_name_char);
}

// GBNF `g` with every rule name prefixed (literals, classes, token references, repetition
// bounds and comments left as they are).
std::string prefix_rules(std::string_view g, const std::string& prefix) {
  std::string out;
  out.reserve(g.size() * 2);
  size_t i = 0;
  const auto copy_until = [&](char close) {
    out += g[i++];
    while (i < g.size() && g[i] != close) {
      if (g[i] == '\\' && i + 1 < g.size() && close != '>' && close != '}' && close != '\n') out += g[i++];
      out += g[i++];
    }
    if (i < g.size()) out += g[i++];
  };
  while (i < g.size()) {
    const char c = g[i];
    if (c == '"') {
      copy_until('"');
    } else if (c == '[') {
      copy_until(']');
    } else if (c == '<') {
      copy_until('>');
    } else if (c == '{') {
      copy_until('}');
    } else if (c == '#') {
      copy_until('\n');
    } else if (is_name_char(c)) {
      out += prefix;
      while (i < g.size() && is_name_char(g[i])) out += g[i++];
    } else {
      out += g[i++];
    }
  }
  return out;
}

// A special token as its token element; a marker the vocabulary has as a text token (Qwen's
// <tool_call>) as a literal, which that token matches by its bytes.
std::string marker_gbnf(const ToolMarker& m) {
  return m.token >= 0 && m.special ? fmt::format("<[{}]>", m.token) : text::gbnf_literal(m.text);
}

}  // namespace

std::vector<std::string> read_tools(const ojson& tools) {
  if (!tools.is_array()) bad("tools", fmt::format("'tools' must be an array, got {}", ojson_type(tools)));
  std::vector<std::string> names;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& t = tools[i];
    const std::string at = fmt::format("tools[{}]", i);
    if (!t.is_object())
      bad(at, fmt::format("'{}' must be an object {{\"type\": \"function\", \"function\": {{...}}}}", at));
    for (const auto& [k, v] : t.items())
      if (k != "type" && k != "function") bad(at + "." + k, fmt::format("unknown field '{}.{}'", at, k));
    if (!t.contains("type") || t["type"] != "function")
      bad(at + ".type", fmt::format("'{}.type' must be \"function\"", at));
    if (!t.contains("function") || !t["function"].is_object())
      bad(at + ".function", fmt::format("'{}.function' must be an object {{\"name\", \"description\", "
                                        "\"parameters\"}}",
                                        at));
    const ojson& f = t["function"];
    for (const auto& [k, v] : f.items()) {
      const std::string field = at + ".function." + k;
      if (k == "name") {
        if (!v.is_string() || !valid_function_name(v.get<std::string>()))
          bad(field, fmt::format("'{}' must be a string of 1 to 64 letters, digits, '_' or '-'", field));
      } else if (k == "description") {
        if (!v.is_string() && !v.is_null()) bad(field, fmt::format("'{}' must be a string", field));
      } else if (k == "parameters") {
        if (!v.is_object() && !v.is_null())
          bad(field, fmt::format("'{}' must be a JSON schema (an object), got {}", field, ojson_type(v)));
      } else if (k == "strict") {
        if (!v.is_boolean() && !v.is_null()) bad(field, fmt::format("'{}' must be a boolean", field));
      } else {
        bad(field, fmt::format("unknown field '{}'", field));
      }
    }
    if (!f.contains("name")) bad(at + ".function.name", fmt::format("'{}.function.name' is required", at));
    const std::string name = f["name"].get<std::string>();
    if (std::find(names.begin(), names.end(), name) != names.end())
      bad(at + ".function.name", fmt::format("the function '{}' is declared twice in 'tools'", name));
    names.push_back(name);
  }
  return names;
}

ToolChoice read_tool_choice(const ojson& v, const std::vector<std::string>& names) {
  ToolChoice c;
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "none") c.mode = ToolChoice::kNone;
    else if (s == "auto") c.mode = ToolChoice::kAuto;
    else if (s == "required") c.mode = ToolChoice::kRequired;
    else bad("tool_choice", fmt::format("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                        "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got \"{}\"",
                                        s));
  } else if (v.is_object()) {
    for (const auto& [k, val] : v.items())
      if (k != "type" && k != "function") bad("tool_choice." + k, fmt::format("unknown field 'tool_choice.{}'", k));
    if (!v.contains("type") || v["type"] != "function")
      bad("tool_choice.type", "'tool_choice.type' must be \"function\"");
    if (!v.contains("function") || !v["function"].is_object() || !v["function"].contains("name") ||
        !v["function"]["name"].is_string())
      bad("tool_choice.function", "'tool_choice.function' must be {\"name\": string}");
    for (const auto& [k, val] : v["function"].items())
      if (k != "name") bad("tool_choice.function." + k, fmt::format("unknown field 'tool_choice.function.{}'", k));
    c.mode = ToolChoice::kNamed;
    c.name = v["function"]["name"].get<std::string>();
    if (std::find(names.begin(), names.end(), c.name) == names.end())
      bad("tool_choice.function.name",
          fmt::format("'tool_choice' names the function '{}', which 'tools' does not declare", c.name));
  } else {
    bad("tool_choice", fmt::format("'tool_choice' must be a string or an object, got {}", ojson_type(v)));
  }
  if (c.mode == ToolChoice::kRequired && names.empty())
    bad("tool_choice", "'tool_choice' \"required\" needs a non-empty 'tools'");
  return c;
}

std::string tool_call_gbnf(const ToolSyntax& syntax, const ojson& tools, const ToolChoice& choice,
                           bool parallel) {
  HYP_CHECK(syntax.format != ToolFormat::kNone, "tool_call_gbnf: no tool-call format");
  HYP_CHECK(choice.mode == ToolChoice::kRequired || choice.mode == ToolChoice::kNamed,
            "tool_call_gbnf: tool_choice must be required or a function");
  const bool mistral_args = syntax.format == ToolFormat::kMistral && syntax.mistral_args;
  const char* args_key =
      syntax.format == ToolFormat::kLlama3Json || syntax.format == ToolFormat::kGemma ? "parameters" : "arguments";
  std::string rules, alts;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ojson& f = tools[i]["function"];
    const std::string name = f["name"].get<std::string>();
    if (choice.mode == ToolChoice::kNamed && name != choice.name) continue;
    const std::string param = fmt::format("tools[{}].function.parameters", i);
    ojson schema = ojson::object();
    if (f.contains("parameters") && !f["parameters"].is_null()) {
      schema = f["parameters"];
    } else {  // OpenAI: no parameters is a function of none
      schema["type"] = "object";
      schema["properties"] = ojson::object();
      schema["additionalProperties"] = false;
    }
    // A call's arguments are an object, whatever else the schema allows.
    if (!schema.contains("type")) {
      schema["type"] = "object";
    } else {
      const ojson& t = schema["type"];
      const bool object = t == "object" || (t.is_array() && std::find(t.begin(), t.end(), ojson("object")) != t.end());
      if (!object)
        bad(param + ".type", fmt::format("'{}.type' must be \"object\": a call's arguments are a JSON object",
                                         param));
      schema["type"] = "object";
    }
    std::string gbnf;
    try {
      gbnf = text::json_schema_to_gbnf(schema);
    } catch (const text::GrammarError& e) {
      bad(param, fmt::format("'{}' {}{}", param, e.where.empty() ? "" : "at " + e.where + ": ", e.detail));
    }
    const std::string p = fmt::format("t{}-", i);
    rules += prefix_rules(gbnf, p);
    if (!rules.empty() && rules.back() != '\n') rules += '\n';
    std::string call;
    if (mistral_args) {
      call = fmt::format("{} {} {} {}root", marker_gbnf(syntax.tool_calls), text::gbnf_literal(name),
                         marker_gbnf(syntax.args), p);
    } else {
      call = fmt::format("{} {}root \"}}\"",
                         text::gbnf_literal(fmt::format("{{\"name\": \"{}\", \"{}\": ", name, args_key)), p);
      if (syntax.format == ToolFormat::kHermes)
        call = fmt::format("{} \"\\n\" {} \"\\n\" {}", marker_gbnf(syntax.open), call, marker_gbnf(syntax.close));
    }
    rules += fmt::format("{}call ::= {}\n", p, call);
    alts += fmt::format("{}{}call", alts.empty() ? "" : " | ", p);
  }
  HYP_CHECK(!alts.empty(), "tool_call_gbnf: no tool named '{}'", choice.name);
  const bool many = parallel && choice.mode == ToolChoice::kRequired;
  std::string root;
  switch (syntax.format) {
    case ToolFormat::kLlama3Json:
      root = many ? "call (\"; \" call)*" : "call";
      break;
    case ToolFormat::kHermes:
    case ToolFormat::kGemma:
      root = many ? "call (\"\\n\" call)*" : "call";
      break;
    case ToolFormat::kMistral:
      if (mistral_args)
        root = many ? "call+" : "call";
      else
        root = fmt::format("{} \" \"? \"[\" call {}\"]\"", marker_gbnf(syntax.tool_calls),
                           many ? "(\", \" call)* " : "");
      break;
    case ToolFormat::kNone:
      break;
  }
  return fmt::format("root ::= {}\ncall ::= {}\n{}", root, alts, rules);
}

}  // namespace hyperion::serve
