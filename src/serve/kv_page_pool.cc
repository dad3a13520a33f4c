#include "serve/kv_page_pool.h"

#include <algorithm>
#include <random>

#include "base/error.h"
#include "kernels/fill.h"

namespace hyperion::serve {

KvPagePool::KvPagePool(int64_t num_pages, int64_t page_tokens)
    : page_tokens_(page_tokens), seed_(std::random_device{}()) {
  seed_ = (seed_ << 32) ^ std::random_device{}();
  HYP_CHECK(num_pages > 0 && num_pages < (int64_t{1} << 31),
            "kv cache: the page count must be in [1, 2^31), got {}", num_pages);
  HYP_CHECK(page_tokens > 0, "kv cache: kv_page_tokens must be > 0, got {}", page_tokens);
  const size_t n = static_cast<size_t>(num_pages);
  refcount_.assign(n, 0);
  page_hash_.assign(n, 0);
  page_parent_.assign(n, 0);
  page_tokens_of_.assign(n * static_cast<size_t>(page_tokens), 0);
  lru_pos_.resize(n);
  in_lru_.assign(n, 0);
  free_.reserve(n);
  // Lowest ids are handed out first.
  for (int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(static_cast<PageId>(p));
}

void KvPagePool::check_page(PageId p, const char* op) const {
  HYP_CHECK(p >= 0 && p < num_pages(), "kv cache: {} of page {} outside [0, {})", op, p,
            num_pages());
}

PageId KvPagePool::allocate() {
  PageId p = kNoPage;
  if (!free_.empty()) {
    p = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    p = lru_.front();  // evict the least recently used cached page
    lru_.pop_front();
    in_lru_[static_cast<size_t>(p)] = 0;
    by_hash_.erase(page_hash_[static_cast<size_t>(p)]);
    page_hash_[static_cast<size_t>(p)] = 0;
  } else {
    return kNoPage;
  }
  refcount_[static_cast<size_t>(p)] = 1;
  return p;
}

void KvPagePool::retain(PageId p) {
  check_page(p, "retain");
  const size_t i = static_cast<size_t>(p);
  if (in_lru_[i]) {  // a cached page comes back into use
    lru_.erase(lru_pos_[i]);
    in_lru_[i] = 0;
  } else {
    HYP_CHECK(refcount_[i] > 0, "kv cache: retain of free page {}", p);
  }
  ++refcount_[i];
}

void KvPagePool::release(PageId p) {
  check_page(p, "release");
  const size_t i = static_cast<size_t>(p);
  HYP_CHECK(refcount_[i] > 0, "kv cache: release of page {} that is not in use", p);
  if (--refcount_[i] > 0) return;
  if (page_hash_[i] != 0) {
    lru_pos_[i] = lru_.insert(lru_.end(), p);
    in_lru_[i] = 1;
  } else {
    free_.push_back(p);
  }
}

uint64_t KvPagePool::hash(uint64_t parent, const int32_t* tokens) const {
  uint64_t h = splitmix64(parent ^ seed_ ^ 0x9e3779b97f4a7c15ull);
  for (int64_t i = 0; i < page_tokens_; ++i)
    h = splitmix64(h ^ static_cast<uint32_t>(tokens[i]));
  // 0 means "not published" in the pool.
  return h == 0 ? 1 : h;
}

bool KvPagePool::publish(PageId p, uint64_t hash, uint64_t parent, const int32_t* tokens) {
  check_page(p, "publish");
  const size_t i = static_cast<size_t>(p);
  HYP_CHECK(refcount_[i] > 0, "kv cache: publish of page {} that is not in use", p);
  HYP_CHECK(hash != 0, "kv cache: publish with hash 0");
  if (page_hash_[i] != 0) return page_hash_[i] == hash;
  if (!by_hash_.emplace(hash, p).second) return false;
  page_hash_[i] = hash;
  page_parent_[i] = parent;
  std::copy(tokens, tokens + page_tokens_, page_tokens_of_.begin() + static_cast<ptrdiff_t>(i) * page_tokens_);
  return true;
}

PageId KvPagePool::lookup(uint64_t hash, uint64_t parent, const int32_t* tokens) {
  ++lookups_;
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return kNoPage;
  const size_t i = static_cast<size_t>(it->second);
  const auto own = page_tokens_of_.begin() + static_cast<ptrdiff_t>(i) * page_tokens_;
  if (page_parent_[i] != parent || !std::equal(tokens, tokens + page_tokens_, own))
    return kNoPage;  // a hash collision: another prefix's KV
  ++hits_;
  retain(it->second);
  return it->second;
}

int64_t SequencePages::acquire_prefix(KvPagePool& pool, const std::vector<int32_t>& prompt) {
  HYP_CHECK(pages_.empty() && length_ == 0, "kv cache: acquire_prefix on a started sequence");
  const int64_t pt = pool.page_tokens();
  const int64_t usable = prompt.empty() ? 0 : (static_cast<int64_t>(prompt.size()) - 1) / pt;
  uint64_t parent = root_;
  for (int64_t i = 0; i < usable; ++i) {
    const uint64_t h = pool.hash(parent, prompt.data() + i * pt);
    const PageId p = pool.lookup(h, parent, prompt.data() + i * pt);
    if (p == kNoPage) break;
    pages_.push_back(p);
    hashes_.push_back(h);
    tokens_.insert(tokens_.end(), prompt.begin() + i * pt, prompt.begin() + (i + 1) * pt);
    parent = h;
  }
  length_ = static_cast<int64_t>(pages_.size()) * pt;
  cached_tokens_ = length_;
  published_ = static_cast<int64_t>(pages_.size());
  return length_;
}

bool SequencePages::append(KvPagePool& pool, const int32_t* tokens, int64_t n) {
  HYP_CHECK(n >= 0, "kv cache: append of {} tokens", n);
  const int64_t pt = pool.page_tokens();
  const int64_t need = (length_ + n + pt - 1) / pt - static_cast<int64_t>(pages_.size());
  if (need > pool.pages_available()) return false;
  for (int64_t i = 0; i < need; ++i) {
    const PageId p = pool.allocate();
    HYP_CHECK(p != kNoPage, "kv cache: allocation failed with pages available");
    pages_.push_back(p);
  }
  tokens_.insert(tokens_.end(), tokens, tokens + n);
  length_ += n;
  return true;
}

void SequencePages::publish_full_pages(KvPagePool& pool) {
  const int64_t pt = pool.page_tokens();
  const int64_t full = length_ / pt;
  for (int64_t i = published_; i < full; ++i) {
    const uint64_t parent = i == 0 ? root_ : hashes_[static_cast<size_t>(i - 1)];
    const uint64_t h = pool.hash(parent, tokens_.data() + i * pt);
    hashes_.push_back(h);
    if (pages_[static_cast<size_t>(i)] != kNoPage)
      pool.publish(pages_[static_cast<size_t>(i)], h, parent, tokens_.data() + i * pt);
  }
  published_ = std::max(published_, full);
}

void SequencePages::release(KvPagePool& pool) {
  for (PageId p : pages_)
    if (p != kNoPage) pool.release(p);
  pages_.clear();
  tokens_.clear();
  hashes_.clear();
  length_ = cached_tokens_ = published_ = dropped_ = 0;
}

int64_t SequencePages::drop_before(KvPagePool& pool, int64_t first) {
  const int64_t end = std::min<int64_t>(first, static_cast<int64_t>(pages_.size()));
  int64_t n = 0;
  for (int64_t i = dropped_; i < end; ++i) {
    PageId& p = pages_[static_cast<size_t>(i)];
    if (p == kNoPage) continue;
    pool.release(p);
    p = kNoPage;
    ++n;
  }
  dropped_ = std::max(dropped_, end);
  return n;
}

}  // namespace hyperion::serve
