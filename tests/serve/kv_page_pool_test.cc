#include "serve/kv_page_pool.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "base/error.h"

namespace hyperion::serve {
namespace {

void expect_accounting(const KvPagePool& pool) {
  EXPECT_EQ(pool.pages_free() + pool.pages_used() + pool.pages_cached(), pool.num_pages());
  EXPECT_GE(pool.pages_used(), 0);
}

std::vector<int32_t> tokens(int64_t n, int32_t start) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = start + static_cast<int32_t>(i);
  return t;
}

TEST(KvPagePool, AllocateReleaseAndExhaustion) {
  KvPagePool pool(3, 4);
  const PageId a = pool.allocate(), b = pool.allocate(), c = pool.allocate();
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(c, 2);
  EXPECT_EQ(pool.allocate(), kNoPage);
  EXPECT_EQ(pool.pages_used(), 3);
  pool.retain(b);
  pool.release(b);
  EXPECT_EQ(pool.refcount(b), 1);
  pool.release(b);
  EXPECT_EQ(pool.pages_free(), 1);
  EXPECT_EQ(pool.allocate(), b);
  EXPECT_THROW(pool.release(7), Error);
  pool.release(a);
  EXPECT_THROW(pool.release(a), Error);  // double release is caught
  EXPECT_THROW(KvPagePool(0, 4), Error);
  EXPECT_THROW(KvPagePool(4, 0), Error);
  expect_accounting(pool);
}

TEST(KvPagePool, SharedPrefixReusesFullPagesAndEvictsLeastRecentlyUsed) {
  KvPagePool pool(8, 4);
  const std::vector<int32_t> prompt = tokens(10, 100);  // 2 full pages + 2 tokens
  SequencePages first;
  EXPECT_EQ(first.acquire_prefix(pool, prompt), 0);
  ASSERT_TRUE(first.append(pool, prompt.data(), 10));
  EXPECT_EQ(first.pages().size(), 3u);
  first.publish_full_pages(pool);
  // A second request with the same prompt shares the two full pages.
  SequencePages second;
  EXPECT_EQ(second.acquire_prefix(pool, prompt), 8);
  EXPECT_EQ(second.pages()[0], first.pages()[0]);
  EXPECT_EQ(second.pages()[1], first.pages()[1]);
  EXPECT_EQ(pool.refcount(first.pages()[0]), 2);
  ASSERT_TRUE(second.append(pool, prompt.data() + 8, 2));
  EXPECT_NE(second.pages()[2], first.pages()[2]);  // the partial page is private
  EXPECT_EQ(pool.prefix_hits(), 2);
  // A prompt differing in its first page shares nothing (hashes are chained).
  std::vector<int32_t> other = prompt;
  other[0] = 7;
  SequencePages third;
  EXPECT_EQ(third.acquire_prefix(pool, other), 0);
  // After both finish, the published pages stay cached, the partial ones are freed.
  first.release(pool);
  second.release(pool);
  EXPECT_EQ(pool.pages_used(), 0);
  EXPECT_EQ(pool.pages_cached(), 2);
  expect_accounting(pool);
  SequencePages again;
  EXPECT_EQ(again.acquire_prefix(pool, prompt), 8);  // served from the cache
  again.release(pool);
  // Exhausting the free list evicts cached pages, least recently released first.
  std::vector<PageId> all;
  for (int i = 0; i < 8; ++i) all.push_back(pool.allocate());
  EXPECT_EQ(pool.allocate(), kNoPage);
  EXPECT_EQ(pool.pages_cached(), 0);
  SequencePages gone;
  EXPECT_EQ(gone.acquire_prefix(pool, prompt), 0);  // evicted pages are no longer found
  for (PageId p : all) pool.release(p);
  EXPECT_EQ(pool.pages_free(), 8);
}

TEST(KvPagePool, PromptOfWholePagesKeepsItsLastTokenToCompute) {
  KvPagePool pool(4, 4);
  const std::vector<int32_t> prompt = tokens(8, 1);
  SequencePages a;
  ASSERT_TRUE(a.append(pool, prompt.data(), 8));
  a.publish_full_pages(pool);
  SequencePages b;
  // Only the first page is reused: the last prompt token must run to produce logits.
  EXPECT_EQ(b.acquire_prefix(pool, prompt), 4);
  a.release(pool);
  b.release(pool);
}

TEST(KvPagePool, AppendFailsWithoutChangingState) {
  KvPagePool pool(2, 4);
  SequencePages s;
  const auto t = tokens(12, 0);
  EXPECT_FALSE(s.append(pool, t.data(), 12));  // needs 3 pages
  EXPECT_EQ(s.length(), 0);
  EXPECT_EQ(pool.pages_free(), 2);
  EXPECT_TRUE(s.append(pool, t.data(), 8));
  EXPECT_FALSE(s.append(pool, t.data(), 1));
  EXPECT_EQ(s.length(), 8);
  s.release(pool);
  EXPECT_EQ(pool.pages_free(), 2);
}

// A lookup whose hash matches a published page but whose tokens (or parent) differ is a
// collision: it must miss rather than hand out KV computed for another prompt.
TEST(KvPagePool, AHashCollisionIsAMissNotAnotherPromptsKv) {
  KvPagePool pool(4, 4);
  const std::vector<int32_t> a = tokens(4, 10), b = tokens(4, 20);
  const uint64_t h = pool.hash(0, a.data());
  EXPECT_NE(h, 0u);
  const PageId p = pool.allocate();
  ASSERT_NE(p, kNoPage);
  EXPECT_TRUE(pool.publish(p, h, 0, a.data()));
  pool.release(p);  // refcount 0 and published: cached
  EXPECT_EQ(pool.refcount(p), 0);
  EXPECT_EQ(pool.pages_cached(), 1);

  // Same hash, other tokens (as a crafted or accidental collision would give): a miss.
  EXPECT_EQ(pool.lookup(h, 0, b.data()), kNoPage);
  EXPECT_EQ(pool.refcount(p), 0);
  EXPECT_EQ(pool.pages_cached(), 1);
  // Same hash and tokens but another parent prefix: also a miss.
  EXPECT_EQ(pool.lookup(h, pool.hash(0, b.data()), a.data()), kNoPage);
  EXPECT_EQ(pool.refcount(p), 0);
  EXPECT_EQ(pool.pages_cached(), 1);
  EXPECT_EQ(pool.prefix_hits(), 0);
  EXPECT_EQ(pool.prefix_lookups(), 2);

  // The right tokens and parent: a hit, and the page comes back into use.
  EXPECT_EQ(pool.lookup(h, 0, a.data()), p);
  EXPECT_EQ(pool.refcount(p), 1);
  EXPECT_EQ(pool.pages_cached(), 0);
  EXPECT_EQ(pool.prefix_hits(), 1);
  EXPECT_EQ(pool.prefix_lookups(), 3);
  pool.release(p);
  expect_accounting(pool);
}

TEST(KvPagePool, HashesDependOnAPerPoolSeed) {
  KvPagePool one(2, 4), two(2, 4);
  const std::vector<int32_t> t = tokens(4, 1);
  // Deterministic within a pool...
  EXPECT_EQ(one.hash(0, t.data()), one.hash(0, t.data()));
  EXPECT_NE(one.hash(0, t.data()), 0u);
  // ...but seeded per pool, so hashes cannot be predicted (or collisions crafted) from
  // outside. Two 64-bit seeds agreeing has probability ~2^-64.
  EXPECT_NE(one.hash(0, t.data()), two.hash(0, t.data()));
  // The chain and the tokens both feed the hash.
  EXPECT_NE(one.hash(0, t.data()), one.hash(one.hash(0, t.data()), t.data()));
  EXPECT_NE(one.hash(0, t.data()), one.hash(0, tokens(4, 2).data()));
}

// Requests arrive, grow, publish and finish or are cancelled at random; the page
// accounting holds after every operation and every page is back when all are gone.
TEST(KvPagePool, AccountingUnderRandomArrivalAndCancel) {
  KvPagePool pool(64, 8);
  std::mt19937 rng(3);
  std::vector<SequencePages> live;
  const std::vector<std::vector<int32_t>> prompts = {tokens(40, 0), tokens(17, 500), tokens(64, 0),
                                                     tokens(9, 900)};
  for (int step = 0; step < 3000; ++step) {
    const int op = static_cast<int>(rng() % 4);
    if (op == 0 || live.empty()) {
      SequencePages s;
      const auto& p = prompts[rng() % prompts.size()];
      const int64_t cached = s.acquire_prefix(pool, p);
      if (s.append(pool, p.data() + cached, static_cast<int64_t>(p.size()) - cached)) {
        s.publish_full_pages(pool);
        live.push_back(std::move(s));
      } else {
        s.release(pool);  // admission failed: give back the shared prefix
      }
    } else if (op == 1) {
      SequencePages& s = live[rng() % live.size()];
      const int32_t tok = static_cast<int32_t>(rng() % 1000);
      if (s.append(pool, &tok, 1)) s.publish_full_pages(pool);
    } else {
      const size_t i = rng() % live.size();
      live[i].release(pool);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    }
    ASSERT_EQ(pool.pages_free() + pool.pages_used() + pool.pages_cached(), pool.num_pages());
    int64_t refs = 0;
    for (const auto& s : live) refs += static_cast<int64_t>(s.pages().size());
    int64_t counted = 0;
    for (PageId p = 0; p < pool.num_pages(); ++p) counted += pool.refcount(p);
    ASSERT_EQ(counted, refs) << "step " << step;
  }
  for (auto& s : live) s.release(pool);
  EXPECT_EQ(pool.pages_used(), 0);
  EXPECT_EQ(pool.pages_free() + pool.pages_cached(), pool.num_pages());
  EXPECT_GT(pool.prefix_hits(), 0);
}

}  // namespace
}  // namespace hyperion::serve
