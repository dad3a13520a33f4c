#include "text/bpe_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <mutex>

#include "base/utf8.h"

namespace hyperion::text {

namespace {

// The byte length of the UTF-8 sequence that starts with `lead` (1 for a stray byte, so a
// malformed string still advances).
size_t utf8_length(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

// The code point of the `len`-byte character at `s` when it is a well-formed UTF-8
// encoding of a character below U+10000 (so the table of such characters answers for
// it); -1 otherwise (a 4-byte character, or bytes that are not UTF-8: looked up as text).
int32_t bmp_code_point(const unsigned char* s, size_t len) {
  if (len == 1) return s[0] < 0x80 ? s[0] : -1;
  if (len == 2) {
    if ((s[0] & 0xE0) != 0xC0 || (s[1] & 0xC0) != 0x80) return -1;
    const int32_t cp = ((s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    return cp >= 0x80 ? cp : -1;
  }
  if (len == 3) {
    if ((s[0] & 0xF0) != 0xE0 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return -1;
    const int32_t cp = ((s[0] & 0x0F) << 12) | ((s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    return cp >= 0x800 ? cp : -1;
  }
  return -1;
}

struct ByteAlphabet {
  std::array<std::string, 256> chars;
  std::array<uint16_t, 256> code_points{};
  ByteAlphabet() {
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      const uint32_t cp = printable ? b : next++;
      code_points[b] = static_cast<uint16_t>(cp);
      append_utf8(chars[b], cp);
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

// One pair waiting to merge: its rank and the left symbol's position. A rank names one
// pair of ids, so what it merges into is looked up again when it is taken (8 bytes an
// entry: a word of n symbols queues up to about 2n of them).
struct PendingMerge {
  int32_t rank;
  int32_t pos;
  bool operator>(const PendingMerge& o) const {
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};

// A thread's scratch for merging: kept between words (most are short), given back after
// a long one. Freed only once a whole word is done: a huge word is merged a stretch at a
// time, and giving the scratch back after each stretch made every stretch fault in fresh
// pages again.
struct MergeScratch {
  std::vector<int32_t> sym, prev, next;
  std::vector<PendingMerge> heap;
  void release() {
    for (auto* v : {&sym, &prev, &next}) std::vector<int32_t>().swap(*v);
    std::vector<PendingMerge>().swap(heap);
  }
};
thread_local MergeScratch scratch;

}  // namespace

const std::string& byte_level_char(uint8_t byte) {
  return alphabet().chars[byte];
}

int byte_level_byte(uint32_t code_point) {
  static const std::array<int16_t, 324> reverse = [] {
    std::array<int16_t, 324> r{};
    r.fill(-1);
    for (int b = 0; b < 256; ++b) r[alphabet().code_points[b]] = static_cast<int16_t>(b);
    return r;
  }();
  return code_point < reverse.size() ? reverse[code_point] : -1;
}

bool byte_level_decode(std::string_view token, std::string* raw) {
  raw->clear();
  const auto* s = reinterpret_cast<const unsigned char*>(token.data());
  for (size_t i = 0; i < token.size();) {
    const size_t len = utf8_length(s[i]);
    if (i + len > token.size()) return false;
    uint32_t cp = len == 1 ? s[i] : s[i] & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
    const int b = byte_level_byte(cp);
    if (b < 0) return false;
    *raw += static_cast<char>(b);
    i += len;
  }
  return true;
}

void MergeTable::reserve(size_t merges) {
  size_t cap = 16;
  while (cap * 3 < merges * 4) cap <<= 1;  // at most 3/4 full
  slots_ = AlignedBuffer<Slot>(cap);
  std::fill(slots_.begin(), slots_.end(), Slot{kEmpty, Merge{}});
  mask_ = cap - 1;
  size_ = 0;
}

bool MergeTable::insert(int32_t left, int32_t right, Merge m) {
  if ((size_ + 1) * 4 > slots_.size() * 3) {
    // Grow: rehash into twice the space.
    AlignedBuffer<Slot> old = std::move(slots_);
    reserve(std::max<size_t>(size_ + 1, old.size()));
    for (const Slot& s : old) {
      if (s.key == kEmpty) continue;
      for (size_t j = hash(s.key) & mask_;; j = (j + 1) & mask_) {
        if (slots_[j].key == kEmpty) {
          slots_[j] = s, ++size_;
          break;
        }
      }
    }
  }
  const uint64_t key = pack(left, right);
  for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
    if (slots_[i].key == key) {
      slots_[i].merge = m;
      return false;
    }
    if (slots_[i].key == kEmpty) {
      slots_[i] = {key, m}, ++size_;
      return true;
    }
  }
}

BpeModel::BpeModel(BpeModelSpec spec, TokenIndex vocab) : spec_(spec), vocab_(std::move(vocab)) {
  for (int b = 0; b < 256; ++b) {
    const std::string key =
        spec_.byte_level ? std::string(1, static_cast<char>(b)) : fmt::format("<0x{:02X}>", b);
    byte_ids_[b] = find(key);
  }
  if (!spec_.byte_level) {
    bmp_ids_.assign(size_t{1} << 16, -1);
    vocab_.for_each([&](std::string_view text, int32_t id) {
      const auto* u = reinterpret_cast<const unsigned char*>(text.data());
      if (text.empty() || utf8_length(u[0]) != text.size()) return;
      const int32_t cp = bmp_code_point(u, text.size());
      if (cp >= 0) bmp_ids_[static_cast<size_t>(cp)] = id;
    });
  }
}

int32_t BpeModel::find(std::string_view token) const {
  return vocab_.find(token);
}

std::string BpeModel::add_merge(std::string_view left, std::string_view right, int32_t rank) {
  std::string text(left);
  text += right;
  const std::vector<MergeText> one{{0, static_cast<uint32_t>(left.size()),
                                    static_cast<uint32_t>(right.size()), rank}};
  std::string why;
  add_merges(text, one, &why);
  return why;
}

size_t BpeModel::add_merges(std::string_view text, const std::vector<MergeText>& merges,
                            std::string* why) {
  if (merges_.size() == 0 && merges_.capacity() == 0) merges_.reserve(1024);
  // Three passes over groups of kGroup merges: hash and prefetch the texts' slots, look
  // them up and prefetch the pair's slot, insert. Each pass's loads were requested by
  // the one before, so a group waits on about one memory latency, not 4 * kGroup.
  constexpr size_t kGroup = 16;
  struct Pending {
    uint64_t hash[3];  // left, right, merged
    int32_t id[3];
  };
  Pending p[kGroup];
  auto part = [&](const MergeText& m, int k) {
    const size_t at = m.offset + (k == 1 ? m.left : 0);
    const size_t len = k == 0 ? m.left : k == 1 ? m.right : m.left + m.right;
    return text.substr(at, len);
  };
  for (size_t g = 0; g < merges.size(); g += kGroup) {
    const size_t n = std::min(kGroup, merges.size() - g);
    for (size_t i = 0; i < n; ++i)
      for (int k = 0; k < 3; ++k) {
        p[i].hash[k] = TokenIndex::hash(part(merges[g + i], k));
        vocab_.prefetch(p[i].hash[k]);
      }
    for (size_t i = 0; i < n; ++i) {
      for (int k = 0; k < 3; ++k) p[i].id[k] = vocab_.find(part(merges[g + i], k), p[i].hash[k]);
      if (p[i].id[0] >= 0 && p[i].id[1] >= 0) merges_.prefetch(p[i].id[0], p[i].id[1]);
    }
    for (size_t i = 0; i < n; ++i) {
      const MergeText& m = merges[g + i];
      static const char* const kWhich[3] = {"its left part", "its right part", "its result"};
      for (int k = 0; k < 3; ++k) {
        if (p[i].id[k] >= 0) continue;
        *why = fmt::format("{} '{}' is not in the vocabulary", kWhich[k], part(m, k));
        return g + i;
      }
      merges_.insert(p[i].id[0], p[i].id[1], {m.rank, p[i].id[2]});
    }
  }
  return merges.size();
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>& ids) const {
  const auto* s = reinterpret_cast<const unsigned char*>(word.data());
  int32_t pending_unk = -1;  // an unknown character not yet emitted (fuse_unk joins runs)
  auto unknown = [&]() {
    if (spec_.unk_id < 0) return;  // no unk token: the character is dropped
    if (pending_unk >= 0 && !spec_.fuse_unk) ids.push_back(pending_unk);
    pending_unk = spec_.unk_id;
  };
  auto known = [&](int32_t id) {
    if (pending_unk >= 0) ids.push_back(pending_unk), pending_unk = -1;
    ids.push_back(id);
  };
  for (size_t i = 0; i < word.size();) {
    if (spec_.byte_level) {
      const int32_t id = byte_ids_[s[i++]];
      id >= 0 ? known(id) : unknown();
      continue;
    }
    const size_t len = std::min(utf8_length(s[i]), word.size() - i);
    const int32_t cp = bmp_code_point(s + i, len);
    const int32_t id = cp >= 0 ? bmp_ids_[static_cast<size_t>(cp)] : find(word.substr(i, len));
    if (id >= 0) {
      known(id);
    } else {
      bool all_bytes = spec_.byte_fallback;
      for (size_t k = 0; all_bytes && k < len; ++k) all_bytes = byte_ids_[s[i + k]] >= 0;
      if (all_bytes) {
        for (size_t k = 0; k < len; ++k) ids.push_back(byte_ids_[s[i + k]]);
      } else {
        unknown();
      }
    }
    i += len;
  }
  if (pending_unk >= 0) ids.push_back(pending_unk);
}

const MergeTable& BpeModel::junctions() const {
  std::call_once(junctions_once_, [this] {
    // Each token's first and last initial symbol, from its text; -1 where the text gives
    // none (a character the model drops).
    int32_t ids = 0;
    vocab_.for_each([&](std::string_view, int32_t id) { ids = std::max(ids, id + 1); });
    std::vector<int32_t> first(static_cast<size_t>(ids), -1), last(first);
    plain_.assign(static_cast<size_t>(ids), 0);
    std::vector<int32_t> sym;
    vocab_.for_each([&](std::string_view text, int32_t id) {
      sym.clear();
      initial_symbols(text, sym);
      if (sym.empty()) return;
      const auto at = static_cast<size_t>(id);
      first[at] = sym.front(), last[at] = sym.back();
      plain_[at] = sym.size() == 1 && sym[0] == id;
    });
    // Few distinct pairs (34k of Gemma 3's 515k merges): a table sized for them stays in
    // cache while every merge is checked against it; one sized for the merges would not.
    junctions_.reserve(4096);
    merges_.for_each([&](int32_t a, int32_t b, MergeTable::Merge) {
      const int32_t l = last[static_cast<size_t>(a)], r = first[static_cast<size_t>(b)];
      if (l >= 0 && r >= 0) junctions_.insert(l, r, {0, 0});
    });
  });
  return junctions_;
}

void BpeModel::merge_symbols(std::string_view word, std::vector<int32_t>& out) const {
  std::vector<int32_t>& sym = scratch.sym;
  sym.clear();
  sym.reserve(word.size());  // at most one symbol a byte: no doubling on a huge word
  initial_symbols(word, sym);
  const size_t n = sym.size();
  const size_t split = std::max<size_t>(spec_.split_symbols, 2);
  if (n <= split) {
    merge_run(sym.data(), static_cast<int32_t>(n), out);
    if (n > kKeepScratchSymbols) scratch.release();
    return;
  }
  // A huge word. Merges build tokens and a token spells its symbols, so neighbours i-1
  // and i end up in one token only if some merge joins a token ending in sym[i-1] to one
  // starting with sym[i]. Where none does, and both symbols spell themselves (<unk> or a
  // <0xXX> byte does not, and could be joined whatever it spells), the two sides merge
  // independently: the word is cut there, at most every kStretchSymbols / 2 symbols
  // (short stretches keep a stretch's heap and lists in cache: 50 MB of Llama 2 text
  // merged in 15 s in stretches of 32-64k symbols, 23 s in stretches of a million).
  const MergeTable& join = junctions();
  auto plain = [&](int32_t s) { return static_cast<size_t>(s) < plain_.size() && plain_[s]; };
  const size_t half = std::min(split, kStretchSymbols) / 2;
  size_t begin = 0;
  for (size_t i = half; i < n; ++i) {
    if (i - begin < half || join.find(sym[i - 1], sym[i]).rank >= 0 ||
        !plain(sym[i - 1]) || !plain(sym[i]))
      continue;
    merge_run(sym.data() + begin, static_cast<int32_t>(i - begin), out);
    begin = i;
  }
  merge_run(sym.data() + begin, static_cast<int32_t>(n - begin), out);
  scratch.release();  // give a huge word's scratch back
}

void BpeModel::merge_run(int32_t* id, int32_t n, std::vector<int32_t>& out) const {
  if (n <= 1) {
    out.insert(out.end(), id, id + n);
    return;
  }
  // A symbol merged into its left neighbour is marked dead with id -1.
  std::vector<int32_t>& prev = scratch.prev;
  std::vector<int32_t>& next = scratch.next;
  std::vector<PendingMerge>& heap = scratch.heap;
  prev.resize(n), next.resize(n);
  for (int32_t i = 0; i < n; ++i) prev[i] = i - 1, next[i] = i + 1 < n ? i + 1 : -1;

  heap.clear();
  heap.reserve(static_cast<size_t>(n));
  const std::greater<> later;  // a min-heap on (rank, position)
  for (int32_t i = 0; i + 1 < n; ++i) {
    const MergeTable::Merge m = merges_.find(id[i], id[i + 1]);
    if (m.rank >= 0) heap.push_back({m.rank, i});
  }
  std::make_heap(heap.begin(), heap.end(), later);
  auto push = [&](PendingMerge p) {
    heap.push_back(p);
    std::push_heap(heap.begin(), heap.end(), later);
  };
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const PendingMerge top = heap.back();
    heap.pop_back();
    if (id[top.pos] < 0 || next[top.pos] < 0) continue;
    const int32_t right = next[top.pos];
    // A stale entry: the pair at this position changed since it was queued.
    const MergeTable::Merge now = merges_.find(id[top.pos], id[right]);
    if (now.rank != top.rank) continue;
    id[top.pos] = now.merged;
    id[right] = -1;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    if (prev[top.pos] >= 0) {
      const MergeTable::Merge m = merges_.find(id[prev[top.pos]], id[top.pos]);
      if (m.rank >= 0) push({m.rank, prev[top.pos]});
    }
    if (next[top.pos] >= 0) {
      const MergeTable::Merge m = merges_.find(id[top.pos], id[next[top.pos]]);
      if (m.rank >= 0) push({m.rank, top.pos});
    }
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(id[i]);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (spec_.ignore_merges) {
    const int32_t whole = find(word);
    if (whole >= 0) {
      out.push_back(whole);
      return;
    }
  }
  if (word.size() > kCacheWordBytes) {
    merge_symbols(word, out);
    return;
  }
  {
    std::shared_lock lock(cache_mutex_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_symbols(word, out);
  // What an entry costs: its text, its ids, and about 64 bytes of node and headers.
  const size_t bytes = word.size() + (out.size() - first) * sizeof(int32_t) + 64;
  std::unique_lock lock(cache_mutex_);
  if (cache_.size() >= kCacheEntries || cache_bytes_ + bytes > kCacheBytes)
    cache_.clear(), cache_bytes_ = 0;
  if (cache_.emplace(std::string(word), std::vector<int32_t>(out.begin() + static_cast<ptrdiff_t>(first),
                                                             out.end()))
          .second)
    cache_bytes_ += bytes;
}

}  // namespace hyperion::text
