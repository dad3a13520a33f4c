// A vocabulary's token text -> id table, built once at load and read-only afterwards.
//
// Why not std::unordered_map<std::string, int32_t>: a real vocabulary (Llama 3's 128k
// tokens, Gemma 3's 262k) makes that a node allocation per token, and loading looks up
// three strings for each of 280k-515k merges, each a pointer chase to a node and its
// string. Here the texts sit end to end in one buffer and the table is a flat array of
// 16-byte slots (open addressing, linear probing, at most half full) that carry a 32-bit
// tag of the hash, so a lookup compares bytes only for a likely match. A table of 4 MB or
// more sits on huge pages (base/aligned.h), as MergeTable's.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/aligned.h"

namespace hyperion::text {

class TokenIndex {
 public:
  TokenIndex() = default;
  TokenIndex(std::initializer_list<std::pair<std::string_view, int32_t>> tokens);

  // Room for `tokens` entries spelling `bytes` bytes in all (a hint; both may be 0).
  void reserve(size_t tokens, size_t bytes);
  // Adds `text` -> `id`. A text already present keeps its id, which is returned; -1
  // means the text was added.
  int32_t insert(std::string_view text, int32_t id);
  // The id of `text`, or -1.
  int32_t find(std::string_view text) const { return find(text, hash(text)); }
  // The same with the text's hash computed already: a caller looking up many texts
  // hashes and prefetches a batch first, so the slots' cache misses overlap.
  static uint64_t hash(std::string_view s);
  void prefetch(uint64_t h) const {
    if (slots_.size() != 0) __builtin_prefetch(&slots_[h & mask_]);
  }
  int32_t find(std::string_view text, uint64_t h) const {
    if (slots_.size() == 0) return -1;
    const auto tag = static_cast<uint32_t>(h >> 32);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.tag == tag && s.length == text.size() &&
          std::string_view(bytes_.data() + s.offset, s.length) == text)
        return s.id;
    }
  }
  bool contains(std::string_view text) const { return find(text) >= 0; }
  size_t size() const { return size_; }
  // Calls f(text, id) for every token, in no particular order.
  template <class F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_)
      if (s.id >= 0) f(std::string_view(bytes_.data() + s.offset, s.length), s.id);
  }

 private:
  struct Slot {
    uint32_t offset = 0, length = 0;  // the text, in bytes_
    uint32_t tag = 0;                 // the hash's high half
    int32_t id = -1;                  // -1: empty
  };
  void grow(size_t slots);

  std::string bytes_;
  AlignedBuffer<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
};

}  // namespace hyperion::text
