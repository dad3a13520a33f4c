// A Hugging Face tokenizer: tokenizer.json (the `tokenizers` library's format) with its
// tokenizer_config.json (special tokens, add_bos_token/add_eos_token, chat_template).
//
// encode() follows TokenizerImpl::encode with add_special_tokens=false: added tokens are
// found first (leftmost-longest, on the raw text for normalized=false tokens and on the
// normalized text for the others, never split), then each remaining segment is normalized,
// pre-tokenized and each word encoded by the BPE model. encode_with_special_tokens() adds
// what the post-processor adds (TemplateProcessing), or, where tokenizer_config.json sets
// add_bos_token/add_eos_token, what those say (transformers' Llama and Gemma tokenizers
// rebuild their post-processor from them). decode() runs the decoder chain.
//
// Supported, exactly: model BPE (byte-level or character-level, byte_fallback, unk/fuse_unk,
// ignore_merges, merges as "a b" strings or [a, b] pairs); normalizers NFC, NFD, NFKC, NFKD,
// Lowercase, Replace (String or Regex), Prepend, Strip, Sequence; pre-tokenizers Split
// (String or Regex, every behavior, invert), ByteLevel, Metaspace, Digits, Whitespace,
// WhitespaceSplit, Sequence; post-processors TemplateProcessing, ByteLevel, Sequence;
// decoders ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence. Anything
// else is refused at load, naming the file and key (docs/TOKENIZERS.md lists it).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace hyperion::text {

struct HfTokenizerSource {
  std::string tokenizer_json;
  std::string tokenizer_json_path;  // names the file in errors
  std::string config_json;          // empty: no tokenizer_config.json
  std::string config_json_path;
  std::string generation_config_json;  // optional: its eos_token_id adds end tokens
  std::string generation_config_path;
  std::string chat_template_override;  // a chat_template.jinja beside the files, if any
};

class HfTokenizer {
 public:
  // Throws hyperion::Error naming the file and key for anything malformed or unsupported.
  static std::unique_ptr<HfTokenizer> parse(const HfTokenizerSource& src);
  ~HfTokenizer();

  std::vector<int32_t> encode(std::string_view text) const;
  std::vector<int32_t> encode_with_special_tokens(std::string_view text) const;
  // A negative id is an error naming it; ids past the vocabulary (a model's padded rows)
  // decode to nothing, as in Hugging Face. Output is valid UTF-8 (invalid byte runs become
  // U+FFFD, as Hugging Face's from_utf8_lossy).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const;
  std::string piece(int32_t id) const;
  // Tokenizer::token_bytes (text/tokenizer.h) for a tokenizer.json.
  std::vector<std::string> token_bytes() const;
  int32_t token_id(std::string_view token) const;  // -1 when absent
  bool is_special(int32_t id) const;

  int32_t vocab_size() const;
  size_t max_piece_bytes() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  int32_t pad_id() const;
  int32_t unk_id() const;
  // Every id that ends a generation: eos, generation_config.json's eos_token_id, and the
  // end-of-turn tokens of the known chat formats present as special tokens.
  const std::vector<int32_t>& end_ids() const;
  const std::string& chat_template() const;  // empty when the config has none
  const std::string& bos_token() const;
  const std::string& eos_token() const;
  bool adds_bos() const;  // encode_with_special_tokens puts bos first

  struct Impl;

 private:
  explicit HfTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyperion::text
