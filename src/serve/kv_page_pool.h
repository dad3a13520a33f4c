// The page allocator behind the serving engine's KV cache (vLLM / JetStream paged
// attention): the cache is one pool of fixed-size pages of `page_tokens` positions;
// every request holds a page table (its pages in position order); pages return to the
// pool when the request ends or its client goes away.
//
// Prefix caching: a full page can be published under a hash of every token up to its end
// (chained page by page, seeded at random per pool so that no client can craft a
// collision). The hash only finds a candidate: the page keeps its own tokens and its
// parent's hash, and a lookup is a hit only when both equal the request's, so a page's
// own hash colliding never reuses KV computed for other tokens. (An earlier page's hash
// colliding as well, with a per-pool random seed, has odds near 2^-64.) A page that is released
// to a reference count of zero while published stays in the cache, reusable by the next
// request with the same prefix, until a fresh allocation needs the memory: then the least
// recently used cached page is evicted. A page is in exactly one state:
//
//   free     on the free list, no contents
//   used     referenced by >= 1 request (refcount > 0), maybe published
//   cached   refcount 0 but published: reusable, evictable (LRU)
//
// so free + used + cached == the pool size at all times (pages_*() report each).
// Single-threaded by design: the engine's scheduler thread owns the pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace hyperion::serve {

using PageId = int32_t;
inline constexpr PageId kNoPage = -1;

class KvPagePool {
 public:
  KvPagePool(int64_t num_pages, int64_t page_tokens);

  int64_t num_pages() const { return static_cast<int64_t>(refcount_.size()); }
  int64_t page_tokens() const { return page_tokens_; }
  int64_t pages_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t pages_cached() const { return static_cast<int64_t>(lru_.size()); }
  int64_t pages_used() const { return num_pages() - pages_free() - pages_cached(); }
  // Pages an allocation can still obtain (free, or cached and evictable).
  int64_t pages_available() const { return pages_free() + pages_cached(); }
  int32_t refcount(PageId p) const { return refcount_[static_cast<size_t>(p)]; }

  // A page for new contents, with refcount 1: from the free list, else by evicting the
  // least recently used cached page (which is unpublished). kNoPage when every page is
  // in use.
  PageId allocate();
  void retain(PageId p);
  // Drops one reference; at zero the page becomes cached (if published) or free.
  void release(PageId p);

  // Chained hash of one full page of `tokens` (page_tokens() of them) after a prefix
  // whose hash is `parent` (0 for the first page). Never 0.
  uint64_t hash(uint64_t parent, const int32_t* tokens) const;
  // Publishes a full, used page holding `tokens` after the prefix `parent` under `hash`
  // (= hash(parent, tokens)) for reuse. A hash already published keeps its page (the new
  // one stays private); returns whether this page was published.
  bool publish(PageId p, uint64_t hash, uint64_t parent, const int32_t* tokens);
  // The page published under `hash` whose tokens and parent are `tokens` and `parent`,
  // retained (refcount + 1), or kNoPage. Counts a hit or a miss for prefix_hit_rate().
  PageId lookup(uint64_t hash, uint64_t parent, const int32_t* tokens);
  int64_t prefix_lookups() const { return lookups_; }
  int64_t prefix_hits() const { return hits_; }

 private:
  void check_page(PageId p, const char* op) const;

  int64_t page_tokens_;
  std::vector<int32_t> refcount_;
  std::vector<uint64_t> page_hash_;    // published hash, 0 = not published
  std::vector<uint64_t> page_parent_;  // a published page's parent hash
  std::vector<int32_t> page_tokens_of_;  // a published page's tokens (page_tokens_ each)
  uint64_t seed_;
  std::vector<PageId> free_;
  std::list<PageId> lru_;  // cached pages, least recently released first
  std::vector<std::list<PageId>::iterator> lru_pos_;
  std::vector<char> in_lru_;
  std::unordered_map<uint64_t, PageId> by_hash_;
  int64_t lookups_ = 0, hits_ = 0;
};

// One request's page table and its token history (for prefix hashes).
class SequencePages {
 public:
  const std::vector<PageId>& pages() const { return pages_; }
  int64_t length() const { return length_; }
  // Prompt tokens served from the prefix cache by acquire_prefix().
  int64_t cached_tokens() const { return cached_tokens_; }

  // The prefix every page hash chains from (0: the base model's): a sequence whose KV
  // differs for the same tokens (a LoRA adapter's) has its own root, so its pages are
  // found only by sequences with the same root. Set before acquire_prefix().
  void set_root(uint64_t root) { root_ = root; }
  // Starts the sequence with the longest cached prefix of `prompt` in whole pages (at
  // most prompt.size() - 1 tokens, so the last prompt token is always computed).
  // Returns the number of prompt tokens whose KV is already in the cache.
  int64_t acquire_prefix(KvPagePool& pool, const std::vector<int32_t>& prompt);
  // Makes room for `n` more tokens (allocating pages as needed) and records them; false
  // (with nothing changed) if the pool cannot supply the pages.
  bool append(KvPagePool& pool, const int32_t* tokens, int64_t n);
  // Publishes every full page not yet published (after its KV has been written).
  void publish_full_pages(KvPagePool& pool);
  // Releases every page (request finished or cancelled).
  void release(KvPagePool& pool);
  // Releases pages [0, first) early (a sliding window on every layer: no step reads them
  // again); their page-table entries become kNoPage. Returns how many were released.
  int64_t drop_before(KvPagePool& pool, int64_t first);
  // Pages this sequence holds (its table less the dropped ones).
  int64_t pages_held() const { return static_cast<int64_t>(pages_.size()) - dropped_; }

 private:
  std::vector<PageId> pages_;
  std::vector<int32_t> tokens_;
  std::vector<uint64_t> hashes_;  // chained hash per full page
  uint64_t root_ = 0;             // the first page's parent
  int64_t length_ = 0, cached_tokens_ = 0, published_ = 0;
  int64_t dropped_ = 0;  // leading pages released by drop_before
};

}  // namespace hyperion::serve
