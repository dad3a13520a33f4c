// Text <-> token ids, wrapping a SentencePiece model with Llama's conventions:
// unk = 0, bos = 1, eos = 2, no pad id, byte fallback (any byte sequence round-trips),
// digits split into single tokens, identity normalisation, a dummy prefix space.
//
// The model's serialized bytes are kept so a checkpoint can carry its own tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace hyperion::io {

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

class Tokenizer {
 public:
  // Reads a SentencePiece .model file; throws hyperion::Error naming the file when it is
  // missing, unreadable or not a valid model.
  static Tokenizer load(const std::string& model_path);
  // Loads a model from its serialized bytes; `origin` names them in error messages
  // (a file path, or e.g. "checkpoint.bin:tokenizer").
  static Tokenizer from_serialized(const std::string& bytes, std::string origin);
  // Trains on `documents` (each split into lines, the sentences SentencePiece sees) and
  // writes `output_model_path` atomically. Deterministic for the same input and options.
  // Throws naming the vocabulary size when the corpus cannot support it.
  static Tokenizer train(const std::vector<std::string>& documents,
                         const std::string& output_model_path, const TokenizerTrainOptions& opts);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // No BOS/EOS are added. Thread-safe (const).
  std::vector<int32_t> encode(std::string_view text) const;
  // Throws naming the id when one is outside [0, vocab_size).
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string id_to_piece(int32_t id) const;

  int32_t vocab_size() const;
  // The longest piece in bytes (the word-start mark counted as its 3 UTF-8 bytes): with
  // identity normalisation no token stands for more input bytes, so a text of B bytes
  // is at least B / max_piece_bytes() tokens. (A scan of the vocabulary; callers keep it.)
  size_t max_piece_bytes() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  int32_t unk_id() const;
  int32_t pad_id() const;  // -1: Llama has no pad token
  // The .model bytes (copied into checkpoints).
  const std::string& serialized() const;
  // Where the model came from (file path or the origin given to from_serialized).
  const std::string& origin() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hyperion::io
