// `data prepare`: raw text -> tokenizer + train/validation token shards.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hyperion::train {

struct PrepareOptions {
  std::vector<std::string> inputs;  // .txt / .jsonl files (see text/text_input.h)
  std::string output_dir;           // created if missing
  // An existing tokenizer (a .model, a tokenizer.json or a directory holding one: its
  // vocabulary is used as it is); empty = train a SentencePiece one on the train split.
  std::string tokenizer_model;
  int vocab_size = 8192;            // only used when training a tokenizer
  double val_fraction = 0.05;       // in [0, 1)
  uint64_t seed = 1234;             // chooses the held-out documents
  // What the output was made from, in words (the trainer's dataset cache key: inputs'
  // fingerprints, tokenizer, vocabulary, split); written to meta.json as "cache_key".
  std::string cache_key;
};

// A complete output of prepare_dataset: the shards, the tokenizer and a meta.json that
// does not say "complete": false (a prepare still running, or killed half-way).
bool is_prepared_dataset(const std::string& dir);

struct PrepareResult {
  std::string tokenizer_path, train_path, val_path;
  int64_t documents = 0, train_docs = 0, val_docs = 0;
  int64_t train_tokens = 0, val_tokens = 0;  // including the BOS/EOS of every document
  int32_t vocab_size = 0;
  double seconds = 0;
};

// Reads every input, chooses the held-out split, trains (or loads) the tokenizer and
// writes output_dir/{tokenizer.model (or tokenizer.json + tokenizer_config.json), train.bin,
// val.bin, meta.json}, each atomically. Every document is stored as BOS (when the
// tokenizer has one), its tokens, EOS, in input order (packing into sequences
// happens in the data loader). The tokenizer is trained on the train split only, so the
// validation text is truly unseen. The output is byte-identical for the same inputs and
// options.
PrepareResult prepare_dataset(const PrepareOptions& opts);

// The held-out split: out[i] is true when document i goes to validation. Chosen per
// document from a hash of (seed, i), so adding documents at the end does not move earlier
// ones. With val_fraction > 0 and n >= 2 both splits are non-empty.
std::vector<bool> split_validation(int64_t n, double val_fraction, uint64_t seed);

}  // namespace hyperion::train
