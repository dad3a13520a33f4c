#include "kernels/paged_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/attention.h"
#include "kernels/quantize.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

using namespace testing_util;

constexpr DType kCacheDTypes[] = {DType::kF32, DType::kBF16, DType::kI8, DType::kE4M3};

// One layer's page pool. Everything starts as 0xFF bytes (NaN for f32 / bf16 / e4m3 and
// the scales), so reading an unwritten position that is not masked shows up as NaN.
struct CacheStore {
  PagedKvCache c;
  std::vector<unsigned char> k, v;
  std::vector<float> ks, vs;
  CacheStore(DType dt, int64_t pages, int64_t pt, int64_t hkv, int64_t d) {
    const size_t n = size_t(pages * pt * hkv * d) * dtype_size(dt);
    k.assign(n, 0xFF);
    v.assign(n, 0xFF);
    c.k = k.data();
    c.v = v.data();
    if (dt == DType::kI8 || dt == DType::kE4M3) {
      ks.resize(size_t(pages * hkv * pt));
      vs.resize(ks.size());
      std::memset(ks.data(), 0xFF, ks.size() * sizeof(float));
      std::memset(vs.data(), 0xFF, vs.size() * sizeof(float));
      c.k_scale = ks.data();
      c.v_scale = vs.data();
    }
    c.dtype = dt;
    c.num_pages = pages;
    c.page_tokens = pt;
    c.n_kv_heads = hkv;
    c.head_dim = d;
  }
};

// A batch of sequences: lengths, shuffled page tables out of one pool, and the f32 keys
// and values [len, hkv, d] of each row (what gets written to the cache).
struct Batch {
  int64_t hq = 0, hkv = 0, d = 0, pt = 0, pages = 0;
  std::vector<int64_t> lengths;
  std::vector<std::vector<int32_t>> tables;
  std::vector<Tensor> keys, values;
  std::vector<PagedAttentionRow> rows;
  Tensor q;

  // `cover`: every page table covers at least this many positions (for padded mode).
  Batch(std::vector<int64_t> lens, int64_t hq_, int64_t hkv_, int64_t d_, int64_t pt_,
        std::mt19937& rng, int64_t cover = 0)
      : hq(hq_), hkv(hkv_), d(d_), pt(pt_), lengths(std::move(lens)) {
    std::vector<int64_t> npages;
    for (int64_t len : lengths) {
      npages.push_back((std::max(len, cover) + pt - 1) / pt);
      pages += npages.back();
    }
    pages += 3;  // a few never used
    std::vector<int32_t> ids(static_cast<size_t>(pages));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    size_t next = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
      tables.emplace_back(ids.begin() + long(next), ids.begin() + long(next + size_t(npages[i])));
      next += size_t(npages[i]);
      keys.push_back(random_tensor(DType::kF32, {lengths[i], hkv, d}, rng));
      values.push_back(random_tensor(DType::kF32, {lengths[i], hkv, d}, rng));
      rows.push_back({tables.back().data(), lengths[i]});
    }
    q = random_tensor(DType::kF32, {int64_t(lengths.size()), hq, d}, rng);
  }
  int64_t n() const { return int64_t(lengths.size()); }
  int64_t max_length() const { return *std::max_element(lengths.begin(), lengths.end()); }

  std::vector<int64_t> slots(size_t i) const {
    std::vector<int64_t> s(static_cast<size_t>(lengths[i]));
    for (int64_t p = 0; p < lengths[i]; ++p)
      s[size_t(p)] = int64_t(tables[i][size_t(p / pt)]) * pt + p % pt;
    return s;
  }

  CacheStore cache(DType dt, DType src = DType::kF32) const {
    CacheStore store(dt, pages, pt, hkv, d);
    for (size_t i = 0; i < lengths.size(); ++i) {
      const Tensor k = converted(keys[i], src), v = converted(values[i], src);
      paged_kv_write(store.c, k, v, slots(i).data());
    }
    return store;
  }

  static Tensor converted(const Tensor& t, DType dt) {
    Tensor out(dt, t.shape());
    convert_any(t.data(), DType::kF32, out.data(), dt, size_t(t.numel()));
    return out;
  }
};

Tensor run(const CacheStore& store, const Batch& b, DType io = DType::kF32,
           PagedAttentionParams params = {}) {
  const Tensor q = Batch::converted(b.q, io);
  Tensor out(io, {b.n(), b.hq, b.d});
  paged_attention(store.c, q, b.rows.data(), out, params);
  return out;
}

Tensor run_ref(const CacheStore& store, const Batch& b, DType io = DType::kF32) {
  const Tensor q = Batch::converted(b.q, io);
  Tensor out(io, {b.n(), b.hq, b.d});
  ref::paged_attention(store.c, q, b.rows.data(), out);
  return out;
}

// max |a - b| (and that both are finite).
double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    EXPECT_TRUE(std::isfinite(at(a, i)) && std::isfinite(at(b, i))) << "element " << i;
    m = std::max(m, std::fabs(at(a, i) - at(b, i)));
  }
  return m;
}

double max_abs(const Tensor& a) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) m = std::max(m, std::fabs(at(a, i)));
  return m;
}

// Each row of `out` (paged attention over the batch's rows) against the contiguous
// attention reference of that row's one query over its keys, with `ap`'s window, scale
// and cap.
void expect_rows_match_contiguous(const Batch& b, const Tensor& out, AttentionParams ap) {
  const int64_t hq = b.hq, hkv = b.hkv, d = b.d;
  for (int64_t i = 0; i < b.n(); ++i) {
    const int64_t len = b.lengths[size_t(i)];
    Tensor q(DType::kF32, {1, 1, hq, d}), o(DType::kF32, {1, 1, hq, d});
    Tensor lse(DType::kF32, {1, hq, 1});
    std::memcpy(q.data(), b.q.as<float>() + i * hq * d, size_t(hq * d) * sizeof(float));
    ref::attention_forward(q, b.keys[size_t(i)].view().reshape({1, len, hkv, d}),
                           b.values[size_t(i)].view().reshape({1, len, hkv, d}), o, lse, ap);
    for (int64_t j = 0; j < hq * d; ++j)
      ASSERT_NEAR(at(out, i * hq * d + j), at(o, j), 1e-5) << "row " << i << " elem " << j;
  }
}

TEST(PagedAttention, BytesPerToken) {
  EXPECT_EQ(paged_kv_bytes_per_token(DType::kBF16, 8, 64), 2 * 8 * 64 * 2);
  EXPECT_EQ(paged_kv_bytes_per_token(DType::kF32, 2, 24), 2 * 2 * 24 * 4);
  EXPECT_EQ(paged_kv_bytes_per_token(DType::kI8, 8, 64), 2 * 8 * (64 + 4));
  EXPECT_EQ(paged_kv_bytes_per_token(DType::kE4M3, 1, 128), 2 * (128 + 4));
}

TEST(PagedAttention, WriteStoresRows) {
  std::mt19937 rng(1);
  const Batch b({7, 20}, 4, 2, 24, 5, rng);
  for (DType src : {DType::kF32, DType::kBF16})
    for (DType dt : kCacheDTypes) {
      const CacheStore s = b.cache(dt, src);
      for (size_t i = 0; i < b.lengths.size(); ++i) {
        const Tensor k = Batch::converted(b.keys[i], src);
        const auto slots = b.slots(i);
        for (int64_t p = 0; p < b.lengths[i]; ++p)
          for (int64_t h = 0; h < b.hkv; ++h) {
            const int64_t slot = slots[size_t(p)];
            const int64_t idx = ((slot / b.pt) * b.hkv + h) * b.pt + slot % b.pt;
            const unsigned char* x =
                k.as<unsigned char>() + (p * b.hkv + h) * b.d * dtype_size(src);
            std::vector<unsigned char> want(size_t(b.d) * dtype_size(dt));
            if (dt == DType::kI8 || dt == DType::kE4M3) {
              EXPECT_EQ(s.ks[size_t(idx)], ref::quantize_row(x, src, b.d, want.data(), dt));
            } else {
              convert_any(x, src, want.data(), dt, size_t(b.d));
            }
            ASSERT_EQ(
                std::memcmp(want.data(), s.k.data() + idx * b.d * dtype_size(dt), want.size()), 0)
                << dtype_name(dt) << " row " << i << " pos " << p << " head " << h;
          }
      }
    }
}

TEST(PagedAttention, ReadReturnsTheWrittenRows) {
  std::mt19937 rng(4);
  const Batch b({1, 9, 33}, 4, 2, 24, 5, rng);
  for (DType out : {DType::kF32, DType::kBF16})
    for (DType dt : kCacheDTypes) {
      const CacheStore s = b.cache(dt, DType::kF32);
      for (size_t i = 0; i < b.lengths.size(); ++i) {
        const int64_t len = b.lengths[i];
        Tensor k(out, {len, b.hkv, b.d}), v(out, {len, b.hkv, b.d});
        paged_kv_read(s.c, b.tables[i].data(), len, k, v);
        for (int64_t j = 0; j < len * b.hkv * b.d; ++j) {
          const float want_k = b.keys[i].as<float>()[j], want_v = b.values[i].as<float>()[j];
          const float got_k = load_as_f32(k.data(), out, size_t(j));
          const float got_v = load_as_f32(v.data(), out, size_t(j));
          // Exact for f32 into f32; else the cache's (and the output's) rounding: int8 is
          // within half a step of its row's absmax / 127.
          const float tol = dt == DType::kF32 && out == DType::kF32 ? 0.0f
                            : dt == DType::kI8                      ? 0.03f
                            : dt == DType::kE4M3                    ? 0.25f
                                                                    : 0.02f;
          ASSERT_NEAR(got_k, want_k, tol * std::max(1.0f, std::fabs(want_k)))
              << dtype_name(dt) << " -> " << dtype_name(out) << " row " << i << " element " << j;
          ASSERT_NEAR(got_v, want_v, tol * std::max(1.0f, std::fabs(want_v)));
        }
      }
    }
  const CacheStore s = b.cache(DType::kBF16, DType::kF32);
  Tensor k(DType::kF32, {9, b.hkv, b.d}), v(DType::kF32, {9, b.hkv, b.d});
  EXPECT_THROW(paged_kv_read(s.c, b.tables[1].data(), 10, k, v), Error);
  std::vector<int32_t> bad{999, 999};
  EXPECT_THROW(paged_kv_read(s.c, bad.data(), 9, k, v), Error);
}

TEST(PagedAttention, MatchesContiguousAttentionF32) {
  std::mt19937 rng(2);
  for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{8, 2}, {4, 4}})
    for (int64_t pt : {16, 5}) {
      const Batch b({1, pt, pt + 1, 300, 37}, hq, hkv, 64, pt, rng);
      const CacheStore s = b.cache(DType::kF32);
      SCOPED_TRACE(::testing::Message() << "hq " << hq << " pt " << pt);
      AttentionParams ap;
      ap.causal = false;
      expect_rows_match_contiguous(b, run(s, b), ap);
    }
}

// A sliding window: each row attends to its `window` latest keys only. Checked against
// the contiguous attention kernel's own window (a query at position len - 1 over the row's
// keys), and, for every cache type and the SIMD and portable paths, against the reference;
// lengths around the window and the task chunks (a window starting mid-chunk, mid-page).
TEST(PagedAttention, SlidingWindow) {
  std::mt19937 rng(12);
  for (int64_t window : {1, 7, 40, 299, 1000})
    for (int64_t pt : {16, 5}) {
      SCOPED_TRACE(::testing::Message() << "window " << window << " pt " << pt);
      const Batch b({1, pt, 41, 300, 2 * pt + 3, 1500}, 8, 2, 64, pt, rng);
      PagedAttentionParams params;
      params.window = window;
      const CacheStore s = b.cache(DType::kF32);
      AttentionParams ap;
      ap.window = window;
      expect_rows_match_contiguous(b, run(s, b, DType::kF32, params), ap);
      for (DType dt : kCacheDTypes) {
        SCOPED_TRACE(dtype_name(dt));
        const CacheStore c = b.cache(dt);
        Tensor want(DType::kF32, {b.n(), 8, 64});
        ref::paged_attention(c.c, b.q, b.rows.data(), want, params);
        for (bool portable : {false, true}) {
          params.force_portable = portable;
          EXPECT_LT(max_abs_diff(run(c, b, DType::kF32, params), want), 1e-5) << portable;
        }
        params.force_portable = false;
      }
    }
  // Padded mode has no window.
  const Batch b({3}, 2, 1, 16, 4, rng, 8);
  const CacheStore s = b.cache(DType::kF32);
  PagedAttentionParams bad;
  bad.mode = PagedAttentionMode::kPadded;
  bad.padded_length = 8;
  bad.window = 2;
  Tensor out(DType::kF32, {1, 2, 16});
  EXPECT_THROW(paged_attention(s.c, b.q, b.rows.data(), out, bad), Error);
}

// Gemma 2's soft-capped scores, with and without a window, ragged and padded, against the
// contiguous attention kernel's cap and, for every cache type, the reference.
TEST(PagedAttention, SoftCap) {
  std::mt19937 rng(13);
  for (int64_t window : {0, 40})
    for (float cap : {0.5f, 50.0f}) {
      SCOPED_TRACE(::testing::Message() << "window " << window << " cap " << cap);
      const Batch b({1, 16, 41, 300}, 8, 2, 64, 16, rng, 300);
      PagedAttentionParams params;
      params.window = window;
      params.softcap = cap;
      params.scale = 0.5f;  // large scores: the cap bends them
      const CacheStore s = b.cache(DType::kF32);
      AttentionParams ap;
      ap.window = window;
      ap.softcap = cap;
      ap.scale = 0.5f;
      expect_rows_match_contiguous(b, run(s, b, DType::kF32, params), ap);
      for (DType dt : kCacheDTypes) {
        SCOPED_TRACE(dtype_name(dt));
        const CacheStore c = b.cache(dt);
        Tensor want(DType::kF32, {b.n(), 8, 64});
        ref::paged_attention(c.c, b.q, b.rows.data(), want, params);
        EXPECT_LT(max_abs_diff(run(c, b, DType::kF32, params), want), 1e-5);
        if (window == 0) {
          PagedAttentionParams padded = params;
          padded.mode = PagedAttentionMode::kPadded;
          padded.padded_length = 300;
          EXPECT_LT(max_abs_diff(run(c, b, DType::kF32, padded), want), 1e-5);
        }
      }
    }
  const Batch b({3}, 2, 1, 16, 4, rng, 8);
  const CacheStore s = b.cache(DType::kF32);
  PagedAttentionParams bad;
  bad.softcap = -1.0f;
  Tensor out(DType::kF32, {1, 2, 16});
  EXPECT_THROW(paged_attention(s.c, b.q, b.rows.data(), out, bad), Error);
}

TEST(PagedAttention, MatchesReferenceAllCacheTypes) {
  std::mt19937 rng(3);
  for (DType dt : kCacheDTypes)
    for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{8, 2}, {4, 4}})
      for (int64_t d : {24, 64, 80})
        for (int64_t pt : {16, 5}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " hq " << hq << " hkv " << hkv
                                            << " d " << d << " pt " << pt);
          const Batch b({1, pt, pt + 1, 300, 2 * pt + 3}, hq, hkv, d, pt, rng);
          const CacheStore s = b.cache(dt);
          EXPECT_LT(max_abs_diff(run(s, b), run_ref(s, b)), 1e-5);
        }
}

TEST(PagedAttention, OddGroupsAndHeadSizes) {
  // Groups that split into 8 + 8, 4 + 2 and 4 + 2 + 1 heads; head sizes with and without
  // a full vector, and a multiple of 32 (a bf16 cache's pairs path).
  std::mt19937 rng(4);
  for (DType dt : kCacheDTypes)
    for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{16, 1}, {12, 2}, {7, 1}, {8, 1}})
      for (int64_t d : {1, 16, 17, 96, 130}) {  // 96: bf16 pairs of 32 values
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dt) << " hq " << hq << " hkv " << hkv << " d " << d);
        const Batch b({3, 40}, hq, hkv, d, 16, rng);
        const CacheStore s = b.cache(dt);
        EXPECT_LT(max_abs_diff(run(s, b), run_ref(s, b)), 1e-5);
      }
}

TEST(PagedAttention, MixedBatchLongAndShort) {
  // One row long enough to be split into several page ranges (merged flash-decoding
  // style) and seven short ones.
  std::mt19937 rng(5);
  for (DType dt : kCacheDTypes)
    for (int64_t pt : {16, 5}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " pt " << pt);
      const Batch b({1300, 3, 17, 1, 64, 5, 100, 33}, 8, 2, 64, pt, rng);
      const CacheStore s = b.cache(dt);
      EXPECT_LT(max_abs_diff(run(s, b), run_ref(s, b)), 1e-5);
      // bf16 activations: the same up to the output's bf16 rounding.
      const Tensor ob = run(s, b, DType::kBF16), rb = run_ref(s, b, DType::kBF16);
      EXPECT_LT(max_abs_diff(ob, rb), 1e-2);
    }
}

TEST(PagedAttention, QuantisedCacheCloseToBf16) {
  std::mt19937 rng(6);
  const Batch b({1300, 3, 17, 1, 64, 5, 100, 33}, 8, 2, 64, 16, rng);
  const Tensor bf = run(b.cache(DType::kBF16), b);
  const double scale = max_abs(bf);
  const double rel_i8 = max_abs_diff(run(b.cache(DType::kI8), b), bf) / scale;
  const double rel_e4m3 = max_abs_diff(run(b.cache(DType::kE4M3), b), bf) / scale;
  std::printf("max abs diff / max abs value vs bf16 cache: int8 %.3g, e4m3 %.3g\n", rel_i8,
              rel_e4m3);
  EXPECT_LT(rel_i8, 2e-2);
  EXPECT_LT(rel_e4m3, 6e-2);
}

TEST(PagedAttention, PaddedEqualsRagged) {
  std::mt19937 rng(7);
  // head_dim 64: a bf16 cache takes the pairs path (32 values per load), 24 does not.
  for (DType dt : kCacheDTypes)
    for (int64_t pt : {16, 5})
      for (int64_t d : {24, 64}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " pt " << pt << " d " << d);
        const std::vector<int64_t> lens = {700, 3, 17, 1, 64, 5};
        const int64_t padded = 703;  // beyond the longest row too
        const Batch b(lens, 8, 2, d, pt, rng, padded);
        const CacheStore s = b.cache(dt);  // unwritten positions hold NaN bytes
        PagedAttentionParams pp;
        pp.mode = PagedAttentionMode::kPadded;
        pp.padded_length = padded;
        EXPECT_LT(max_abs_diff(run(s, b, DType::kF32, pp), run(s, b)), 1e-5);
        pp.force_portable = true;
        EXPECT_LT(max_abs_diff(run(s, b, DType::kF32, pp), run(s, b)), 1e-5);
      }
}

TEST(PagedAttention, DeterministicAcrossThreadCounts) {
  RestoreNumThreads restore;
  std::mt19937 rng(8);
  for (DType dt : kCacheDTypes) {
    const Batch b({1300, 3, 17, 1, 600, 5, 100, 33}, 8, 2, 80, 16, rng);
    const CacheStore s = b.cache(dt);
    set_num_threads(1);
    const Tensor o1 = run(s, b);
    set_num_threads(2);
    const Tensor o2 = run(s, b);
    EXPECT_TRUE(bitwise_equal(o1, o2)) << dtype_name(dt);
  }
}

TEST(PagedAttention, TaskSplitDoesNotChangeResults) {
  // How kv heads are bundled into tasks depends on the batch and the thread count; each
  // row's result must not: row 0 alone (heads spread over tasks) equals row 0 in a batch
  // of 16 (all heads in one task), bitwise, with 1 and 2 threads.
  RestoreNumThreads restore;
  std::mt19937 rng(12);
  std::vector<int64_t> lens = {700};
  for (int i = 1; i < 16; ++i) lens.push_back(3 + 7 * i);
  for (DType dt : kCacheDTypes) {
    const Batch b(lens, 8, 8, 32, 16, rng);
    const CacheStore s = b.cache(dt);
    const Tensor all = run(s, b);
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      Tensor one(DType::kF32, {1, 8, 32});
      paged_attention(s.c, b.q.view().slice0(0, 1), b.rows.data(), one);
      EXPECT_EQ(std::memcmp(one.data(), all.data(), one.nbytes()), 0)
          << dtype_name(dt) << " threads " << threads;
    }
  }
}

TEST(PagedAttention, PortableMatchesSimd) {
  std::mt19937 rng(9);
  for (DType dt : kCacheDTypes)
    for (int64_t d : {24, 64, 80}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dt) << " d " << d);
      const Batch b({1300, 3, 17, 1, 16}, 8, 2, d, 5, rng);
      const CacheStore s = b.cache(dt);
      PagedAttentionParams pp;
      pp.force_portable = true;
      EXPECT_LT(max_abs_diff(run(s, b, DType::kF32, pp), run(s, b)), 1e-5);
    }
}

TEST(PagedAttention, CustomScale) {
  std::mt19937 rng(10);
  const Batch b({50, 7}, 4, 2, 32, 16, rng);
  const CacheStore s = b.cache(DType::kF32);
  PagedAttentionParams pp;
  pp.scale = 0.3f;
  Tensor out(DType::kF32, {b.n(), b.hq, b.d}), want(DType::kF32, {b.n(), b.hq, b.d});
  paged_attention(s.c, b.q, b.rows.data(), out, pp);
  ref::paged_attention(s.c, b.q, b.rows.data(), want, pp);
  EXPECT_LT(max_abs_diff(out, want), 1e-5);
  // And it matters.
  EXPECT_GT(max_abs_diff(out, run(s, b)), 1e-3);
}

TEST(PagedAttention, ErrorPaths) {
  std::mt19937 rng(11);
  const Batch b({20, 5}, 4, 2, 16, 8, rng, 20);  // tables cover 20 positions (padded call)
  CacheStore s = b.cache(DType::kI8);
  Tensor out(DType::kF32, {2, 4, 16});
  auto expect_error = [&](const std::function<void()>& fn, const char* op) {
    const std::string msg = error_message(fn);
    EXPECT_NE(msg.find(op), std::string::npos) << "message: '" << msg << "'";
  };
  auto attn = [&](PagedKvCache c, const TensorView& q, const PagedAttentionRow* rows,
                  const TensorView& o, PagedAttentionParams pp = {}) {
    return [=] { paged_attention(c, q, rows, o, pp); };
  };
  EXPECT_EQ(error_message(attn(s.c, b.q, b.rows.data(), out)), "");

  PagedKvCache c = s.c;
  c.k_scale = nullptr;
  expect_error(attn(c, b.q, b.rows.data(), out), "paged_attention");
  c = s.c;
  c.dtype = DType::kF16;
  expect_error(attn(c, b.q, b.rows.data(), out), "paged_attention");
  c = s.c;
  c.page_tokens = 0;
  expect_error(attn(c, b.q, b.rows.data(), out), "paged_attention");
  c = s.c;
  c.v = nullptr;
  expect_error(attn(c, b.q, b.rows.data(), out), "paged_attention");

  Tensor q2(DType::kF32, {2, 64}), qi(DType::kI32, {2, 4, 16}), q3(DType::kF32, {2, 3, 16});
  Tensor qd(DType::kF32, {2, 4, 8}), out_bad(DType::kF32, {2, 4, 8});
  expect_error(attn(s.c, q2, b.rows.data(), out), "paged_attention");
  expect_error(attn(s.c, qi, b.rows.data(), out), "paged_attention");
  expect_error(attn(s.c, q3, b.rows.data(), Tensor(DType::kF32, {2, 3, 16})), "paged_attention");
  expect_error(attn(s.c, qd, b.rows.data(), out_bad), "paged_attention");
  expect_error(attn(s.c, b.q, b.rows.data(), out_bad), "paged_attention");
  expect_error(attn(s.c, b.q, nullptr, out), "paged_attention");

  std::vector<PagedAttentionRow> rows = b.rows;
  rows[1].length = 0;
  expect_error(attn(s.c, b.q, rows.data(), out), "paged_attention");
  rows = b.rows;
  rows[0].pages = nullptr;
  expect_error(attn(s.c, b.q, rows.data(), out), "paged_attention");
  std::vector<int32_t> bad_table = b.tables[0];
  bad_table[2] = int32_t(b.pages);
  rows = b.rows;
  rows[0].pages = bad_table.data();
  expect_error(attn(s.c, b.q, rows.data(), out), "paged_attention");
  bad_table[2] = -1;
  expect_error(attn(s.c, b.q, rows.data(), out), "paged_attention");

  PagedAttentionParams pp;
  pp.mode = PagedAttentionMode::kPadded;
  pp.padded_length = 19;  // shorter than row 0
  expect_error(attn(s.c, b.q, b.rows.data(), out, pp), "paged_attention");
  pp.padded_length = 20;
  EXPECT_EQ(error_message(attn(s.c, b.q, b.rows.data(), out, pp)), "");
  pp = {};
  pp.scale = -1.0f;
  expect_error(attn(s.c, b.q, b.rows.data(), out, pp), "paged_attention");
  pp.scale = std::nanf("");
  expect_error(attn(s.c, b.q, b.rows.data(), out, pp), "paged_attention");
  EXPECT_THROW(ref::paged_attention(s.c, b.q, nullptr, out), Error);

  // Writes.
  Tensor k(DType::kF32, {2, 2, 16}), kbad(DType::kF32, {2, 3, 16}), ki(DType::kI8, {2, 2, 16});
  std::vector<int64_t> slots = {0, 1};
  auto write = [&](PagedKvCache cc, const TensorView& kk, const TensorView& vv, const int64_t* sl) {
    return [=] { paged_kv_write(cc, kk, vv, sl); };
  };
  for (int64_t i = 0; i < k.numel(); ++i) k.as<float>()[i] = float(i);
  EXPECT_EQ(error_message(write(s.c, k, k, slots.data())), "");
  expect_error(write(s.c, kbad, kbad, slots.data()), "paged_kv_write");
  expect_error(write(s.c, k, kbad, slots.data()), "paged_kv_write");
  expect_error(write(s.c, ki, ki, slots.data()), "paged_kv_write");
  expect_error(write(s.c, k, k, nullptr), "paged_kv_write");
  slots = {0, 0};
  expect_error(write(s.c, k, k, slots.data()), "paged_kv_write");
  slots = {0, b.pages * b.pt};
  expect_error(write(s.c, k, k, slots.data()), "paged_kv_write");
  slots = {-1, 1};
  expect_error(write(s.c, k, k, slots.data()), "paged_kv_write");
  c = s.c;
  c.v_scale = nullptr;
  slots = {0, 1};
  expect_error(write(c, k, k, slots.data()), "paged_kv_write");
}

}  // namespace
}  // namespace hyperion
