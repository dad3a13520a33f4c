// libFuzzer: the tokenizer.json reader (text/hf_tokenizer_json.cc: every model, normalizer,
// pre-tokenizer, post-processor and decoder field, merges, added tokens, regex patterns)
// and, for a file it accepts, encode and decode of a fixed text. Anything but a clean
// hyperion::Error is a bug: a crash, a sanitizer report, a hang, or decoded text that is
// not valid UTF-8.
#include <cstdint>
#include <string>

#include "base/error.h"
#include "base/utf8.h"
#include "text/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hyperion;
  text::HfTokenizerSource src;
  src.tokenizer_json.assign(reinterpret_cast<const char*>(data), size);
  src.tokenizer_json_path = "fuzz/tokenizer.json";
  try {
    const auto tok = text::HfTokenizer::parse(src);
    static const char* const kTexts[] = {"", "Hello, world! 12345", "  \t\n\n x",
                                         "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80",
                                         "<s>[INST] hi [/INST]</s><|im_start|>"};
    for (const char* text : kTexts) {
      const std::vector<int32_t> ids = tok->encode_with_special_tokens(text);
      for (int32_t id : ids)
        if (id < 0 || id >= tok->vocab_size()) __builtin_trap();
      const std::string back = tok->decode(ids, false);
      if (utf8_invalid_at(back) != std::string::npos) __builtin_trap();
    }
  } catch (const Error&) {
  }
  return 0;
}
