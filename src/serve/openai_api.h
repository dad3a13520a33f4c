// The OpenAI wire format of `hyperion serve`: request parsing and validation for
// POST /v1/completions and POST /v1/chat/completions, the chat template, and the JSON
// of responses, stream chunks and errors. No sockets here (serve/http_server.h).
//
// A body that is not valid JSON, or holds a string that is not valid UTF-8, is a 400
// naming the field ("messages[0].content"); everything written back is valid UTF-8.
//
// Accepted request fields (anything else is a 400 naming the field):
//   both:  model (the served id, or a loaded LoRA adapter's name, which then generates;
//          another name is a 404), max_tokens (>= 1, default 16;
//          chat also max_completion_tokens), temperature [0, 2] (default 1), top_p (0, 1],
//          top_k (>= 0, extension), seed (integer), stop (string or up to 4 strings),
//          stream, stream_options {include_usage}, n (1 only), user (ignored),
//          presence_penalty / frequency_penalty (0 only), ignore_eos (bool, extension:
//          generate exactly max_tokens); structured output, one of: response_format
//          ({"type": "text" | "json_object" | "json_schema", "json_schema": {name, schema,
//          strict}}), guided_json, guided_regex, guided_choice, guided_grammar / grammar
//          (GBNF), json_schema (serve/structured_output.h)
//   completions: prompt (string, or array of token ids, or array of one string),
//          logprobs (null or 0..5: the chosen token's log probability is returned;
//          alternatives are not), echo (false only)
//   chat:  messages (non-empty) [{role, content, name, ...}], logprobs (bool),
//          top_logprobs (0 only); with a Jinja chat template also: roles system, user,
//          assistant, tool; content a string, an array of {type: "text", text} parts
//          (joined by newlines) or null; tool_calls, tool_call_id, reasoning_content;
//          tools ([{type: "function", function: {name, description, parameters, strict}}]),
//          tool_choice ("none" | "auto" | "required" | {type: "function", function: {name}}),
//          parallel_tool_calls (bool, default true): serve/tool_calls.h; with a tool-call
//          format the reply becomes message.tool_calls; add_generation_prompt (bool, default true),
//          chat_template_kwargs (object: more template variables, e.g. enable_thinking)
// Completion prompts get what the tokenizer adds (BOS for Llama and Gemma; a token-id
// prompt is taken as given); chat prompts are the template's text, encoded as it is.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/lora.h"
#include "serve/lora_registry.h"
#include "serve/request.h"
#include "serve/tool_calls.h"
#include "text/chat_template.h"
#include "text/grammar/grammar_cache.h"
#include "text/tokenizer.h"

namespace hyperion::serve {

// A request the API rejects: HTTP status, OpenAI error type and the field at fault.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" when no single field is at fault
};
struct ApiException : std::exception {
  explicit ApiException(ApiError e) : error(std::move(e)) {}
  const char* what() const noexcept override { return error.message.c_str(); }
  ApiError error;
};

// {"error": {"message", "type", "param", "code"}}
std::string error_body(const ApiError& e);

struct ApiContext {
  const text::Tokenizer* tokenizer = nullptr;
  std::string model_name;
  std::string chat_template = "plain";  // plain | llama2 | jinja
  const text::ChatTemplate* jinja = nullptr;  // the template when chat_template is "jinja"
  int64_t context_tokens = 0;           // the engine's max_seq_len (0: unchecked here)
  // Text prompts (chat: all message contents) over this many bytes are refused before
  // tokenization (0: no bound); see prompt_byte_bound().
  size_t max_prompt_bytes = 0;
  // The LoRA adapters a request's `model` may name (null: none).
  const LoraRegistry* adapters = nullptr;
  // Compiled structured-output grammars for this model's vocabulary (null: structured
  // output is refused; serve/structured_output.h).
  std::shared_ptr<text::GrammarCache> grammars;
  // How the model writes tool calls, read off its chat template (serve/tool_calls.h);
  // kNone: tools reach the template but replies stay text, and forcing a call is a 400.
  ToolSyntax tools;
  // Reads a PEFT adapter directory for this base (POST /v1/load_lora_adapter); throws
  // naming the directory and what is wrong. Empty: runtime loading is not offered.
  std::function<std::unique_ptr<LoraAdapter>(const std::string& dir)> read_adapter;
};

// The request's `model` value resolved: the base (null) or a loaded adapter; an unknown
// name throws ApiException (404) listing what is served.
LoraRef resolve_model(const std::string& model, const ApiContext& ctx);

// The byte bound of a context: no prompt of more bytes can fit `context_tokens` tokens,
// as no token stands for more than the tokenizer's longest piece (x2 of slack).
size_t prompt_byte_bound(const text::Tokenizer& tokenizer, int64_t context_tokens);

struct ApiRequest {
  bool chat = false;
  GenerationRequest gen;
  bool stream = false;
  bool include_usage = false;
  int logprobs = -1;  // completions: -1 = none; chat: 0/1
  bool structured = false;  // the body has a structured-output field (gen.grammar)
  ToolRequest tools;        // chat: tools, tool_choice, parallel_tool_calls
};

// Parses and validates a request body (throws ApiException with status 400, or 404 for
// an unknown model).
ApiRequest parse_completion_request(const std::string& body, const ApiContext& ctx);
ApiRequest parse_chat_request(const std::string& body, const ApiContext& ctx);

// The chat template as token ids (BOS first). plain:
//   "System: ...\nUser: ...\nAssistant: ...\n" per message, then "Assistant:"; generation
//   also stops at "\nUser:" (added to the request's stop strings).
// llama2: "[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] ..."
// jinja: the model's template (text/chat_template.h); an error it raises is a 400.
std::vector<int32_t> apply_chat_template(const nlohmann::json& messages, const ApiContext& ctx);
// The Jinja template's prompt text for a chat request body (its messages, tools and
// template variables in the order sent); throws ApiException (400) naming the field.
std::string render_chat_template(const std::string& body, const ApiContext& ctx);

// vLLM's helpers. POST /tokenize: {"prompt": string, "add_special_tokens": bool (default
// true)} or a chat body ({"messages", "tools", "add_generation_prompt",
// "chat_template_kwargs"}: the prompt the chat endpoint would run) -> {"tokens": [ids],
// "count": n, "max_model_len": context}. POST /detokenize: {"tokens": [ids]} ->
// {"prompt": text} (special tokens kept). Bad bodies throw ApiException (400).
std::string tokenize_response(const std::string& body, const ApiContext& ctx);
std::string detokenize_response(const std::string& body, const ApiContext& ctx);

// vLLM's runtime adapter routes. POST /v1/load_lora_adapter: {"lora_name": string,
// "lora_path": directory}; POST /v1/unload_lora_adapter: {"lora_name": string} (vLLM's
// "lora_int_id" accepted and ignored). Other fields and bad types throw ApiException (400).
struct LoraAdapterRequest {
  std::string name;
  std::string path;  // load only
};
LoraAdapterRequest parse_lora_adapter_request(const std::string& body, bool load);

// Everything a finished (or streaming) request has produced so far.
struct Completion {
  std::string id;
  int64_t created = 0;
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  // The text each token added to `text` (what the stream sent with it; text released
  // later, such as a character completed by a following token, counts for that token):
  // these concatenate to `text`, as OpenAI's logprobs tokens do.
  std::vector<std::string> token_texts;
  FinishReason finish = FinishReason::kNone;
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};

nlohmann::json usage_json(const Completion& c);
// Whole (non-streaming) responses.
std::string completion_response(const ApiRequest& r, const Completion& c, const ApiContext& ctx);
// One server-sent event ("data: {...}\n\n") for a token (its text, and the finish reason
// when it is the last), the usage chunk, and the end marker.
// A chat stream whose reply is parsed into tool calls (r.tools.parse): the events of one
// token, its text fed to `parser`: a chunk per content or tool-call delta that became
// final (none while text is held back, unless it is the first event, which carries the
// role, or logprobs were asked for), and on the last token a chunk of its own with the
// finish reason ("tool_calls" when a call was made and the reply ended by itself).
std::string stream_tool_event(const ApiRequest& r, const Completion& c, const TokenEvent& ev,
                              bool first, ToolCallStream& parser, const ApiContext& ctx);
std::string stream_token_event(const ApiRequest& r, const Completion& c, const TokenEvent& ev,
                               bool first, const ApiContext& ctx);
std::string stream_usage_event(const ApiRequest& r, const Completion& c, const ApiContext& ctx);
std::string stream_error_event(const ApiError& e);
inline const char* kStreamDone = "data: [DONE]\n\n";

}  // namespace hyperion::serve
