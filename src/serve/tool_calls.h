// Tool calls as OpenAI clients expect them: the model's reply, written in its family's
// tool-call format, parsed into `tool_calls` (whole or streamed), and the grammar that
// forces a call when a request says tool_choice "required" or names a function.
//
// Formats (detect_tool_syntax reads them off the chat template and the vocabulary):
//   kLlama3Json  Llama 3.1/3.2/3.3: the reply is a JSON object {"name": ..., "parameters":
//                {...}} ("arguments" accepted too), optionally after <|python_tag|>; several
//                separated by ";". Detected by <|python_tag|>, or a Llama 3 header template
//                (<|start_header_id|>) that mentions "parameters".
//   kHermes      Qwen 2.5 / Qwen3 (Hermes' format): <tool_call>\n{"name": ..., "arguments":
//                {...}}\n</tool_call>, any number of them, with text before, between or
//                after. Detected by <tool_call> in the template.
//   kMistral     [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...] (Mistral 7B v0.3,
//                Mixtral 8x22B, Mistral Small 3.1), or the v11+ tokenizers' form
//                [TOOL_CALLS]name[ARGS]{...} repeated per call (Mistral Small 3.2,
//                Magistral, Devstral; chosen for forcing when the vocabulary has [ARGS]).
//                Detected by [TOOL_CALLS] in the template. Call ids are 9 alphanumerics,
//                which Mistral's templates demand of the ids sent back.
//   kGemma       Gemma has no tool tokens and its stock template renders no tools; Google's
//                function-calling guide teaches the tools in the prompt and a reply of
//                {"name": ..., "parameters": {...}} (its JSON variant; the other variant,
//                [f(a=1)] Python calls, cannot be constrained by a JSON schema). Several are
//                separated by newlines; also read inside a ```json or ```tool_code fence.
//                Detected by a Gemma template (<start_of_turn>) that renders `tools`.
//   kNone        none of these: tools reach the template, replies stay text.
// Markers that are special tokens of the vocabulary (<|python_tag|>, [TOOL_CALLS], [ARGS])
// are token elements in the forcing grammar (<[ID]>), so the model writes the token it was
// trained on; the others are literal text (Qwen's <tool_call>, a text token of its
// vocabulary, is matched by that token's bytes).
//
// Parsing is one state machine for whole and streamed replies (ToolCallStream), so a stream
// split anywhere yields the same calls as the whole text. Text that cannot be a call goes
// out as content at once; text that may still turn into a call marker is held back. A call
// is committed, and its header ({index, id, type, function: {name, arguments: ""}}) sent,
// once its name is known to be one of the request's tools and its arguments have begun as a
// JSON object; its arguments then stream, with whitespace outside strings removed (the
// `arguments` string is the model's JSON, compact). Anything malformed before that point
// (not JSON, an unknown name, arguments that are not an object) is content: never an error.
// A whole reply (parse_tool_calls) also turns a committed call whose arguments never closed
// into content; a stream has sent it already and keeps it (finish_reason says "length").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace hyperion::text {
class Tokenizer;
}

namespace hyperion::serve {

enum class ToolFormat { kNone, kLlama3Json, kHermes /* Qwen 2.5/3 */, kMistral, kGemma };
// "none", "llama3_json", "hermes", "mistral", "gemma".
const char* tool_format_name(ToolFormat f);

// A marker string and, when the vocabulary has it as one token, that token.
struct ToolMarker {
  ToolMarker() = default;
  explicit ToolMarker(std::string marker) : text(std::move(marker)) {}
  std::string text;
  int32_t token = -1;    // -1: written as text
  bool special = false;  // a special token (decode leaves its text out unless asked)
};

// How a model writes tool calls.
struct ToolSyntax {
  ToolFormat format = ToolFormat::kNone;
  bool mistral_args = false;  // kMistral: force the [TOOL_CALLS]name[ARGS]{...} form
  ToolMarker python_tag{"<|python_tag|>"};
  ToolMarker tool_calls{"[TOOL_CALLS]"};
  ToolMarker args{"[ARGS]"};
  ToolMarker open{"<tool_call>"};
  ToolMarker close{"</tool_call>"};
  // Some marker of this format is a special token: its text must be kept in the output
  // (GenerationRequest::keep_special_text) for the parser to see it.
  bool needs_special_text() const;
};

// The format the template teaches, with the markers looked up in the vocabulary
// (`token_id`: -1 when absent; `is_special`: may be empty).
ToolSyntax detect_tool_syntax(const std::string& chat_template,
                              const std::function<int32_t(std::string_view)>& token_id,
                              const std::function<bool(int32_t)>& is_special = {});
ToolSyntax detect_tool_syntax(const std::string& chat_template, const text::Tokenizer& tok);
ToolFormat detect_tool_format(const std::string& chat_template, const text::Tokenizer& tok);

// A fresh call id: "call_" + 24 alphanumerics (OpenAI's shape), or 9 alphanumerics for
// kMistral (its templates refuse other ids).
std::string new_tool_call_id(ToolFormat f);

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object, compact
};

// A finished reply: its content (text outside calls; equal to the text when there is no
// call) and its calls.
struct ParsedReply {
  std::string content;
  std::vector<ToolCall> calls;
};

// One piece of a streamed reply, in order.
struct ToolDelta {
  enum Kind { kContent, kCallStart, kArguments };
  Kind kind = kContent;
  std::string text;  // kContent: content text; kArguments: a piece of the arguments
  int index = 0;     // kCallStart, kArguments: the call's index
  std::string id, name;  // kCallStart
};

// The incremental parser. `tool_names`: the request's functions (a call must name one;
// empty: any name).
class ToolCallStream {
 public:
  ToolCallStream(ToolSyntax syntax, std::vector<std::string> tool_names);
  ~ToolCallStream();
  ToolCallStream(ToolCallStream&&) noexcept;
  ToolCallStream& operator=(ToolCallStream&&) noexcept;

  // Appends the deltas `text` makes final to `out` (adjacent pieces of one kind merged).
  void feed(std::string_view text, std::vector<ToolDelta>& out);
  // The end of the reply: whatever was held back.
  void finish(std::vector<ToolDelta>& out);
  int calls() const;  // calls committed so far

  struct Impl;

 private:
  friend ParsedReply parse_tool_calls(const ToolSyntax&, const std::vector<std::string>&,
                                      std::string_view);
  std::unique_ptr<Impl> impl_;
};

ParsedReply parse_tool_calls(const ToolSyntax& syntax, const std::vector<std::string>& tool_names,
                             std::string_view text);

// The OpenAI stream form of a tool delta: {"index", "id", "type", "function": {"name",
// "arguments": ""}} for kCallStart, {"index", "function": {"arguments"}} for kArguments.
nlohmann::json tool_delta_json(const ToolDelta& d);

// ---- Requests ----

struct ToolChoice {
  enum Mode { kNone, kAuto, kRequired, kNamed };
  Mode mode = kAuto;
  std::string name;  // kNamed
};

// The function names of a request's `tools` ([{"type": "function", "function": {"name",
// "description", "parameters", "strict"}}]), checked: a 400 (ApiException) naming
// tools[i]... for a missing or bad type, name ([a-zA-Z0-9_-]{1,64}, unique), parameters
// (an object) or an unknown field.
std::vector<std::string> read_tools(const nlohmann::ordered_json& tools);
// "none" | "auto" | "required" | {"type": "function", "function": {"name"}} (a name among
// `names`); else a 400 naming tool_choice.
ToolChoice read_tool_choice(const nlohmann::ordered_json& v, const std::vector<std::string>& names);

// The GBNF grammar of the replies that call a tool in `syntax`'s format: any of `tools`
// for kRequired (several when `parallel`), the named one for kNamed; each call's arguments
// constrained by its function's `parameters` (json_schema_to_gbnf, its rules prefixed
// "t<i>-"). A `parameters` that is not a supported schema of an object is a 400 naming
// tools[i].function.parameters and the place in it.
std::string tool_call_gbnf(const ToolSyntax& syntax, const nlohmann::ordered_json& tools,
                           const ToolChoice& choice, bool parallel);

// What a chat request asked of tools.
struct ToolRequest {
  ToolChoice choice{ToolChoice::kNone, ""};
  bool parallel = true;
  std::vector<std::string> names;
  bool parse = false;  // the reply is parsed into tool_calls (syntax.format != kNone)
  ToolSyntax syntax;
};

}  // namespace hyperion::serve
