#include "train/data_loader.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

#include "base/error.h"

namespace hyperion::train {

DataLoader::DataLoader(std::vector<std::string> shard_paths, int64_t batch, int64_t seq_len,
                       uint64_t seed, bool shuffle, int rank, int world)
    : SequenceBatcher(batch, seq_len, seed, shuffle, rank, world, "DataLoader"),
      paths_(std::move(shard_paths)) {
  HYP_CHECK(!paths_.empty(), "DataLoader: no token shards given");
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
  const int64_t sequences = total > 0 ? (total - 1) / seq_len_ : 0;
  const int64_t need = batch_ * world_;
  HYP_CHECK(sequences >= need,
            "DataLoader: {} tokens in {} make {} sequences of {}+1 tokens, fewer than the batch "
            "* world = {} * {} = {} needed for one step",
            total, describe(), sequences, seq_len_, batch_, world_, need);
  set_sequences(sequences);
  scratch_.resize(static_cast<size_t>(seq_len_ + 1));
}

std::string DataLoader::describe() const {
  return fmt::format("token shard{} '{}'", paths_.size() == 1 ? "" : "s",
                     fmt::join(paths_, "', '"));
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

void DataLoader::fill(int64_t sequence, int32_t* inputs, int32_t* targets, int32_t* /*positions*/) {
  const int64_t T = seq_len_;
  read_tokens(sequence * T, T + 1, scratch_.data());
  std::memcpy(inputs, scratch_.data(), static_cast<size_t>(T) * sizeof(int32_t));
  std::memcpy(targets, scratch_.data() + 1, static_cast<size_t>(T) * sizeof(int32_t));
}

}  // namespace hyperion::train
