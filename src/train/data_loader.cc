#include "train/data_loader.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

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

DataLoader::DataLoader(std::vector<std::string> shard_paths, int64_t batch, int64_t seq_len,
                       uint64_t seed, bool shuffle, int rank, int world)
    : paths_(std::move(shard_paths)),
      batch_(batch),
      seq_len_(seq_len),
      seed_(seed),
      shuffle_(shuffle),
      rank_(rank),
      world_(world) {
  HYP_CHECK(!paths_.empty(), "DataLoader: no token shards given");
  HYP_CHECK(batch > 0 && seq_len > 0,
            "DataLoader: batch and seq_len must be positive, got batch {} seq_len {}", batch,
            seq_len);
  HYP_CHECK(world >= 1 && rank >= 0 && rank < world,
            "DataLoader: rank {} is outside [0, world) for world {}", rank, world);
  offsets_.push_back(0);
  for (const std::string& p : paths_) {
    shards_.push_back(io::TokenShard::open(p));
    const io::TokenShard& s = shards_.back();
    if (shards_.size() == 1) vocab_size_ = s.vocab_size();
    HYP_CHECK(s.vocab_size() == vocab_size_,
              "DataLoader: token shards disagree on vocab_size: '{}' has {}, '{}' has {}",
              paths_.front(), vocab_size_, p, s.vocab_size());
    offsets_.push_back(offsets_.back() + s.size());
  }
  const int64_t total = offsets_.back();
  sequences_ = total > 0 ? (total - 1) / seq_len_ : 0;
  const int64_t need = batch_ * world_;
  HYP_CHECK(sequences_ >= need,
            "DataLoader: {} tokens in {} make {} sequences of {}+1 tokens, fewer than the batch "
            "* world = {} * {} = {} needed for one step",
            total, describe(), sequences_, seq_len_, batch_, world_, need);
  scratch_.resize(static_cast<size_t>(seq_len_ + 1));
}

std::string DataLoader::describe() const {
  return fmt::format("token shard{} '{}'", paths_.size() == 1 ? "" : "s",
                     fmt::join(paths_, "', '"));
}

int64_t DataLoader::sequence_at(uint64_t epoch, int64_t pos) {
  HYP_CHECK(pos >= 0 && pos < sequences_, "DataLoader: position {} outside [0, {}) for {}", pos,
            sequences_, describe());
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

void DataLoader::read_tokens(int64_t begin, int64_t n, int32_t* out) const {
  // The last shard starting at or before `begin` (empty shards are skipped this way).
  size_t k = static_cast<size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), begin) -
                                 offsets_.begin() - 1);
  while (n > 0) {
    const int64_t local = begin - offsets_[k];
    const int64_t m = std::min(n, shards_[k].size() - local);
    if (m > 0) {
      shards_[k].read(local, m, out);
      out += m;
      begin += m;
      n -= m;
    }
    ++k;
  }
}

void DataLoader::next(Batch& batch) {
  HYP_CHECK(batch.rows == batch_ && batch.seq_len == seq_len_ &&
                static_cast<int64_t>(batch.inputs.size()) == batch_ * seq_len_ &&
                batch.targets.size() == batch.inputs.size(),
            "data loader: a batch of {} x {} tokens for a loader of {} x {}", batch.rows,
            batch.seq_len, batch_, seq_len_);
  next(batch.inputs.data(), batch.targets.data());
}

void DataLoader::next(int32_t* inputs, int32_t* targets) {
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
    const int64_t seq = sequence_at(epoch, pos);
    read_tokens(seq * T, T + 1, scratch_.data());
    std::memcpy(inputs + b * T, scratch_.data(), static_cast<size_t>(T) * sizeof(int32_t));
    std::memcpy(targets + b * T, scratch_.data() + 1, static_cast<size_t>(T) * sizeof(int32_t));
  }
  index_ += batch_ * world_;
  if (index_ >= sequences_) {
    index_ -= sequences_;
    ++epoch_;
  }
}

void DataLoader::restore(const DataLoaderState& s) {
  HYP_CHECK(s.index < static_cast<uint64_t>(sequences_),
            "DataLoader: cannot restore state (epoch {}, index {}): {} hold only {} sequences of "
            "{}+1 tokens",
            s.epoch, s.index, describe(), sequences_, seq_len_);
  epoch_ = s.epoch;
  index_ = static_cast<int64_t>(s.index);
}

}  // namespace hyperion::train
