// Held-out evaluation of a model on a token stream: mean next-token loss and perplexity.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/param_store.h"
#include "text/tokenizer.h"

namespace hyperion {

struct EvalReport {
  double loss = 0;        // mean cross-entropy per predicted token (nats)
  double perplexity = 0;  // exp(loss)
  int64_t tokens = 0;     // predicted tokens
  double seconds = 0;
};

// The stream is cut into windows of seq_len + 1 tokens with stride seq_len (every token
// after the first is predicted exactly once, with up to seq_len tokens of context); the
// last partial window is padded and its padding ignored. Runs `batch` windows at a time.
EvalReport evaluate_stream(const ParamStore& params, const std::vector<int32_t>& tokens,
                           int64_t seq_len, int64_t batch);

// Perplexity as llama.cpp's llama-perplexity computes it with a context of `chunk`: `text`
// tokenized as one string with the tokenizer's special tokens (BOS first), cut into
// whole chunks of `chunk` tokens, each one's first token replaced by BOS, and in each the
// predictions of tokens chunk/2 + 1 .. chunk - 1 scored (the first half is context). Each
// chunk is one window (its second half's loss is the whole window's less its first
// half's, the model being causal). Throws when the text has fewer than 2 chunks.
EvalReport evaluate_llama_perplexity(const ParamStore& params, const text::Tokenizer& tokenizer,
                                     const std::string& text, int64_t chunk);

// Tokens of a text file (.txt / .jsonl): each document as BOS, its tokens, EOS.
std::vector<int32_t> tokenize_file(const text::Tokenizer& tokenizer, const std::string& path);
// All tokens of a token shard (checked against `vocab_size`).
std::vector<int32_t> read_shard_tokens(const std::string& path, int64_t vocab_size);

}  // namespace hyperion
