#include "serve/openai_api.h"

#include <fmt/format.h>

#include <cmath>
#include <set>

#include "base/error.h"
#include "model/sampler.h"
#include "serve/api_fields.h"
#include "serve/structured_output.h"

namespace hyperion::serve {

using nlohmann::json;

namespace {

// Fields both endpoints share; returns false for a key it does not know.
bool parse_common(const json& j, const std::string& key, const ApiContext& ctx, ApiRequest& r) {
  GenerationRequest& g = r.gen;
  if (key == "model") {
    if (!j[key].is_string())
      bad("model", fmt::format("'model' must be a string, got {}", type_name(j[key])));
    g.adapter = resolve_model(j[key].get<std::string>(), ctx);
  } else if (key == "max_tokens" || key == "max_completion_tokens") {
    // Both are checked; given both, the newer max_completion_tokens wins (as vLLM and
    // OpenAI, where max_tokens is deprecated), whatever the order of the keys.
    if (!j[key].is_null()) {
      const int64_t n = get_int(j, key.c_str(), 1, INT32_MAX);
      const auto newer = j.find("max_completion_tokens");
      if (key == "max_completion_tokens" || newer == j.end() || newer->is_null())
        g.max_tokens = n;
    }
  } else if (key == "temperature") {
    if (!j[key].is_null()) {
      const double t = get_number(j, "temperature");
      if (const std::string e = temperature_error(t); !e.empty()) bad(key, "'temperature' " + e);
      g.sampling.temperature = static_cast<float>(t);
    }
  } else if (key == "top_p") {
    if (!j[key].is_null()) {
      const double p = get_number(j, "top_p");
      if (const std::string e = top_p_error(p); !e.empty()) bad(key, "'top_p' " + e);
      g.sampling.top_p = static_cast<float>(p);
    }
  } else if (key == "top_k") {
    if (!j[key].is_null()) {
      const int64_t k = get_int(j, "top_k", INT64_MIN, INT64_MAX);
      if (const std::string e = top_k_error(k); !e.empty()) bad(key, "'top_k' " + e);
      g.sampling.top_k = top_k_param(k);  // -1 = off, as in vLLM
    }
  } else if (key == "seed") {
    if (!j[key].is_null()) {
      const json& v = j[key];
      if (!v.is_number_integer() && !v.is_number_unsigned())
        bad(key, fmt::format("'seed' must be an integer, got {}", type_name(v)));
      g.sampling.seed =
          v.is_number_unsigned() ? v.get<uint64_t>() : static_cast<uint64_t>(v.get<int64_t>());
    }
  } else if (key == "stop") {
    const json& v = j[key];
    if (v.is_null()) return true;
    if (v.is_string()) {
      g.stop.push_back(v.get<std::string>());
    } else if (v.is_array()) {
      if (v.size() > 4) bad(key, fmt::format("'stop' holds at most 4 strings, got {}", v.size()));
      for (const json& s : v) {
        if (!s.is_string())
          bad(key, fmt::format("'stop' entries must be strings, got {}", type_name(s)));
        g.stop.push_back(s.get<std::string>());
      }
    } else {
      bad(key, fmt::format("'stop' must be a string or an array of strings, got {}", type_name(v)));
    }
  } else if (key == "stream") {
    if (!j[key].is_null()) r.stream = get_bool(j, "stream");
  } else if (key == "stream_options") {
    const json& v = j[key];
    if (v.is_null()) return true;
    if (!v.is_object())
      bad(key, fmt::format("'stream_options' must be an object, got {}", type_name(v)));
    for (const auto& [k, val] : v.items()) {
      if (k != "include_usage")
        bad("stream_options." + k, fmt::format("unknown field 'stream_options.{}'", k));
      if (!val.is_boolean())
        bad("stream_options.include_usage", "'stream_options.include_usage' must be a boolean");
      r.include_usage = val.get<bool>();
    }
  } else if (key == "n") {
    if (!j[key].is_null() && get_int(j, "n", 1, INT32_MAX) != 1)
      bad(key, "only n = 1 is supported (send separate requests; they are batched)");
  } else if (key == "user") {
    if (!j[key].is_string() && !j[key].is_null()) bad(key, "'user' must be a string");
  } else if (key == "presence_penalty" || key == "frequency_penalty") {
    if (!j[key].is_null() && get_number(j, key.c_str()) != 0.0)
      bad(key, fmt::format("'{}' is not supported (only 0)", key));
  } else if (key == "ignore_eos") {
    g.ignore_eos = get_bool(j, "ignore_eos");
  } else if (is_structured_output_field(key)) {
    r.structured = r.structured || !j[key].is_null();  // read with the body's key order
  } else {
    return false;
  }
  return true;
}

// A text longer than this cannot fit the context whatever its tokens: refuse it before
// spending time and memory tokenizing it.
void check_text_bytes(const ApiContext& ctx, size_t bytes, const char* param) {
  if (ctx.max_prompt_bytes > 0 && bytes > ctx.max_prompt_bytes)
    bad(param, fmt::format("the prompt is {} bytes; a prompt over {} bytes cannot fit the "
                           "context of {} tokens",
                           bytes, ctx.max_prompt_bytes, ctx.context_tokens));
}

std::vector<int32_t> encode_with_bos(const ApiContext& ctx, const std::string& text) {
  if (ctx.tokenizer == nullptr) bad("prompt", "this server has no tokenizer: send token ids");
  check_text_bytes(ctx, text.size(), "prompt");
  // BOS where the tokenizer adds one (Llama, Gemma; not Qwen), as Hugging Face's
  // encode(add_special_tokens=True) and vLLM's completions do.
  std::vector<int32_t> ids = ctx.tokenizer->encode_with_special_tokens(text);
  if (ids.empty()) bad("prompt", "the prompt is empty and this tokenizer adds no BOS token");
  return ids;
}

// The grammar of the body's structured-output fields, if it has any.
void read_grammar(const std::string& body, const json& j, const ApiContext& ctx, ApiRequest& r) {
  // Bounded before the body is parsed again keeping key order (here, and for the chat
  // template's tools), whose objects insert in time linear in their size: 10^5 properties
  // would cost minutes.
  for (const auto& [key, value] : j.items())
    if (is_structured_output_field(key) || key == "tools") check_structured_output_size(key, value);
  if (!r.structured) return;
  const StructuredOutput out = read_structured_output(nlohmann::ordered_json::parse(body));
  r.gen.grammar = compile_structured_output(out, ctx.grammars.get());
}

// tools, tool_choice and parallel_tool_calls (serve/tool_calls.h): whether the reply is parsed
// into tool calls, and for tool_choice "required" or a named function the grammar that
// forces one. "none" parses nothing, though the template still sees the tools (vLLM's
// default; OpenAI's model just does not call them).
void read_tool_request(const std::string& body, const json& j, const ApiContext& ctx, ApiRequest& r) {
  const auto given = [&j](const char* key) { return j.contains(key) && !j[key].is_null(); };
  if (!given("tools") && !given("tool_choice")) return;
  const nlohmann::ordered_json o = nlohmann::ordered_json::parse(body);  // schemas keep their order
  ToolRequest& t = r.tools;
  if (given("tools")) t.names = read_tools(o["tools"]);
  t.choice.mode = t.names.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
  if (given("tool_choice")) t.choice = read_tool_choice(o["tool_choice"], t.names);
  t.syntax = ctx.tools;
  const bool forced = t.choice.mode == ToolChoice::kRequired || t.choice.mode == ToolChoice::kNamed;
  if (forced) {
    const std::string what =
        t.choice.mode == ToolChoice::kNamed ? "naming a function" : "\"required\"";
    if (ctx.tools.format == ToolFormat::kNone)
      bad("tool_choice",
          fmt::format("'tool_choice' {} forces a tool call, but this model's chat template teaches no "
                      "tool-call format (read: Llama 3.1 JSON, Qwen's <tool_call>, Mistral's [TOOL_CALLS], "
                      "Gemma's JSON); use tool_choice \"auto\" or a chat_template that teaches one",
                      what));
    if (r.gen.grammar)
      bad("tool_choice", fmt::format("'tool_choice' {} and a structured-output field (response_format, "
                                     "guided_*) both constrain the output; send one",
                                     what));
    if (!ctx.grammars) bad("tool_choice", "forcing a tool call needs a tokenizer; this server has none");
    const std::string gbnf = tool_call_gbnf(ctx.tools, o["tools"], t.choice, t.parallel);
    try {
      r.gen.grammar = ctx.grammars->get(gbnf);
    } catch (const text::GrammarError& e) {
      bad("tools", fmt::format("the grammar of the tool calls does not compile for this model: {}", e.what()));
    }
  }
  t.parse = t.choice.mode != ToolChoice::kNone && !t.names.empty() && ctx.tools.format != ToolFormat::kNone;
  // Markers that are special tokens must reach the parser as text.
  if (t.parse && ctx.tools.needs_special_text()) r.gen.keep_special_text = true;
}

void check_stream_options(const json& j, const ApiRequest& r) {
  if (j.contains("stream_options") && !j["stream_options"].is_null() && !r.stream)
    bad("stream_options", "'stream_options' is only allowed with stream: true");
}

}  // namespace

size_t prompt_byte_bound(const text::Tokenizer& tokenizer, int64_t context_tokens) {
  return static_cast<size_t>(std::max<int64_t>(context_tokens, 1)) *
         std::max<size_t>(tokenizer.max_piece_bytes(), 4) * 2;
}

std::string error_body(const ApiError& e) {
  json j;
  j["error"] = {{"message", e.message},
                {"type", e.type},
                {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                {"code", e.status}};
  return dump(j);
}

ApiRequest parse_completion_request(const std::string& body, const ApiContext& ctx) {
  const json j = parse_body(body);
  ApiRequest r;
  bool have_prompt = false;
  for (const auto& [key, value] : j.items()) {
    if (parse_common(j, key, ctx, r)) continue;
    if (key == "prompt") {
      have_prompt = true;
      if (value.is_string()) {
        r.gen.prompt = encode_with_bos(ctx, value.get<std::string>());
      } else if (value.is_array() && value.size() == 1 && value[0].is_string()) {
        r.gen.prompt = encode_with_bos(ctx, value[0].get<std::string>());
      } else if (value.is_array() && !value.empty() && value[0].is_number()) {
        if (ctx.context_tokens > 0 && static_cast<int64_t>(value.size()) >= ctx.context_tokens)
          bad("prompt", fmt::format("the prompt is {} tokens; the context is {} (at least one "
                                    "position must remain for the output)",
                                    value.size(), ctx.context_tokens));
        for (const json& t : value) {
          if (!t.is_number_integer() && !t.is_number_unsigned())
            bad("prompt", "a token-id prompt must hold only integers");
          const int64_t id = t.get<int64_t>();
          if (id < 0 || id > INT32_MAX)
            bad("prompt", fmt::format("token id {} is out of range", id));
          r.gen.prompt.push_back(static_cast<int32_t>(id));
        }
      } else {
        bad("prompt",
            "'prompt' must be a string, an array of one string, or a non-empty array of "
            "token ids (batches of prompts: send separate requests)");
      }
    } else if (key == "logprobs") {
      if (!value.is_null()) r.logprobs = static_cast<int>(get_int(j, "logprobs", 0, 5));
    } else if (key == "echo") {
      if (!value.is_null() && get_bool(j, "echo")) bad("echo", "'echo' is not supported");
    } else {
      bad(key, fmt::format("unknown field '{}'", key));
    }
  }
  if (!have_prompt) bad("prompt", "'prompt' is required");
  check_stream_options(j, r);
  read_grammar(body, j, ctx, r);
  r.gen.logprobs = r.logprobs >= 0;
  return r;
}

std::vector<int32_t> apply_chat_template(const json& messages, const ApiContext& ctx) {
  if (ctx.tokenizer == nullptr) bad("messages", "this server has no tokenizer for chat");
  size_t bytes = 0;
  for (const json& m : messages) bytes += m["content"].get_ref<const std::string&>().size();
  check_text_bytes(ctx, bytes, "messages");
  const text::Tokenizer& tok = *ctx.tokenizer;
  std::vector<int32_t> ids;
  if (tok.bos_id() >= 0) ids.push_back(tok.bos_id());
  auto append = [&](const std::string& text) {
    const std::vector<int32_t> enc = tok.encode(text);
    ids.insert(ids.end(), enc.begin(), enc.end());
  };
  if (ctx.chat_template == "llama2") {
    std::string system;
    bool open = false;  // an [INST] waiting for its answer
    for (const json& m : messages) {
      const std::string role = m["role"].get<std::string>(),
                        content = m["content"].get<std::string>();
      if (role == "system") {
        system = content;
      } else if (role == "user") {
        std::string text = "[INST] ";
        if (!system.empty()) text += "<<SYS>>\n" + system + "\n<</SYS>>\n\n";
        system.clear();
        append(text + content + " [/INST]");
        open = true;
      } else {
        append(" " + content + " ");
        if (tok.eos_id() >= 0) ids.push_back(tok.eos_id());
        if (tok.bos_id() >= 0) ids.push_back(tok.bos_id());
        open = false;
      }
    }
    (void)open;
    return ids;
  }
  std::string text;
  for (const json& m : messages) {
    const std::string role = m["role"].get<std::string>();
    const char* label = role == "system" ? "System" : role == "user" ? "User" : "Assistant";
    text += fmt::format("{}: {}\n", label, m["content"].get<std::string>());
  }
  text += "Assistant:";
  append(text);
  return ids;
}

namespace {

// A message's content for a Jinja template: a string, null, or text parts.
void check_content(const json& v, const std::string& where, bool jinja) {
  if (v.is_string()) return;
  if (!jinja) bad(where, fmt::format("'{}' must be a string", where));
  if (v.is_null()) return;
  if (!v.is_array())
    bad(where, fmt::format("'{}' must be a string, null or an array of parts", where));
  for (size_t p = 0; p < v.size(); ++p) {
    const std::string part = fmt::format("{}[{}]", where, p);
    if (!v[p].is_object() || v[p].value("type", "") != "text" || !v[p].contains("text") ||
        !v[p]["text"].is_string())
      bad(part, fmt::format("'{}' must be {{\"type\": \"text\", \"text\": string}} (only text "
                            "parts are supported)",
                            part));
  }
}

void check_messages(const json& value, bool jinja) {
  if (!value.is_array() || value.empty()) bad("messages", "'messages' must be a non-empty array");
  for (size_t i = 0; i < value.size(); ++i) {
    const json& m = value[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad(where, fmt::format("'{}' must be an object", where));
    for (const auto& [k, v] : m.items()) {
      const std::string field = where + "." + k;
      if (k == "role") {
        const bool known = v.is_string() && (v == "system" || v == "user" || v == "assistant" ||
                                             (jinja && v == "tool"));
        if (!known)
          bad(field, fmt::format("'{}' must be system, user{}", field,
                                 jinja ? ", assistant or tool" : " or assistant"));
      } else if (k == "content") {
        check_content(v, field, jinja);
      } else if (k == "name" || (jinja && (k == "tool_call_id" || k == "reasoning_content"))) {
        if (!v.is_string()) bad(field, fmt::format("'{}' must be a string", field));
      } else if (jinja && k == "tool_calls") {
        if (!v.is_array()) bad(field, fmt::format("'{}' must be an array", field));
      } else {
        bad(field, fmt::format("unknown field '{}'", field));
      }
    }
    const bool tool_call = jinja && m.contains("tool_calls");
    if (!m.contains("role") || (!m.contains("content") && !tool_call))
      bad(where, fmt::format("'{}' needs 'role' and 'content'", where));
  }
}

}  // namespace

std::string render_chat_template(const std::string& body, const ApiContext& ctx) {
  using ojson = nlohmann::ordered_json;
  // Parsed again keeping key order: templates print tool schemas and arguments with tojson.
  ojson j = ojson::parse(body);
  ojson messages = j["messages"];
  for (size_t i = 0; i < messages.size(); ++i) {
    ojson& m = messages[i];
    // OpenAI sends tool-call arguments as a JSON string; templates expect the object (as
    // vLLM gives them: Llama 3.1's prints it with tojson).
    if (m.contains("tool_calls") && m["tool_calls"].is_array()) {
      // An assistant turn of calls only comes back from OpenAI clients with content null;
      // templates read it as text (Qwen's tests '</think>' in it), so it is "" (as vLLM).
      if (!m.contains("content") || m["content"].is_null()) m["content"] = "";
      for (size_t k = 0; k < m["tool_calls"].size(); ++k) {
        ojson& call = m["tool_calls"][k];
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
          continue;
        ojson& args = call["function"]["arguments"];
        if (!args.is_string()) continue;
        try {
          args = ojson::parse(args.get<std::string>());
        } catch (const nlohmann::json::exception&) {
          bad(fmt::format("messages[{}].tool_calls[{}].function.arguments", i, k),
              "tool-call arguments must be a JSON object (as a string or an object)");
        }
      }
    }
    if (!m.contains("content") || !m["content"].is_array()) continue;
    std::string text;
    for (const ojson& part : m["content"])
    {
      if (!text.empty()) text += '\n';
      text += part["text"].get<std::string>();
    }
    m["content"] = text;
  }
  text::ChatTemplate::Input in;
  in.messages = &messages;
  if (j.contains("tools") && !j["tools"].is_null()) in.tools = &j["tools"];
  if (j.contains("chat_template_kwargs")) in.kwargs = &j["chat_template_kwargs"];
  if (j.contains("add_generation_prompt")) in.add_generation_prompt = j["add_generation_prompt"];
  try {
    return ctx.jinja->render(in);
  } catch (const Error& e) {
    bad("messages", fmt::format("the chat template refused the conversation: {}", e.what()));
  }
}

ApiRequest parse_chat_request(const std::string& body, const ApiContext& ctx) {
  const json j = parse_body(body);
  ApiRequest r;
  r.chat = true;
  const bool jinja = ctx.chat_template == "jinja" && ctx.jinja != nullptr;
  const json* messages = nullptr;
  for (const auto& [key, value] : j.items()) {
    if (parse_common(j, key, ctx, r)) continue;
    if (key == "messages") {
      check_messages(value, jinja);
      messages = &value;
    } else if (key == "tools" || key == "tool_choice" || key == "add_generation_prompt" ||
               key == "chat_template_kwargs") {
      if (!jinja)
        bad(key, fmt::format("'{}' needs a model with a Jinja chat template (this server uses "
                             "chat_template {})",
                             key, ctx.chat_template));
      if (key == "tools" && !value.is_null() && !value.is_array())
        bad(key, "'tools' must be an array");
      if (key == "add_generation_prompt" && !value.is_boolean())
        bad(key, "'add_generation_prompt' must be true or false");
      if (key == "chat_template_kwargs" && !value.is_object())
        bad(key, "'chat_template_kwargs' must be an object");
    } else if (key == "parallel_tool_calls") {
      if (!value.is_null()) r.tools.parallel = get_bool(j, "parallel_tool_calls");
    } else if (key == "logprobs") {
      if (!value.is_null()) r.logprobs = get_bool(j, "logprobs") ? 1 : -1;
    } else if (key == "top_logprobs") {
      if (!value.is_null() && get_int(j, "top_logprobs", 0, 20) != 0)
        bad("top_logprobs", "only top_logprobs = 0 is supported");
    } else {
      bad(key, fmt::format("unknown field '{}'", key));
    }
  }
  if (messages == nullptr) bad("messages", "'messages' is required");
  check_stream_options(j, r);
  read_grammar(body, j, ctx, r);
  read_tool_request(body, j, ctx, r);
  if (jinja) {
    const std::string text = render_chat_template(body, ctx);
    check_text_bytes(ctx, text.size(), "messages");
    // The template writes the special tokens (BOS included): nothing is added.
    r.gen.prompt = ctx.tokenizer->encode(text);
    if (r.gen.prompt.empty()) bad("messages", "the chat template rendered an empty prompt");
  } else {
    r.gen.prompt = apply_chat_template(*messages, ctx);
  }
  // (Not with a grammar: its output ends where the grammar does, and a JSON string may
  // well hold "\nUser:".)
  if (ctx.chat_template == "plain" && !r.gen.grammar) r.gen.stop.push_back("\nUser:");
  r.gen.logprobs = r.logprobs >= 0;
  return r;
}

std::string tokenize_response(const std::string& body, const ApiContext& ctx) {
  if (ctx.tokenizer == nullptr) bad("prompt", "this server has no tokenizer");
  const json j = parse_body(body);
  std::vector<int32_t> ids;
  if (j.contains("messages")) {
    // The chat endpoint's own parsing and template, so the count is what chat would run
    // (the body kept in its key order: templates print tools with tojson).
    nlohmann::ordered_json chat = nlohmann::ordered_json::parse(body);
    chat.erase("add_special_tokens");
    ids = parse_chat_request(chat.dump(), ctx).gen.prompt;
  } else {
    bool special = true;
    std::string text;
    bool have = false;
    for (const auto& [key, value] : j.items()) {
      if (key == "prompt") {
        if (!value.is_string()) bad("prompt", "'prompt' must be a string");
        text = value.get<std::string>();
        have = true;
      } else if (key == "add_special_tokens") {
        if (!value.is_boolean()) bad(key, "'add_special_tokens' must be true or false");
        special = value.get<bool>();
      } else if (key == "model") {
        if (!value.is_string()) bad("model", "'model' must be a string");
        resolve_model(value.get<std::string>(), ctx);
      } else {
        bad(key, fmt::format("unknown field '{}'", key));
      }
    }
    if (!have) bad("prompt", "'prompt' or 'messages' is required");
    check_text_bytes(ctx, text.size(), "prompt");
    try {
      ids = special ? ctx.tokenizer->encode_with_special_tokens(text) : ctx.tokenizer->encode(text);
    } catch (const Error& e) {
      bad("prompt", e.what());
    }
  }
  return dump(json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", ctx.context_tokens}});
}

std::string detokenize_response(const std::string& body, const ApiContext& ctx) {
  if (ctx.tokenizer == nullptr) bad("tokens", "this server has no tokenizer");
  const json j = parse_body(body);
  std::vector<int32_t> ids;
  for (const auto& [key, value] : j.items()) {
    if (key == "tokens") {
      if (!value.is_array()) bad("tokens", "'tokens' must be an array of token ids");
      for (const json& t : value) {
        if (!t.is_number_integer()) bad("tokens", "'tokens' must hold only integers");
        const int64_t id = t.get<int64_t>();
        if (id < 0 || id >= ctx.tokenizer->vocab_size())
          bad("tokens", fmt::format("token id {} is outside the vocabulary [0, {})", id,
                                    ctx.tokenizer->vocab_size()));
        ids.push_back(static_cast<int32_t>(id));
      }
    } else if (key != "model") {
      bad(key, fmt::format("unknown field '{}'", key));
    }
  }
  if (!j.contains("tokens")) bad("tokens", "'tokens' is required");
  return dump(json{{"prompt", ctx.tokenizer->decode(ids, false)}});
}

json usage_json(const Completion& c) {
  json u;
  u["prompt_tokens"] = c.prompt_tokens;
  u["completion_tokens"] = c.completion_tokens;
  u["total_tokens"] = c.prompt_tokens + c.completion_tokens;
  u["prompt_tokens_details"] = {{"cached_tokens", c.cached_tokens}};
  return u;
}

namespace {

json finish_json(FinishReason f) {
  if (f == FinishReason::kNone) return nullptr;
  return finish_reason_name(f);
}

// The text token i added (see Completion::token_texts).
const std::string& token_text(const Completion& c, size_t i) {
  static const std::string none;
  return i < c.token_texts.size() ? c.token_texts[i] : none;
}

json utf8_bytes(const std::string& text) {
  json out = json::array();
  for (const unsigned char b : text) out.push_back(static_cast<int>(b));
  return out;
}

json completion_logprobs(const Completion& c) {
  json lp;
  json tokens = json::array(), values = json::array(), offsets = json::array();
  size_t offset = 0;
  for (size_t i = 0; i < c.tokens.size(); ++i) {
    tokens.push_back(token_text(c, i));
    values.push_back(i < c.logprobs.size() ? c.logprobs[i] : 0.0f);
    offsets.push_back(offset);
    offset += token_text(c, i).size();
  }
  lp["tokens"] = tokens;
  lp["token_logprobs"] = values;
  lp["top_logprobs"] = nullptr;
  lp["text_offset"] = offsets;
  return lp;
}

json chat_logprobs(const Completion& c, size_t from) {
  json content = json::array();
  for (size_t i = from; i < c.tokens.size(); ++i)
    content.push_back({{"token", token_text(c, i)},
                       {"logprob", i < c.logprobs.size() ? c.logprobs[i] : 0.0f},
                       {"bytes", utf8_bytes(token_text(c, i))},
                       {"top_logprobs", json::array()}});
  return {{"content", content}};
}

json envelope(const ApiRequest& r, const Completion& c, const ApiContext& ctx, bool chunk) {
  json j;
  j["id"] = c.id;
  j["object"] = r.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  j["created"] = c.created;
  j["model"] = r.gen.adapter ? r.gen.adapter->name : ctx.model_name;
  return j;
}

std::string sse(const json& j) {
  return "data: " + dump(j) + "\n\n";
}

}  // namespace

LoraRef resolve_model(const std::string& model, const ApiContext& ctx) {
  if (model == ctx.model_name) return nullptr;
  if (ctx.adapters != nullptr)
    if (LoraRef a = ctx.adapters->find(model)) return a;
  std::string served = fmt::format("'{}'", ctx.model_name);
  if (ctx.adapters != nullptr) {
    const std::vector<LoraRef> all = ctx.adapters->list();
    if (!all.empty()) served += all.size() == 1 ? " and the LoRA adapter" : " and the LoRA adapters";
    for (size_t i = 0; i < all.size(); ++i) served += fmt::format("{}'{}'", i == 0 ? " " : ", ", all[i]->name);
  }
  bad("model", fmt::format("the model '{}' does not exist; this server serves {}", model, served), 404);
}

LoraAdapterRequest parse_lora_adapter_request(const std::string& body, bool load) {
  const json j = parse_body(body);
  LoraAdapterRequest r;
  bool have_name = false, have_path = false;
  for (const auto& [key, value] : j.items()) {
    if (key == "lora_name" || (load && key == "lora_path")) {
      if (!value.is_string() || value.get<std::string>().empty())
        bad(key, fmt::format("'{}' must be a non-empty string", key));
      (key == "lora_name" ? r.name : r.path) = value.get<std::string>();
      (key == "lora_name" ? have_name : have_path) = true;
    } else if (key == "lora_int_id" || (load && key == "load_inplace" && value.is_boolean() && !value.get<bool>())) {
      // vLLM's: the engine numbers adapters itself; reloading in place is not offered.
    } else {
      bad(key, fmt::format("unknown field '{}'", key));
    }
  }
  if (!have_name) bad("lora_name", "'lora_name' is required");
  if (load && !have_path) bad("lora_path", "'lora_path' is required");
  if (r.name.size() > 256) bad("lora_name", "'lora_name' is longer than 256 bytes");
  return r;
}

std::string completion_response(const ApiRequest& r, const Completion& c, const ApiContext& ctx) {
  json j = envelope(r, c, ctx, false);
  json choice;
  choice["index"] = 0;
  choice["finish_reason"] = finish_json(c.finish);
  if (r.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    choice["logprobs"] = r.logprobs > 0 ? chat_logprobs(c, 0) : json(nullptr);
    if (r.tools.parse) {
      const ParsedReply p = parse_tool_calls(r.tools.syntax, r.tools.names, c.text);
      if (!p.calls.empty()) {
        // Only calls: content null, as OpenAI's.
        const bool blank = p.content.find_first_not_of(" \t\r\n") == std::string::npos;
        choice["message"]["content"] = blank ? json(nullptr) : json(p.content);
        json calls = json::array();
        for (const ToolCall& call : p.calls)
          calls.push_back({{"id", call.id},
                           {"type", "function"},
                           {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
        choice["message"]["tool_calls"] = calls;
        if (c.finish == FinishReason::kStop) choice["finish_reason"] = "tool_calls";
      }
    }
  } else {
    choice["text"] = c.text;
    choice["logprobs"] = r.logprobs >= 0 ? completion_logprobs(c) : json(nullptr);
  }
  j["choices"] = json::array({choice});
  j["usage"] = usage_json(c);
  return dump(j);
}

std::string stream_tool_event(const ApiRequest& r, const Completion& c, const TokenEvent& ev,
                              bool first, ToolCallStream& parser, const ApiContext& ctx) {
  std::vector<ToolDelta> deltas;
  parser.feed(ev.text, deltas);
  const bool last = ev.finish != FinishReason::kNone;
  if (last) parser.finish(deltas);
  bool logprobs = r.logprobs > 0 && ev.token >= 0;  // on this token's first chunk
  std::string out;
  const auto chunk = [&](json delta, json finish) {
    json j = envelope(r, c, ctx, true);
    if (first) delta["role"] = "assistant";
    first = false;
    json choice;
    choice["index"] = 0;
    choice["delta"] = std::move(delta);
    choice["logprobs"] = logprobs ? chat_logprobs(c, c.tokens.size() - 1) : json(nullptr);
    logprobs = false;
    choice["finish_reason"] = std::move(finish);
    j["choices"] = json::array({choice});
    if (r.include_usage) j["usage"] = nullptr;
    out += sse(j);
  };
  for (const ToolDelta& d : deltas) {
    if (d.kind == ToolDelta::kContent)
      chunk({{"content", d.text}}, nullptr);
    else
      chunk({{"tool_calls", json::array({tool_delta_json(d)})}}, nullptr);
  }
  if (deltas.empty() && (first || logprobs)) chunk({{"content", ""}}, nullptr);
  if (last) {
    json finish = finish_json(ev.finish);
    if (parser.calls() > 0 && ev.finish == FinishReason::kStop) finish = "tool_calls";
    chunk(json::object(), finish);
  }
  return out;
}

std::string stream_token_event(const ApiRequest& r, const Completion& c, const TokenEvent& ev,
                               bool first, const ApiContext& ctx) {
  json j = envelope(r, c, ctx, true);
  json choice;
  choice["index"] = 0;
  const bool has_token = ev.token >= 0;
  if (r.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    delta["content"] = ev.text;
    choice["delta"] = delta;
    choice["logprobs"] =
        r.logprobs > 0 && has_token ? chat_logprobs(c, c.tokens.size() - 1) : json(nullptr);
  } else {
    choice["text"] = ev.text;
    if (r.logprobs >= 0 && has_token) {
      choice["logprobs"] = {{"tokens", {ev.text}},
                            {"token_logprobs", {ev.logprob}},
                            {"top_logprobs", nullptr},
                            {"text_offset", {c.text.size() - ev.text.size()}}};
    } else {
      choice["logprobs"] = nullptr;
    }
  }
  choice["finish_reason"] = finish_json(ev.finish);
  j["choices"] = json::array({choice});
  if (r.include_usage) j["usage"] = nullptr;
  return sse(j);
}

std::string stream_usage_event(const ApiRequest& r, const Completion& c, const ApiContext& ctx) {
  json j = envelope(r, c, ctx, true);
  j["choices"] = json::array();
  j["usage"] = usage_json(c);
  return sse(j);
}

std::string stream_error_event(const ApiError& e) {
  return "data: " + error_body(e) + "\n\n";
}

}  // namespace hyperion::serve
