// Text <-> token ids. One interface over the two formats models ship:
//   - a SentencePiece `.model` (hyperion's own tokenizers, trained with Llama's
//     conventions: unk = 0, bos = 1, eos = 2, no pad, byte fallback, split digits,
//     identity normalisation, a dummy prefix space);
//   - a Hugging Face `tokenizer.json` with its `tokenizer_config.json` (Llama 3, Qwen,
//     Gemma, Mistral...: text/hf_tokenizer.h), which also carries the chat template.
// A checkpoint carries the files its tokenizer came from (files()) and every command that
// takes a checkpoint loads whichever it has (tokenizer.json first).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hyperion::text {

class HfTokenizer;
struct HfTokenizerSource;

// The tokenizer files of a directory (a checkpoint, a prepared dataset or a model
// download): tokenizer.json (+ tokenizer_config.json, generation_config.json,
// chat_template.jinja), else tokenizer.model. Empty when it has neither.
std::string tokenizer_file_in(const std::string& dir);
// The files a tokenizer is carried in, by name.
inline constexpr const char* kTokenizerFileNames[] = {
    "tokenizer.model", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
    "generation_config.json"};

struct TokenizerTrainOptions {
  int vocab_size = 8192;
  std::string model_type = "bpe";  // bpe | unigram
  bool byte_fallback = true;
  double character_coverage = 0.9995;
  // Upper bound on training sentences (lines of the documents); above it a deterministic,
  // evenly strided subset is used.
  int64_t max_sentences = 2000000;
  int num_threads = 2;
};

// What a SentencePiece model read from elsewhere than a tokenizer.model brings beside its
// pieces (a GGUF file's vocabulary: text/gguf_tokenizer.h). The defaults are what a plain
// tokenizer.model does.
struct SentencePieceExtras {
  std::string chat_template;
  // Ids that end a generation besides eos (end-of-turn tokens such as <end_of_turn>).
  std::vector<int32_t> end_ids;
  // Tokens found whole in the text (leftmost-longest) before SentencePiece encodes the
  // stretches between them, each stretch with its own dummy prefix: how llama.cpp and
  // transformers find a chat template's <bos> or <start_of_turn>, which SentencePiece
  // itself never matches in text (they are control pieces).
  std::vector<int32_t> whole_tokens;
  // What encode_with_special_tokens puts around the text.
  bool add_bos = true, add_eos = false;
};

class Tokenizer {
 public:
  // Reads a SentencePiece .model file, a tokenizer.json (with tokenizer_config.json,
  // generation_config.json and chat_template.jinja from the same directory when present),
  // or a directory holding either (tokenizer_file_in). Throws hyperion::Error naming the
  // file (and the key) when it is missing, unreadable, malformed or unsupported (a
  // malformed or unsupported tokenizer.json: hyperion::UsageError, exit status 2).
  static Tokenizer load(const std::string& path);
  // Loads a model from its serialized bytes; `origin` names them in error messages
  // (a file path, or e.g. "checkpoint.bin:tokenizer").
  static Tokenizer from_serialized(const std::string& bytes, std::string origin);
  // The same, with what a tokenizer.model does not carry (SentencePieceExtras).
  static Tokenizer from_serialized(const std::string& bytes, std::string origin,
                                   const SentencePieceExtras& extras);
  // A tokenizer.json with its tokenizer_config.json and generation_config.json (empty: not
  // there) given as text rather than files: a vocabulary rebuilt from another container (a
  // GGUF file's metadata). `origin` names them in errors and is origin(); files() holds
  // them. Malformed or unsupported input throws hyperion::UsageError, as load() does.
  static Tokenizer from_hf_json(std::string tokenizer_json, std::string config_json,
                                std::string generation_config_json, std::string origin);
  // Trains on `documents` (each split into lines, the sentences SentencePiece sees) and
  // writes `output_model_path` atomically. Deterministic for the same input and options.
  // Throws naming the vocabulary size when the corpus cannot support it.
  static Tokenizer train(const std::vector<std::string>& documents,
                         const std::string& output_model_path, const TokenizerTrainOptions& opts);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // No BOS/EOS are added; special-token strings in the text (e.g. "<|im_start|>") are
  // those tokens for a tokenizer.json, plain text for a SentencePiece model.
  // Thread-safe (const). A tokenizer.json needs valid UTF-8 (an error names the offset).
  std::vector<int32_t> encode(std::string_view text) const;
  // What Hugging Face's encode(add_special_tokens=True) gives: the post-processor's tokens
  // around the text (BOS first for Llama and Gemma, nothing for Qwen).
  std::vector<int32_t> encode_with_special_tokens(std::string_view text) const;
  // Throws naming the id when one is outside [0, vocab_size). Special tokens (bos, eos,
  // <|im_start|>...) are left out unless `skip_special_tokens` is false.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = true) const;
  std::string id_to_piece(int32_t id) const;
  // The bytes each id stands for in the middle of a text (a word-start mark as its space,
  // a byte-fallback or byte-level token as its raw byte, which may be part of a UTF-8
  // character), with no decoder step that depends on the neighbours (no Strip, no
  // first-token space removal): what a grammar matcher feeds its automaton. Special
  // tokens, SentencePiece's unknown piece and a model's padded ids give "".
  std::vector<std::string> token_bytes() const;
  // The id of a token string, -1 when it has none.
  int32_t token_id(std::string_view token) const;

  int32_t vocab_size() const;
  // Whether a model with `model_vocab` embedding rows can use this tokenizer: exactly as
  // many for a SentencePiece model; at least as many for a tokenizer.json (Hugging Face
  // models pad the embedding: Qwen 2.5 has 151,936 rows for 151,665 tokens).
  bool fits_model_vocab(int64_t model_vocab) const;
  // The longest piece in bytes (the word-start mark counted as its 3 UTF-8 bytes): with
  // identity normalisation no token stands for more input bytes, so a text of B bytes
  // is at least B / max_piece_bytes() tokens. (A scan of the vocabulary; callers keep it.)
  size_t max_piece_bytes() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  int32_t unk_id() const;
  int32_t pad_id() const;  // -1: no pad token
  // Every id that ends a generation (eos, and the chat formats' end-of-turn tokens).
  const std::vector<int32_t>& end_ids() const;
  bool is_end(int32_t id) const;
  // A special token: one decode leaves out unless asked to keep special tokens (BOS, EOS,
  // <|im_start|>...; a SentencePiece model's control tokens).
  bool is_special(int32_t id) const;
  // The Jinja chat template of tokenizer_config.json; empty when there is none.
  const std::string& chat_template() const;
  // The bos/eos token strings the chat template reads (empty when there is none).
  std::string bos_token() const;
  std::string eos_token() const;
  // "sentencepiece" or "tokenizer.json".
  const char* format() const;
  // The files this tokenizer is carried in, by name (tokenizer.model, or tokenizer.json
  // and tokenizer_config.json...): a checkpoint writes each beside its weights.
  const std::vector<std::pair<std::string, std::string>>& files() const;
  // Where the model came from (file path or the origin given to from_serialized).
  const std::string& origin() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  // load() and from_hf_json(): parses `src`, keeping its texts as files().
  static Tokenizer from_hf_source(HfTokenizerSource&& src, std::string origin);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyperion::text
