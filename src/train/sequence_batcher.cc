#include "train/sequence_batcher.h"

#include <algorithm>

#include "base/error.h"

namespace hyperion::train {

namespace {

uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// splitmix64 (Steele, Lea, Flood 2014): a fully specified generator, so permutations are
// the same everywhere (unlike std::uniform_int_distribution / std::shuffle).
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    state += 0x9e3779b97f4a7c15ull;
    return mix64(state);
  }
  // Uniform in [0, range) by rejection: no modulo bias.
  uint64_t below(uint64_t range) {
    const uint64_t threshold = (0 - range) % range;  // 2^64 mod range
    for (;;) {
      const uint64_t x = next();
      if (x >= threshold) return x % range;
    }
  }
};

}  // namespace

SequenceBatcher::SequenceBatcher(int64_t batch, int64_t seq_len, uint64_t seed, bool shuffle, int rank,
                                 int world, const char* what)
    : batch_(batch), seq_len_(seq_len), seed_(seed), shuffle_(shuffle), rank_(rank), world_(world) {
  HYP_CHECK(batch > 0 && seq_len > 0, "{}: batch and seq_len must be positive, got batch {} seq_len {}", what,
            batch, seq_len);
  HYP_CHECK(world >= 1 && rank >= 0 && rank < world, "{}: rank {} is outside [0, world) for world {}", what,
            rank, world);
}

int64_t SequenceBatcher::sequence_at(uint64_t epoch, int64_t pos) {
  HYP_CHECK(pos >= 0 && pos < sequences_, "data loader: position {} outside [0, {}) for {}", pos, sequences_,
            describe());
  if (!shuffle_) return pos;
  if (!perm_valid_ || perm_epoch_ != epoch) {
    perm_.resize(static_cast<size_t>(sequences_));
    for (int64_t i = 0; i < sequences_; ++i) perm_[i] = i;
    SplitMix64 rng{mix64(seed_ ^ 0x6a09e667f3bcc909ull) ^ mix64(epoch + 0xbb67ae8584caa73bull)};
    for (int64_t i = sequences_ - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i) + 1));
      std::swap(perm_[i], perm_[j]);
    }
    perm_epoch_ = epoch;
    perm_valid_ = true;
  }
  return perm_[pos];
}

void SequenceBatcher::next(Batch& batch) {
  HYP_CHECK(batch.rows == batch_ && batch.seq_len == seq_len_ &&
                static_cast<int64_t>(batch.inputs.size()) == batch_ * seq_len_ &&
                batch.targets.size() == batch.inputs.size(),
            "data loader: a batch of {} x {} tokens for a loader of {} x {}", batch.rows, batch.seq_len, batch_,
            seq_len_);
  if (packs()) batch.positions.resize(batch.inputs.size());
  else batch.positions.clear();
  next(batch.inputs.data(), batch.targets.data(), packs() ? batch.positions.data() : nullptr);
}

void SequenceBatcher::next(int32_t* inputs, int32_t* targets, int32_t* positions) {
  HYP_CHECK(!packs() || positions != nullptr, "{}: packed rows need their positions", describe());
  const int64_t T = seq_len_;
  for (int64_t b = 0; b < batch_; ++b) {
    // Position in the endless stream of epochs; one step spans at most two epochs because
    // world * batch <= sequences_.
    uint64_t epoch = epoch_;
    int64_t pos = index_ + rank_ * batch_ + b;
    if (pos >= sequences_) {
      pos -= sequences_;
      ++epoch;
    }
    fill(sequence_at(epoch, pos), inputs + b * T, targets + b * T, positions ? positions + b * T : nullptr);
  }
  index_ += batch_ * world_;
  if (index_ >= sequences_) {
    index_ -= sequences_;
    ++epoch_;
  }
}

void SequenceBatcher::restore(const DataLoaderState& s) {
  HYP_CHECK(s.index < static_cast<uint64_t>(sequences_),
            "data loader: cannot restore state (epoch {}, index {}): {} hold only {} sequences of {}+1 tokens",
            s.epoch, s.index, describe(), sequences_, seq_len_);
  epoch_ = s.epoch;
  index_ = static_cast<int64_t>(s.index);
}

}  // namespace hyperion::train
