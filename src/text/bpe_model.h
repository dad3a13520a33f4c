// The BPE model of a Hugging Face tokenizer.json: a word (one pre-token) becomes ids by
// starting from its characters (or, for a byte-level vocabulary, its bytes) and merging
// the adjacent pair of lowest merge rank until no ranked pair is left, exactly as the
// `tokenizers` library's BPE::merge_word does (ties go to the leftmost pair).
//
// Speed: merges are a pair-of-ids hash table (no strings touched while merging); the
// merge loop keeps the live pairs in a binary heap over a doubly linked symbol list, so a
// word of n symbols costs O(n log n) however it is made (a 1 MB run of one character
// included); words up to kCacheWordBytes are memoised (thread-safe). A word of more than
// BpeModelSpec::split_symbols symbols (a whole document, for a vocabulary with no
// pre-tokenizer such as Llama 2's or Gemma's) is merged a stretch at a time, cut only
// between two symbols no merge can ever join (every kStretchSymbols / 2 or more), so the
// result is the same and the scratch stays small and in cache. Finding those places needs
// a table built from every merge (40 ms for Gemma 3), once, on the first such word: the
// cut is for words long enough (a million symbols: 3 MB of CJK text) that their own
// merging takes longer than that.
//
// Byte-level vocabularies (GPT-2, Llama 3, Qwen) spell every byte as a printable
// character (Ġ for a space). The model keys its vocabulary by the raw bytes those
// characters stand for, so encoding never converts text to that alphabet and decoding
// never converts back.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/aligned.h"
#include "text/token_index.h"

namespace hyperion::text {

// A hash table from (left id, right id) to (rank, merged id): open addressing, linear
// probing, power-of-two size, at most 3/4 full; built once, read-only afterwards. A slot
// is 16 bytes (a probe reads one cache line), and a table of 4 MB or more (a real
// tokenizer's: 16 MB for Llama 3) sits on huge pages (base/aligned.h): it is filled and
// read at random, so 4 KB pages cost a page fault each to fill and a TLB miss per probe.
class MergeTable {
 public:
  struct Merge {
    int32_t rank = -1;
    int32_t merged = -1;
  };
  void reserve(size_t merges);
  // A pair already present takes the new value (the last duplicate wins, as the
  // `tokenizers` library's HashMap of merges). Returns false for such a duplicate.
  bool insert(int32_t left, int32_t right, Merge m);
  void prefetch(int32_t left, int32_t right) const {
    if (slots_.size() != 0) __builtin_prefetch(&slots_[hash(pack(left, right)) & mask_]);
  }
  Merge find(int32_t left, int32_t right) const {
    if (slots_.size() == 0) return {};
    const uint64_t key = pack(left, right);
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return slots_[i].merge;
      if (slots_[i].key == kEmpty) return {};
    }
  }
  size_t size() const { return size_; }
  size_t capacity() const { return slots_.size(); }
  // Calls f(left, right, merge) for every pair.
  template <class F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_)
      if (s.key != kEmpty)
        f(static_cast<int32_t>(s.key >> 32), static_cast<int32_t>(s.key & 0xffffffffu), s.merge);
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t pack(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  AlignedBuffer<Slot> slots_;
  size_t mask_ = 0, size_ = 0;
};

// A string-keyed hash map that looks up string_views without building a std::string.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct BpeModelSpec {
  bool byte_level = false;     // vocabulary spelled in the GPT-2 byte alphabet
  bool byte_fallback = false;  // unknown characters become <0xXX> byte tokens
  bool ignore_merges = false;  // a word that is itself in the vocabulary is one token
  bool fuse_unk = false;       // consecutive unknown characters become one unk
  int32_t unk_id = -1;         // -1: unknown characters are dropped (as HF does)
  // A word of more symbols is merged a stretch at a time (tests make it small).
  size_t split_symbols = size_t{1} << 20;
};

class BpeModel {
 public:
  // The memo holds words up to kCacheWordBytes (a run of 40 emoji is 160 bytes and, in a
  // byte-level vocabulary, 160 symbols to merge), up to kCacheEntries of them and about
  // kCacheBytes in all; then it starts again.
  static constexpr size_t kCacheWordBytes = 256;
  static constexpr size_t kCacheEntries = 1 << 17;
  static constexpr size_t kCacheBytes = size_t{32} << 20;
  // A thread keeps the scratch of words up to this many symbols for the next word.
  static constexpr size_t kKeepScratchSymbols = size_t{1} << 16;
  // A word past split_symbols is cut into stretches of at least half this many symbols.
  static constexpr size_t kStretchSymbols = size_t{1} << 16;

  // `vocab`: token text (raw bytes for a byte-level model) -> id. Merges are added in
  // rank order with add_merges or add_merge.
  BpeModel(BpeModelSpec spec, TokenIndex vocab);
  void reserve_merges(size_t n) { merges_.reserve(n); }

  // A merge of a batch: its left and right parts end to end at `offset` in the batch's
  // text (so the text there is also what they merge into).
  struct MergeText {
    uint32_t offset, left, right;  // left and right: the parts' lengths
    int32_t rank;
  };
  // Adds a batch of merges in rank order. Returns the index of the first one that cannot
  // be added, with the reason in *why (a part or the result is not in the vocabulary),
  // or merges.size(). The lookups of a batch are prefetched together: a real tokenizer's
  // 280k-515k merges each look up three texts and insert one pair, all at random places
  // in tables of several MB, and one at a time they wait on a cache miss each.
  size_t add_merges(std::string_view text, const std::vector<MergeText>& merges,
                    std::string* why);
  // One merge (tests, small tokenizers); an explanation when it cannot, else empty.
  std::string add_merge(std::string_view left, std::string_view right, int32_t rank);

  // Appends the ids of one word (a pre-token, non-empty).
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  const BpeModelSpec& spec() const { return spec_; }
  int32_t find(std::string_view token) const;
  size_t merge_count() const { return merges_.size(); }

 private:
  void merge_symbols(std::string_view word, std::vector<int32_t>& out) const;
  // BPE over the initial symbols sym[0, n) (scratch: merged in place), appended to out.
  void merge_run(int32_t* sym, int32_t n, std::vector<int32_t>& out) const;
  // The pairs of initial symbols some merge joins (the last symbol of its left part, the
  // first of its right); built on the first huge word.
  const MergeTable& junctions() const;
  // The initial symbols of `word`: one per byte (byte-level) or per character.
  void initial_symbols(std::string_view word, std::vector<int32_t>& ids) const;

  BpeModelSpec spec_;
  TokenIndex vocab_;
  MergeTable merges_;
  int32_t byte_ids_[256];   // byte-level: the token of each byte; else <0xXX>
  // Character models: the token of each character of the Basic Multilingual Plane (-1:
  // none), so a word's characters (CJK, Cyrillic, Devanagari) do not each cost a hash
  // lookup in a table of several MB. 256 KB; empty for byte-level models.
  std::vector<int32_t> bmp_ids_;

  mutable std::once_flag junctions_once_;
  mutable MergeTable junctions_;
  mutable std::vector<uint8_t> plain_;  // token id -> its text is that one symbol

  // Memo of short words. A miss takes the exclusive lock only to insert.
  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
  mutable size_t cache_bytes_ = 0;
};

// The GPT-2 byte alphabet: the character (as UTF-8) that stands for each byte, and the
// reverse mapping (-1 for a code point that stands for no byte).
const std::string& byte_level_char(uint8_t byte);
int byte_level_byte(uint32_t code_point);
// A byte-level token's raw bytes; false when a character of it stands for no byte.
bool byte_level_decode(std::string_view token, std::string* raw);

}  // namespace hyperion::text
