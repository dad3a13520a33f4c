// libFuzzer: the OpenAI request parser (completions and chat, every field, invalid JSON
// and UTF-8 located by field), with a real tokenizer, and the response writers on
// whatever it accepts: every byte written back must be valid JSON.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "serve/openai_api.h"
#include "text/tokenizer.h"

namespace {

const hyperion::text::Tokenizer* g_tokenizer = nullptr;

void check_json(const std::string& text) {
  if (!nlohmann::json::accept(text)) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // A small tokenizer trained once on a few lines (deterministic, no file needed).
  std::vector<std::string> docs;
  for (int i = 0; i < 200; ++i)
    docs.push_back("The quick brown fox " + std::to_string(i) +
                   " jumps over the lazy dog; caf\xc3\xa9 \xe2\x82\xac " + std::to_string(i * 7));
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("hyperion-fuzz-" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(dir);
  hyperion::text::TokenizerTrainOptions o;
  o.vocab_size = 300;
  g_tokenizer =
      new hyperion::text::Tokenizer(hyperion::text::Tokenizer::train(docs, dir + "/t.model", o));
  std::filesystem::remove_all(dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hyperion::serve;
  if (size == 0) return 0;
  ApiContext ctx;
  ctx.tokenizer = g_tokenizer;
  ctx.model_name = "fuzz-model";
  ctx.chat_template = data[0] & 2 ? "llama2" : "plain";
  ctx.context_tokens = 64;
  ctx.max_prompt_bytes = prompt_byte_bound(*g_tokenizer, 64);
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    const ApiRequest r =
        data[0] & 1 ? parse_chat_request(body, ctx) : parse_completion_request(body, ctx);
    // The writers, on a completion made of the request's own prompt tokens and bytes.
    Completion c;
    c.id = "cmpl-1";
    for (const int32_t t : r.gen.prompt)
      if (t >= 0 && t < g_tokenizer->vocab_size()) c.tokens.push_back(t), c.logprobs.push_back(-1);
    c.text = body.substr(0, 64);  // arbitrary bytes, maybe cut inside a character
    c.finish = FinishReason::kLength;
    check_json(completion_response(r, c, ctx));
    TokenEvent ev;
    ev.token = c.tokens.empty() ? -1 : c.tokens.back();
    ev.text = c.text;
    ev.finish = FinishReason::kStop;
    const std::string sse = stream_token_event(r, c, ev, true, ctx);
    check_json(sse.substr(6, sse.size() - 8));  // "data: {...}\n\n"
  } catch (const ApiException& e) {
    if (e.error.status != 400 && e.error.status != 404) __builtin_trap();
    check_json(error_body(e.error));
  } catch (const hyperion::Error&) {
    // (the HTTP layer answers these with a 400 as well)
  }
  return 0;
}
