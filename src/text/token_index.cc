#include "text/token_index.h"

#include <algorithm>
#include <functional>
#include <limits>

#include "base/error.h"

namespace hyperion::text {

TokenIndex::TokenIndex(std::initializer_list<std::pair<std::string_view, int32_t>> tokens) {
  reserve(tokens.size(), 0);
  for (const auto& [text, id] : tokens) insert(text, id);
}

uint64_t TokenIndex::hash(std::string_view s) {
  // libstdc++'s string hash is 64-bit MurmurHash2; one more mix spreads its bits so the
  // low ones (the slot) and the high ones (the tag) are both well spread.
  uint64_t k = std::hash<std::string_view>{}(s);
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}

void TokenIndex::reserve(size_t tokens, size_t bytes) {
  bytes_.reserve(bytes);
  size_t want = 16;
  while (want < tokens * 2) want <<= 1;
  if (want > slots_.size()) grow(want);
}

void TokenIndex::grow(size_t slots) {
  AlignedBuffer<Slot> old = std::move(slots_);
  slots_ = AlignedBuffer<Slot>(slots);
  std::fill(slots_.begin(), slots_.end(), Slot{});
  mask_ = slots - 1;
  for (const Slot& s : old) {
    if (s.id < 0) continue;
    const uint64_t h = hash(std::string_view(bytes_.data() + s.offset, s.length));
    size_t i = h & mask_;
    while (slots_[i].id >= 0) i = (i + 1) & mask_;
    slots_[i] = s;
  }
}

int32_t TokenIndex::insert(std::string_view text, int32_t id) {
  HYP_CHECK(id >= 0, "TokenIndex: token id {} is negative", id);
  if ((size_ + 1) * 2 > slots_.size()) grow(std::max<size_t>(16, slots_.size() * 2));
  const uint64_t h = hash(text);
  const auto tag = static_cast<uint32_t>(h >> 32);
  size_t i = h & mask_;
  for (; slots_[i].id >= 0; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.tag == tag && s.length == text.size() &&
        std::string_view(bytes_.data() + s.offset, s.length) == text)
      return s.id;
  }
  // Offsets are 32-bit: 4 GB of token text is far past any vocabulary (and past the
  // size a tokenizer file may have).
  HYP_CHECK(bytes_.size() + text.size() <= std::numeric_limits<uint32_t>::max(),
            "TokenIndex: more than 4 GB of token text");
  slots_[i] = {static_cast<uint32_t>(bytes_.size()), static_cast<uint32_t>(text.size()), tag, id};
  bytes_.append(text);
  ++size_;
  return -1;
}

}  // namespace hyperion::text
