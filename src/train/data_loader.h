// Batches of (inputs, targets) for next-token pre-training, from token shards.
//
// The shards are concatenated into one token stream and cut into sequences of T + 1
// tokens with stride T: sequence i = tokens [i*T, i*T + T] (inclusive), inputs = its first
// T tokens, targets = its last T. Documents are already framed BOS ... EOS in the shards,
// so sequences pack several documents (or part of one) without padding.
//
// Order: each epoch visits every sequence exactly once, in index order or (shuffle) in a
// permutation derived only from (seed, epoch) by Fisher-Yates over splitmix64, so it is
// identical on every platform and standard library. The epochs form one endless stream
// of sequences; each global step takes the next world * batch of them and rank r gets the
// r-th block of `batch`. A step that crosses the end of an epoch finishes it and continues
// with the next epoch's order, so no sequence is dropped or repeated within an epoch.
//
// The state (epoch, index of the next step's first sequence) is the same on every rank:
// a checkpoint saved by any rank resumes all of them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/token_shard.h"
#include "model/trainable_model.h"

namespace hyperion::train {

struct DataLoaderState {
  uint64_t epoch = 0;
  uint64_t index = 0;  // next sequence within the epoch's order
};

class DataLoader {
 public:
  // Throws hyperion::Error naming the files when a shard is invalid, the shards disagree
  // on vocab_size, or they hold fewer than batch * world sequences.
  DataLoader(std::vector<std::string> shard_paths, int64_t batch, int64_t seq_len, uint64_t seed,
             bool shuffle = true, int rank = 0, int world = 1);

  // Fills inputs and targets, each [batch * seq_len] row-major, and advances.
  void next(int32_t* inputs, int32_t* targets);
  // The same into a token batch of batch x seq_len (Batch::tokens).
  void next(Batch& batch);

  DataLoaderState state() const { return {epoch_, static_cast<uint64_t>(index_)}; }
  // Resumes at `s`; throws naming the files when s.index is not a sequence of this data.
  void restore(const DataLoaderState& s);

  int64_t sequences_per_epoch() const { return sequences_; }
  int64_t total_tokens() const { return offsets_.back(); }
  int32_t vocab_size() const { return vocab_size_; }
  int64_t batch() const { return batch_; }
  int64_t seq_len() const { return seq_len_; }

  // The sequence at position `pos` of `epoch`'s order (exposed for tests and tools).
  int64_t sequence_at(uint64_t epoch, int64_t pos);

 private:
  void read_tokens(int64_t begin, int64_t n, int32_t* out) const;
  std::string describe() const;

  std::vector<std::string> paths_;
  std::vector<io::TokenShard> shards_;
  std::vector<int64_t> offsets_;  // offsets_[k] = first token of shard k; back() = total
  int64_t batch_, seq_len_;
  uint64_t seed_;
  bool shuffle_;
  int rank_, world_;
  int32_t vocab_size_ = 0;
  int64_t sequences_ = 0;

  uint64_t epoch_ = 0;
  int64_t index_ = 0;

  // Permutation of the most recently used epoch (shuffle only).
  std::vector<int64_t> perm_;
  uint64_t perm_epoch_ = 0;
  bool perm_valid_ = false;
  std::vector<int32_t> scratch_;  // one sequence of T + 1 tokens
};

}  // namespace hyperion::train
