// A checkpoint's tokenizer as GGUF's tokenizer.ggml.* keys, the vocabularies llama.cpp
// reads:
//
//   "llama"  a SentencePiece tokenizer.model: pieces, scores and types (Llama 2, the
//            presets' own tokenizers);
//   "gpt2"   a Hugging Face tokenizer.json with a byte-level BPE model: tokens as the file
//            spells them, types, the merges in rank order, and the pre-tokenizer llama.cpp
//            names by `tokenizer.ggml.pre` (Llama 3's "llama-bpe", Qwen2/3's "qwen2",
//            GPT-2's "gpt-2").
//
// Both are padded to the model's vocab_size with "[PADi]" tokens of type UNUSED, as
// llama.cpp's convert_hf_to_gguf.py pads them. A tokenizer llama.cpp would tokenize
// differently (a normaliser it does not run, a pre-tokenizer it does not know) is refused
// by name rather than written as a file that silently disagrees with training.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/gguf.h"

namespace hyperion::text {

struct GgufVocab {
  std::string model;  // "llama" or "gpt2"
  std::string pre;    // gpt2: llama.cpp's pre-tokenizer name
  std::vector<std::string> tokens;
  std::vector<float> scores;  // llama only
  std::vector<int32_t> types;
  std::vector<std::string> merges;  // gpt2 only: "left right", rank order
  int64_t unk_id = -1;
  bool add_space_prefix = true;  // llama only
  bool add_bos = true, add_eos = false;
  std::string chat_template;  // tokenizer_config.json's, if any
};

// llama.cpp's token types (tokenizer.ggml.token_type).
inline constexpr int32_t kGgufTokenNormal = 1, kGgufTokenUnknown = 2, kGgufTokenControl = 3,
                         kGgufTokenUserDefined = 4, kGgufTokenUnused = 5, kGgufTokenByte = 6;

// The vocabulary of the checkpoint directory `dir` (tokenizer.model, else tokenizer.json),
// padded to `vocab_size`. Errors name the directory, the file and the key.
GgufVocab read_gguf_vocab(const std::string& dir, int64_t vocab_size);

// The tokenizer.ggml.* keys (and tokenizer.chat_template), with the config's special ids.
void write_gguf_vocab(io::GgufWriter& w, const GgufVocab& v, int64_t bos_id, int64_t eos_id,
                      int64_t pad_id);

}  // namespace hyperion::text
