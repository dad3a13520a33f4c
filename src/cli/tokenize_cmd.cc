// hyperion tokenize: text -> ids and pieces with any supported tokenizer, for checking a
// tokenizer (or a chat template) by hand.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/error.h"
#include "base/timer.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/tokenizer_path.h"
#include "io/atomic_file.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace hyperion::cli {

const CommandSpec kTokenizeSpec = {
    "tokenize",
    "",
    "encode text with a tokenizer and show the ids and pieces",
    {{"tokenizer", "PATH",
      "tokenizer.json, a SentencePiece .model, or a directory holding one (a checkpoint, a "
      "dataset, a Hugging Face model directory, a training run)",
      true},
     {"text", "T", "the text to encode"},
     {"file", "F", "encode the contents of this file instead (- for standard input)"},
     {"chat", "F",
      "render the tokenizer's chat template for the conversation in this JSON file ({messages, "
      "tools, add_generation_prompt, other template variables}) and encode the result"},
     {"batch", "F",
      "encode each line of this JSON Lines file (a JSON string per line); prints one "
      "{ids, decoded} object per line"},
     {"special", "", "add the special tokens the tokenizer adds (BOS for Llama and Gemma)"},
     {"json", "",
      "print {ids, pieces, tokens, bytes, decoded, load_seconds, encode_seconds, "
      "mb_per_second} as one JSON object"}},
    "Exactly one of --text, --file, --chat and --batch. With --chat, --json adds `text` (the "
    "rendered\nprompt), encoded without added special tokens (the template writes them). "
    "Special-token strings in the text (\"<|eot_id|>\") "
    "are\nthose tokens with a tokenizer.json. `decoded` is decode(ids) with special tokens "
    "kept.",
    "tokenize --tokenizer models/llama3 --text 'Hello, world!' --json"};

namespace {

int tokenize_batch(const Flags& f) {
  const std::string path = f.get("batch");
  const std::string all = io::read_file(path);
  const text::Tokenizer tok = text::Tokenizer::load(tokenizer_path(f.get("tokenizer"), "tokenize"));
  size_t line_no = 0;
  for (size_t pos = 0; pos < all.size();) {
    size_t end = all.find('\n', pos);
    if (end == std::string::npos) end = all.size();
    const std::string line = all.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json in;
    try {
      in = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      usage_fail("tokenize: {}:{}: not a JSON value: {}", path, line_no, e.what());
    }
    HYP_USAGE_CHECK(in.is_string(), "tokenize: {}:{}: expected a JSON string", path, line_no);
    const std::string text = in.get<std::string>();
    const std::vector<int32_t> ids =
        f.has("special") ? tok.encode_with_special_tokens(text) : tok.encode(text);
    const nlohmann::json out = {{"ids", ids}, {"decoded", tok.decode(ids, false)}};
    std::puts(out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  return 0;
}

int tokenize_chat(const Flags& f) {
  using ojson = nlohmann::ordered_json;
  const std::string path = f.get("chat");
  ojson request;
  try {
    request = ojson::parse(io::read_file(path));
  } catch (const nlohmann::json::exception& e) {
    usage_fail("tokenize: --chat {}: not valid JSON: {}", path, e.what());
  }
  HYP_USAGE_CHECK(
      request.is_object() && request.contains("messages") && request["messages"].is_array(),
      "tokenize: --chat {}: expected an object with a \"messages\" list", path);
  const text::Tokenizer tok = text::Tokenizer::load(tokenizer_path(f.get("tokenizer"), "tokenize"));
  const std::optional<text::ChatTemplate> chat = text::ChatTemplate::of(tok);
  HYP_CHECK(chat.has_value(),
            "tokenize: {} has no chat template (tokenizer_config.json's chat_template)",
            tok.origin());
  ojson kwargs = ojson::object();
  text::ChatTemplate::Input in;
  in.messages = &request["messages"];
  for (const auto& [key, value] : request.items()) {
    if (key == "tools") {
      if (!value.is_null()) in.tools = &value;
    } else if (key == "add_generation_prompt") {
      HYP_USAGE_CHECK(value.is_boolean(),
                      "tokenize: --chat {}: add_generation_prompt must be true or false", path);
      in.add_generation_prompt = value.get<bool>();
    } else if (key != "messages") {
      kwargs[key] = value;
    }
  }
  in.kwargs = &kwargs;
  const std::string text = chat->render(in);
  const std::vector<int32_t> ids = tok.encode(text);
  if (f.has("json")) {
    const nlohmann::json j = {
        {"template", chat->origin()}, {"text", text}, {"ids", ids}, {"tokens", ids.size()}};
    std::puts(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("%s\n(%zu tokens)\n", text.c_str(), ids.size());
  }
  return 0;
}

// One JSON value as nlohmann writes it; a piece of a byte-level vocabulary may be partial
// UTF-8: replaced, never an exception.
std::string json_text(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The --json object, written as it is made: a large input's ids and pieces never become a
// JSON tree (about 60 bytes a token), so memory stays a small multiple of the input. Keys
// in the order nlohmann::json gives them, as before.
void write_tokenize_json(const text::Tokenizer& tok, const std::string& text,
                         const std::vector<int32_t>& ids, double load_seconds,
                         double encode_seconds, double mb_per_second) {
  std::FILE* out = stdout;
  auto put = [out](std::string_view s) {
    HYP_CHECK(std::fwrite(s.data(), 1, s.size(), out) == s.size(),
              "tokenize: writing the output failed (disk full, or the reader went away)");
  };
  put(fmt::format("{{\"bytes\":{},\"decoded\":\"", text.size()));
  {
    // Escaped 64 KB at a time (cut between characters), not as one more copy of the text.
    const std::string decoded = tok.decode(ids, false);
    const std::string_view d = decoded;
    for (size_t b = 0; b < d.size();) {
      size_t e = std::min(d.size(), b + (size_t{1} << 16));
      for (int k = 0; k < 3 && e < d.size() && e > b + 1 && (uint8_t(d[e]) & 0xC0) == 0x80; ++k) --e;
      const std::string part = json_text(std::string(d.substr(b, e - b)));
      put(std::string_view(part).substr(1, part.size() - 2));  // without its quotes
      b = e;
    }
  }
  put("\"");
  put(fmt::format(",\"encode_seconds\":{},\"format\":{},\"ids\":[", json_text(encode_seconds),
                  json_text(tok.format())));
  std::string chunk;
  auto flush_if_full = [&]() {
    if (chunk.size() < (1u << 16)) return;
    put(chunk);
    chunk.clear();
  };
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) chunk += ',';
    chunk += std::to_string(ids[i]);
    flush_if_full();
  }
  chunk += fmt::format("],\"load_seconds\":{},\"mb_per_second\":{},\"pieces\":[",
                       json_text(load_seconds), json_text(mb_per_second));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) chunk += ',';
    chunk += json_text(tok.id_to_piece(ids[i]));
    flush_if_full();
  }
  chunk += fmt::format("],\"tokenizer\":{},\"tokens\":{},\"vocab_size\":{}}}\n",
                       json_text(tok.origin()), ids.size(), tok.vocab_size());
  put(chunk);
  HYP_CHECK(std::fflush(out) == 0,
            "tokenize: writing the output failed (disk full, or the reader went away)");
}

}  // namespace

int cmd_tokenize(const Args& args) {
  const Flags f(kTokenizeSpec, args);
  HYP_USAGE_CHECK(f.positional().empty(), "tokenize: unexpected argument '{}'", f.positional()[0]);
  HYP_USAGE_CHECK(f.has("tokenizer"), "tokenize: --tokenizer PATH is required");
  HYP_USAGE_CHECK(
      int(f.has("text")) + int(f.has("file")) + int(f.has("batch")) + int(f.has("chat")) == 1,
      "tokenize: give exactly one of --text, --file, --chat and --batch");
  if (f.has("batch")) return tokenize_batch(f);
  if (f.has("chat")) return tokenize_chat(f);
  std::string text;
  if (f.has("text")) {
    text = f.get("text");
  } else if (f.get("file") == "-") {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  } else {
    text = io::read_file(f.get("file"));
  }

  Timer load_timer;
  const text::Tokenizer tok = text::Tokenizer::load(tokenizer_path(f.get("tokenizer"), "tokenize"));
  const double load_seconds = load_timer.seconds();
  Timer encode_timer;
  const std::vector<int32_t> ids =
      f.has("special") ? tok.encode_with_special_tokens(text) : tok.encode(text);
  const double encode_seconds = encode_timer.seconds();
  const double mb_per_second =
      encode_seconds > 0 ? static_cast<double>(text.size()) / 1e6 / encode_seconds : 0.0;

  if (f.has("json")) {
    write_tokenize_json(tok, text, ids, load_seconds, encode_seconds, mb_per_second);
    return 0;
  }
  std::printf("%zu tokens from %zu bytes (%s %s, vocabulary %d; load %.3f s, encode %.3f s)\n",
              ids.size(), text.size(), tok.format(), tok.origin().c_str(), tok.vocab_size(),
              load_seconds, encode_seconds);
  for (int32_t id : ids) {
    const std::string piece = nlohmann::json(tok.id_to_piece(id))
                                  .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    std::printf("%8d  %s\n", id, piece.c_str());
  }
  return 0;
}

}  // namespace hyperion::cli
