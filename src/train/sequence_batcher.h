// The order in which a language-model data source hands out its sequences, shared by the
// pre-training loader (train/data_loader.h: sequences cut from token shards) and the
// fine-tuning loader (train/sft_loader.h: one conversation per sequence).
//
// Each epoch visits every sequence exactly once, in index order or (shuffle) in a
// permutation derived only from (seed, epoch) by Fisher-Yates over splitmix64, so it is
// identical on every platform and standard library. The epochs form one endless stream of
// sequences; each global step takes the next world * batch of them and rank r gets the
// r-th block of `batch`. A step that crosses the end of an epoch finishes it and continues
// with the next epoch's order, so no sequence is dropped or repeated within an epoch.
//
// The state (epoch, index of the next step's first sequence) is the same on every rank:
// a checkpoint saved by any rank resumes all of them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/trainable_model.h"

namespace hyperion::train {

struct DataLoaderState {
  uint64_t epoch = 0;
  uint64_t index = 0;  // next sequence within the epoch's order
};

class SequenceBatcher {
 public:
  virtual ~SequenceBatcher() = default;

  // Fills inputs and targets, each [batch * seq_len] row-major, and advances (a packing
  // loader: positions too, else null).
  void next(int32_t* inputs, int32_t* targets, int32_t* positions = nullptr);
  // The same into a token batch of batch x seq_len (Batch::tokens); a packing loader
  // fills Batch::positions, the others leave it empty.
  void next(Batch& batch);
  // Whether rows hold several documents (Batch::positions).
  virtual bool packs() const { return false; }

  DataLoaderState state() const { return {epoch_, static_cast<uint64_t>(index_)}; }
  // Resumes at `s`; throws naming the data when s.index is not a sequence of it.
  void restore(const DataLoaderState& s);

  int64_t sequences_per_epoch() const { return sequences_; }
  int64_t batch() const { return batch_; }
  int64_t seq_len() const { return seq_len_; }

  // The sequence at position `pos` of `epoch`'s order (exposed for tests and tools).
  int64_t sequence_at(uint64_t epoch, int64_t pos);

 protected:
  SequenceBatcher(const SequenceBatcher&) = default;
  SequenceBatcher(SequenceBatcher&&) = default;
  SequenceBatcher& operator=(const SequenceBatcher&) = default;
  SequenceBatcher& operator=(SequenceBatcher&&) = default;
  // Throws naming `what` unless batch, seq_len and rank / world are valid.
  SequenceBatcher(int64_t batch, int64_t seq_len, uint64_t seed, bool shuffle, int rank, int world,
                  const char* what);
  // The derived loader's sequence count, known once its data is read (>= batch * world:
  // the derived loader checks that with its own words).
  void set_sequences(int64_t n) { sequences_ = n; }
  // Sequence `sequence`'s row: seq_len inputs and seq_len targets, and with packs() the
  // positions within each document.
  virtual void fill(int64_t sequence, int32_t* inputs, int32_t* targets, int32_t* positions) = 0;
  // The data, for messages ("token shard 'a.bin'").
  virtual std::string describe() const = 0;

  int64_t batch_, seq_len_;
  uint64_t seed_;
  bool shuffle_;
  int rank_, world_;

 private:
  int64_t sequences_ = 0;
  uint64_t epoch_ = 0;
  int64_t index_ = 0;
  // Permutation of the most recently used epoch (shuffle only).
  std::vector<int64_t> perm_;
  uint64_t perm_epoch_ = 0;
  bool perm_valid_ = false;
};

}  // namespace hyperion::train
