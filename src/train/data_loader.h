// Batches of (inputs, targets) for next-token pre-training, from token shards.
//
// The shards are concatenated into one token stream and cut into sequences of T + 1
// tokens with stride T: sequence i = tokens [i*T, i*T + T] (inclusive), inputs = its first
// T tokens, targets = its last T. Documents are already framed BOS ... EOS in the shards,
// so sequences pack several documents (or part of one) without padding.
//
// The order of the sequences and the rank / step arithmetic: train/sequence_batcher.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/token_shard.h"
#include "model/trainable_model.h"
#include "train/sequence_batcher.h"

namespace hyperion::train {

class DataLoader final : public SequenceBatcher {
 public:
  // Throws hyperion::Error naming the files when a shard is invalid, the shards disagree
  // on vocab_size, or they hold fewer than batch * world sequences.
  DataLoader(std::vector<std::string> shard_paths, int64_t batch, int64_t seq_len, uint64_t seed,
             bool shuffle = true, int rank = 0, int world = 1);

  int64_t total_tokens() const { return offsets_.back(); }
  int32_t vocab_size() const { return vocab_size_; }

 private:
  void fill(int64_t sequence, int32_t* inputs, int32_t* targets, int32_t* positions) override;
  std::string describe() const override;
  void read_tokens(int64_t begin, int64_t n, int32_t* out) const;

  std::vector<std::string> paths_;
  std::vector<io::TokenShard> shards_;
  std::vector<int64_t> offsets_;  // offsets_[k] = first token of shard k; back() = total
  int32_t vocab_size_ = 0;
  std::vector<int32_t> scratch_;  // one sequence of T + 1 tokens
};

}  // namespace hyperion::train
