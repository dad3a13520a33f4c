// Table-batched embedding bags: pooled lookups and the fused sparse backward + update.
// Both are memory-bound gathers over random rows, so the vector code is simple (f32
// accumulators over a block of columns, FMAs with each id's weight) and the work is
// in keeping the memory system busy: threads split the whole batch's bags, and each id's
// row is prefetched a few ids ahead, across bag boundaries (one-hot bags have no
// "next id" within the bag).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/embedding_bag.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include "kernels/simd-inl.h"

#include "kernels/embedding_bag.h"

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {

// Ids ahead whose rows are prefetched: 8 rows (4 KB at dim 128 f32) in flight per thread.
// Measured with hyperion bench embedding: no prefetch is 39% slower on small-d64-bag1 and
// 6% slower on large-d128-bag1; distances 4, 8 and 16 are within 1% of each other, 32-64 a
// few % slower. Prefetching only a row's first lines (leaving the rest to the hardware
// streamer), hints T1/T2 and transparent huge pages made no measurable difference here.
constexpr int64_t kPrefetchDistance = 8;

// The scale every id of a bag of n ids gets from the pooling mode.
HWY_INLINE float PoolFactor(Pooling p, int64_t n) {
  if (n == 0 || p == Pooling::kSum) return 1.0f;
  return p == Pooling::kMean ? 1.0f / static_cast<float>(n)
                             : 1.0f / std::sqrt(static_cast<float>(n));
}

HWY_INLINE VF LoadRow(DF d, const float* p) {
  return hn::LoadU(d, p);
}
HWY_INLINE VF LoadRow(DF d, const bf16* p) {
  return LoadF(d, p);
}
HWY_INLINE VF LoadRow(DF d, const int8_t* p) {
  const hn::Rebind<int8_t, DF> d8;
  const hn::Rebind<int32_t, DF> di;
  return hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, p)));
}
HWY_INLINE float LoadScalar(const float* p) {
  return *p;
}
HWY_INLINE float LoadScalar(const bf16* p) {
  return bf16_to_f32(*p);
}
HWY_INLINE float LoadScalar(const int8_t* p) {
  return static_cast<float>(*p);
}

template <typename T>
HWY_INLINE void PrefetchRow(const T* row, size_t dim) {
  const char* p = reinterpret_cast<const char*>(row);
  for (size_t byte = 0; byte < dim * sizeof(T); byte += 64) __builtin_prefetch(p + byte);
}

// Bags [b0, b1) of one table into their output rows.
template <typename T>
void PoolBagsT(const EmbeddingBagTable& t, const int32_t* ids, const int64_t* offsets,
               const float* weights, int64_t table_end, int64_t b0, int64_t b1, float* out,
               int64_t out_stride) {
  const DF d;
  const size_t n = hn::Lanes(d);
  const size_t dim = static_cast<size_t>(t.dim);
  const T* w = static_cast<const T*>(t.weights);
  const float* scales = t.row_scales;
  auto row = [&](int64_t pos) { return w + static_cast<size_t>(ids[pos]) * dim; };
  auto factor = [&](int64_t pos, float pool) {
    float f = weights ? weights[pos] * pool : pool;
    if constexpr (std::is_same_v<T, int8_t>) f *= scales[ids[pos]];
    return f;
  };
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t s = offsets[b], e = offsets[b + 1];
    const float pool = PoolFactor(t.pooling, e - s);
    float* o = out + (b - b0) * out_stride + t.out_column;
    size_t j = 0;
    for (; j + 4 * n <= dim; j += 4 * n) {
      VF a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
      for (int64_t p = s; p < e; ++p) {
        if (j == 0 && p + kPrefetchDistance < table_end)
          PrefetchRow(row(p + kPrefetchDistance), dim);
        const VF f = hn::Set(d, factor(p, pool));
        const T* r = row(p) + j;
        a0 = hn::MulAdd(LoadRow(d, r), f, a0);
        a1 = hn::MulAdd(LoadRow(d, r + n), f, a1);
        a2 = hn::MulAdd(LoadRow(d, r + 2 * n), f, a2);
        a3 = hn::MulAdd(LoadRow(d, r + 3 * n), f, a3);
      }
      hn::StoreU(a0, d, o + j);
      hn::StoreU(a1, d, o + j + n);
      hn::StoreU(a2, d, o + j + 2 * n);
      hn::StoreU(a3, d, o + j + 3 * n);
    }
    for (; j + n <= dim; j += n) {
      VF a = hn::Zero(d);
      for (int64_t p = s; p < e; ++p) {
        if (j == 0 && p + kPrefetchDistance < table_end)
          PrefetchRow(row(p + kPrefetchDistance), dim);
        a = hn::MulAdd(LoadRow(d, row(p) + j), hn::Set(d, factor(p, pool)), a);
      }
      hn::StoreU(a, d, o + j);
    }
    for (; j < dim; ++j) {
      float a = 0.0f;
      for (int64_t p = s; p < e; ++p) a += LoadScalar(row(p) + j) * factor(p, pool);
      o[j] = a;
    }
  }
}

void PoolBags(const EmbeddingBagTable& t, const int32_t* ids, const int64_t* offsets,
              const float* weights, int64_t table_end, int64_t b0, int64_t b1, float* out,
              int64_t out_stride) {
  switch (t.dtype) {
    case DType::kF32:
      return PoolBagsT<float>(t, ids, offsets, weights, table_end, b0, b1, out, out_stride);
    case DType::kBF16:
      return PoolBagsT<bf16>(t, ids, offsets, weights, table_end, b0, b1, out, out_stride);
    default:
      return PoolBagsT<int8_t>(t, ids, offsets, weights, table_end, b0, b1, out, out_stride);
  }
}

// g[j] += f * src[j]
HWY_INLINE void AddScaled(float* g, const float* src, float f, size_t dim) {
  const DF d;
  const size_t n = hn::Lanes(d);
  const VF vf = hn::Set(d, f);
  size_t j = 0;
  for (; j + n <= dim; j += n)
    hn::StoreU(hn::MulAdd(hn::LoadU(d, src + j), vf, hn::LoadU(d, g + j)), d, g + j);
  for (; j < dim; ++j) g[j] += src[j] * f;
}

// One row's update from its summed gradient g (see the header for each rule).
template <typename T>
HWY_INLINE void UpdateRow(SparseOptimizer kind, float lr, float eps, T* w, float* state,
                          const float* g, size_t dim) {
  const DF d;
  const size_t n = hn::Lanes(d);
  const VF vlr = hn::Set(d, lr), veps = hn::Set(d, eps);
  size_t j = 0;
  if (kind == SparseOptimizer::kRowwiseAdagrad) {
    VF sq = hn::Zero(d);
    for (; j + n <= dim; j += n) {
      const VF v = hn::LoadU(d, g + j);
      sq = hn::MulAdd(v, v, sq);
    }
    float sum = hn::GetLane(hn::SumOfLanes(d, sq));
    for (; j < dim; ++j) sum += g[j] * g[j];
    *state += sum / static_cast<float>(dim);
    const float denom = std::sqrt(*state) + eps;
    const VF vden = hn::Set(d, denom);
    for (j = 0; j + n <= dim; j += n) {
      const VF step = hn::Div(hn::Mul(vlr, hn::LoadU(d, g + j)), vden);
      StoreF(d, hn::Sub(LoadF(d, w + j), step), w + j);
    }
    for (; j < dim; ++j) w[j] = FromF32<T>(ToF32(w[j]) - lr * g[j] / denom);
    return;
  }
  for (; j + n <= dim; j += n) {
    const VF v = hn::LoadU(d, g + j);
    VF x = LoadF(d, w + j);
    if (kind == SparseOptimizer::kSgd) {
      x = hn::Sub(x, hn::Mul(vlr, v));
    } else if (kind == SparseOptimizer::kAccumulate) {
      x = hn::Add(x, v);
    } else {
      const VF s = hn::MulAdd(v, v, hn::LoadU(d, state + j));
      hn::StoreU(s, d, state + j);
      x = hn::Sub(x, hn::Div(hn::Mul(vlr, v), hn::Add(hn::Sqrt(s), veps)));
    }
    StoreF(d, x, w + j);
  }
  for (; j < dim; ++j) {
    float x = ToF32(w[j]);
    if (kind == SparseOptimizer::kSgd) {
      x -= lr * g[j];
    } else if (kind == SparseOptimizer::kAccumulate) {
      x += g[j];
    } else {
      state[j] += g[j] * g[j];
      x -= lr * g[j] / (std::sqrt(state[j]) + eps);
    }
    w[j] = FromF32<T>(x);
  }
}

// Distinct ids [u0, u1) of one table: keys[uniques[u] .. uniques[u + 1]) are the sorted
// (id, position) pairs of id u, positions relative to the table's first id.
void UpdateUniques(const EmbeddingBagTable& t, const SparseOptimizerArgs& opt, const uint64_t* keys,
                   const int64_t* uniques, int64_t u0, int64_t u1, const int32_t* bag_of,
                   const int64_t* offsets, int64_t table_first_id, const float* weights,
                   const float* dout, int64_t dout_stride, float* g) {
  const size_t dim = static_cast<size_t>(t.dim);
  const int64_t per_row = sparse_optimizer_state_per_row(opt.kind, t.dim);
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t k0 = uniques[u], k1 = uniques[u + 1];
    const int64_t id = static_cast<int64_t>(keys[k0] >> 32);
    std::fill(g, g + dim, 0.0f);
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t pos = static_cast<int64_t>(keys[k] & 0xffffffffu);
      const int64_t bag = bag_of[pos];
      const float pool = PoolFactor(t.pooling, offsets[bag + 1] - offsets[bag]);
      const float f = weights ? weights[table_first_id + pos] * pool : pool;
      AddScaled(g, dout + bag * dout_stride + t.out_column, f, dim);
    }
    float* state = t.state ? t.state + id * per_row : nullptr;
    if (t.dtype == DType::kF32)
      UpdateRow(opt.kind, opt.lr, opt.eps, static_cast<float*>(t.weights) + id * t.dim, state, g,
                dim);
    else
      UpdateRow(opt.kind, opt.lr, opt.eps, static_cast<bf16*>(t.weights) + id * t.dim, state, g,
                dim);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "base/threads.h"

namespace hyperion {

HWY_EXPORT(PoolBags);
HWY_EXPORT(UpdateUniques);

const char* pooling_name(Pooling p) {
  switch (p) {
    case Pooling::kSum:
      return "sum";
    case Pooling::kMean:
      return "mean";
    case Pooling::kSqrtN:
      return "sqrtn";
  }
  return "?";
}

Pooling parse_pooling(const std::string& text, const std::string& what) {
  if (text == "sum") return Pooling::kSum;
  if (text == "mean") return Pooling::kMean;
  if (text == "sqrtn") return Pooling::kSqrtN;
  throw Error(fmt::format("{}: unknown pooling '{}' (expected sum, mean or sqrtn)", what, text));
}

const char* sparse_optimizer_name(SparseOptimizer o) {
  switch (o) {
    case SparseOptimizer::kSgd:
      return "sgd";
    case SparseOptimizer::kAdagrad:
      return "adagrad";
    case SparseOptimizer::kRowwiseAdagrad:
      return "rowwise_adagrad";
    case SparseOptimizer::kAccumulate:
      return "accumulate";
  }
  return "?";
}

SparseOptimizer parse_sparse_optimizer(const std::string& text, const std::string& what) {
  if (text == "sgd") return SparseOptimizer::kSgd;
  if (text == "adagrad") return SparseOptimizer::kAdagrad;
  if (text == "rowwise_adagrad") return SparseOptimizer::kRowwiseAdagrad;
  throw Error(fmt::format(
      "{}: unknown sparse optimizer '{}' (expected sgd, adagrad or rowwise_adagrad)", what, text));
}

int64_t sparse_optimizer_state_per_row(SparseOptimizer o, int64_t dim) {
  switch (o) {
    case SparseOptimizer::kAdagrad:
      return dim;
    case SparseOptimizer::kRowwiseAdagrad:
      return 1;
    default:
      return 0;
  }
}

void check_embedding_bags(const char* op, std::span<const EmbeddingBagTable> tables,
                          const BagBatch& bags, int64_t out_stride) {
  HYP_CHECK(bags.tables == static_cast<int64_t>(tables.size()),
            "{}: the bags are for {} tables but {} tables were given", op, bags.tables,
            tables.size());
  HYP_CHECK(bags.batch >= 0, "{}: batch {} < 0", op, bags.batch);
  const int64_t nbags = bags.tables * bags.batch;
  HYP_CHECK(nbags == 0 || bags.offsets, "{}: offsets are null", op);
  for (size_t ti = 0; ti < tables.size(); ++ti) {
    const EmbeddingBagTable& t = tables[ti];
    HYP_CHECK(t.dtype == DType::kF32 || t.dtype == DType::kBF16 || t.dtype == DType::kI8,
              "{}: table {} has dtype {} (expected f32, bf16 or i8)", op, ti, dtype_name(t.dtype));
    HYP_CHECK(t.rows >= 0 && t.dim > 0 && (t.rows == 0 || t.weights),
              "{}: table {} has {} rows of dim {} at {}", op, ti, t.rows, t.dim, t.weights);
    HYP_CHECK(t.dtype != DType::kI8 || t.row_scales, "{}: int8 table {} has no row scales", op, ti);
    HYP_CHECK(t.out_column >= 0 && t.out_column + t.dim <= out_stride,
              "{}: table {} writes columns [{}, {}) of rows {} wide", op, ti, t.out_column,
              t.out_column + t.dim, out_stride);
  }
  if (nbags == 0) return;
  HYP_CHECK(bags.offsets[0] == 0, "{}: offsets[0] is {} (must be 0)", op, bags.offsets[0]);
  for (int64_t i = 0; i < nbags; ++i)
    HYP_CHECK(bags.offsets[i + 1] >= bags.offsets[i], "{}: offsets decrease at bag {} ({} -> {})",
              op, i, bags.offsets[i], bags.offsets[i + 1]);
  HYP_CHECK(bags.offsets[nbags] == 0 || bags.ids, "{}: ids are null", op);
  for (int64_t t = 0; t < bags.tables; ++t) {
    const int64_t rows = tables[static_cast<size_t>(t)].rows;
    for (int64_t p = bags.offsets[t * bags.batch]; p < bags.offsets[(t + 1) * bags.batch]; ++p)
      HYP_CHECK(bags.ids[p] >= 0 && bags.ids[p] < rows,
                "{}: id {} at position {} is out of range for table {} ({} rows)", op, bags.ids[p],
                p, t, rows);
  }
}

void embedding_bag_forward(std::span<const EmbeddingBagTable> tables, const BagBatch& bags,
                           float* out, int64_t out_stride) {
  check_embedding_bags("embedding_bag_forward", tables, bags, out_stride);
  const int64_t nbags = bags.tables * bags.batch;
  if (nbags == 0) return;
  // Chunks of bags of about 64 ids (or 16 empty / one-hot bags at least), over all tables.
  const int64_t ids_total = bags.offsets[nbags];
  const int64_t grain = std::max<int64_t>(16, nbags * 64 / std::max<int64_t>(ids_total, 1));
  parallel_chunks(nbags, grain, [&](int64_t begin, int64_t end) {
    while (begin < end) {
      const int64_t t = begin / bags.batch;
      const int64_t stop = std::min(end, (t + 1) * bags.batch);
      const EmbeddingBagTable& tab = tables[static_cast<size_t>(t)];
      const int64_t b0 = begin - t * bags.batch, b1 = stop - t * bags.batch;
      HWY_DYNAMIC_DISPATCH(PoolBags)
      (tab, bags.ids, bags.offsets + t * bags.batch, bags.weights,
       bags.offsets[(t + 1) * bags.batch], b0, b1, out + b0 * out_stride, out_stride);
      begin = stop;
    }
  });
}

void dedup_ids(const int32_t* ids, int64_t n, std::vector<int32_t>& unique,
               std::vector<int32_t>& inverse) {
  std::vector<uint64_t> keys(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    keys[size_t(i)] = uint64_t(static_cast<uint32_t>(ids[i])) << 32 | uint64_t(i);
  std::sort(keys.begin(), keys.end());
  unique.clear();
  inverse.assign(static_cast<size_t>(n), 0);
  for (int64_t k = 0; k < n; ++k) {
    const auto id = static_cast<int32_t>(keys[size_t(k)] >> 32);
    if (unique.empty() || unique.back() != id) unique.push_back(id);
    inverse[keys[size_t(k)] & 0xffffffffu] = static_cast<int32_t>(unique.size() - 1);
  }
}

int64_t embedding_bag_backward_update(std::span<const EmbeddingBagTable> tables,
                                      const BagBatch& bags, const float* dout, int64_t dout_stride,
                                      const SparseOptimizerArgs& opt,
                                      EmbeddingBagScratch* scratch) {
  const char* op = "embedding_bag_backward_update";
  check_embedding_bags(op, tables, bags, dout_stride);
  for (size_t ti = 0; ti < tables.size(); ++ti) {
    const EmbeddingBagTable& t = tables[ti];
    HYP_CHECK(t.dtype != DType::kI8, "{}: table {} is int8 (a serving table; train in f32 or bf16)",
              op, ti);
    HYP_CHECK(opt.kind != SparseOptimizer::kAccumulate || t.dtype == DType::kF32,
              "{}: accumulating gradients needs f32 rows (table {})", op, ti);
    HYP_CHECK(sparse_optimizer_state_per_row(opt.kind, t.dim) == 0 || t.state || t.rows == 0,
              "{}: {} needs optimizer state for table {}", op, sparse_optimizer_name(opt.kind), ti);
  }
  const int64_t nbags = bags.tables * bags.batch;
  if (nbags == 0) return 0;
  const int64_t total = bags.offsets[nbags];
  HYP_CHECK(total < (int64_t{1} << 32), "{}: {} ids in one call (at most 2^32)", op, total);
  EmbeddingBagScratch local;
  EmbeddingBagScratch& s = scratch ? *scratch : local;
  s.keys.resize(static_cast<size_t>(total));
  s.bag_of.resize(static_cast<size_t>(total));
  s.uniques.resize(static_cast<size_t>(total + bags.tables));
  s.table_unique_begin.assign(static_cast<size_t>(bags.tables + 1), 0);
  std::vector<int64_t> count(static_cast<size_t>(bags.tables), 0);
  // Per table: sort (id, position), then the start of each distinct id's run. Table t's
  // keys and bag_of sit at its ids' positions; its run starts at uniques[first + t].
  parallel_for_dynamic(bags.tables, [&](int64_t t) {
    const int64_t first = bags.offsets[t * bags.batch], last = bags.offsets[(t + 1) * bags.batch];
    uint64_t* keys = s.keys.data() + first;
    int32_t* bag_of = s.bag_of.data() + first;
    for (int64_t b = 0; b < bags.batch; ++b)
      for (int64_t p = bags.offsets[t * bags.batch + b]; p < bags.offsets[t * bags.batch + b + 1];
           ++p)
        bag_of[p - first] = static_cast<int32_t>(b);
    for (int64_t p = first; p < last; ++p)
      keys[p - first] = uint64_t(static_cast<uint32_t>(bags.ids[p])) << 32 | uint64_t(p - first);
    std::sort(keys, keys + (last - first));
    int64_t* u = s.uniques.data() + first + t;
    int64_t n = 0;
    for (int64_t k = 0; k < last - first; ++k)
      if (k == 0 || (keys[k] >> 32) != (keys[k - 1] >> 32)) u[n++] = k;
    u[n] = last - first;
    count[static_cast<size_t>(t)] = n;
  });
  // Work items of up to 32 distinct rows, over all tables.
  struct Item {
    int64_t t, u0, u1;
  };
  std::vector<Item> items;
  int64_t distinct = 0;
  for (int64_t t = 0; t < bags.tables; ++t) {
    distinct += count[size_t(t)];
    for (int64_t u = 0; u < count[size_t(t)]; u += 32)
      items.push_back({t, u, std::min(count[size_t(t)], u + 32)});
  }
  int64_t max_dim = 0;
  for (const EmbeddingBagTable& t : tables) max_dim = std::max(max_dim, t.dim);
  parallel_chunks(static_cast<int64_t>(items.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> g(static_cast<size_t>(max_dim));
    for (int64_t i = begin; i < end; ++i) {
      const Item& it = items[size_t(i)];
      const int64_t first = bags.offsets[it.t * bags.batch];
      HWY_DYNAMIC_DISPATCH(UpdateUniques)
      (tables[size_t(it.t)], opt, s.keys.data() + first, s.uniques.data() + first + it.t, it.u0,
       it.u1, s.bag_of.data() + first, bags.offsets + it.t * bags.batch, first, bags.weights, dout,
       dout_stride, g.data());
    }
  });
  return distinct;
}

namespace ref {

namespace {
float pool_factor(Pooling p, int64_t n) {
  if (n == 0 || p == Pooling::kSum) return 1.0f;
  return p == Pooling::kMean ? 1.0f / static_cast<float>(n)
                             : 1.0f / std::sqrt(static_cast<float>(n));
}

float row_value(const EmbeddingBagTable& t, int64_t id, int64_t j) {
  const size_t i = static_cast<size_t>(id * t.dim + j);
  switch (t.dtype) {
    case DType::kF32:
      return static_cast<const float*>(t.weights)[i];
    case DType::kBF16:
      return bf16_to_f32(static_cast<const bf16*>(t.weights)[i]);
    default:
      return static_cast<float>(static_cast<const int8_t*>(t.weights)[i]);
  }
}
}  // namespace

void embedding_bag_forward(std::span<const EmbeddingBagTable> tables, const BagBatch& bags,
                           float* out, int64_t out_stride) {
  check_embedding_bags("ref::embedding_bag_forward", tables, bags, out_stride);
  for (int64_t t = 0; t < bags.tables; ++t) {
    const EmbeddingBagTable& tab = tables[size_t(t)];
    for (int64_t b = 0; b < bags.batch; ++b) {
      const int64_t s = bags.offsets[t * bags.batch + b], e = bags.offsets[t * bags.batch + b + 1];
      const float pool = pool_factor(tab.pooling, e - s);
      for (int64_t j = 0; j < tab.dim; ++j) {
        float a = 0.0f;
        for (int64_t p = s; p < e; ++p) {
          float f = bags.weights ? bags.weights[p] * pool : pool;
          if (tab.dtype == DType::kI8) f *= tab.row_scales[bags.ids[p]];
          a += row_value(tab, bags.ids[p], j) * f;
        }
        out[b * out_stride + tab.out_column + j] = a;
      }
    }
  }
}

int64_t embedding_bag_backward_update(std::span<const EmbeddingBagTable> tables,
                                      const BagBatch& bags, const float* dout, int64_t dout_stride,
                                      const SparseOptimizerArgs& opt) {
  check_embedding_bags("ref::embedding_bag_backward_update", tables, bags, dout_stride);
  int64_t distinct = 0;
  for (int64_t t = 0; t < bags.tables; ++t) {
    const EmbeddingBagTable& tab = tables[size_t(t)];
    const int64_t per_row = sparse_optimizer_state_per_row(opt.kind, tab.dim);
    // Gradient of each used row, summed in position order.
    std::vector<std::pair<int32_t, std::vector<float>>> grads;  // sorted by id at the end
    std::vector<int64_t> where(static_cast<size_t>(tab.rows), -1);
    for (int64_t b = 0; b < bags.batch; ++b) {
      const int64_t s = bags.offsets[t * bags.batch + b], e = bags.offsets[t * bags.batch + b + 1];
      const float pool = pool_factor(tab.pooling, e - s);
      for (int64_t p = s; p < e; ++p) {
        const int32_t id = bags.ids[p];
        if (where[size_t(id)] < 0) {
          where[size_t(id)] = static_cast<int64_t>(grads.size());
          grads.push_back({id, std::vector<float>(size_t(tab.dim), 0.0f)});
        }
        std::vector<float>& g = grads[size_t(where[size_t(id)])].second;
        const float f = bags.weights ? bags.weights[p] * pool : pool;
        for (int64_t j = 0; j < tab.dim; ++j)
          g[size_t(j)] += dout[b * dout_stride + tab.out_column + j] * f;
      }
    }
    distinct += static_cast<int64_t>(grads.size());
    for (const auto& [id, g] : grads) {
      float* state = tab.state ? tab.state + int64_t(id) * per_row : nullptr;
      if (opt.kind == SparseOptimizer::kRowwiseAdagrad) {
        float sum = 0.0f;
        for (float v : g) sum += v * v;
        *state += sum / static_cast<float>(tab.dim);
      }
      for (int64_t j = 0; j < tab.dim; ++j) {
        const size_t i = size_t(int64_t(id) * tab.dim + j);
        float x = row_value(tab, id, j);
        const float gj = g[size_t(j)];
        switch (opt.kind) {
          case SparseOptimizer::kSgd:
            x -= opt.lr * gj;
            break;
          case SparseOptimizer::kAccumulate:
            x += gj;
            break;
          case SparseOptimizer::kAdagrad:
            state[j] += gj * gj;
            x -= opt.lr * gj / (std::sqrt(state[j]) + opt.eps);
            break;
          case SparseOptimizer::kRowwiseAdagrad:
            x -= opt.lr * gj / (std::sqrt(*state) + opt.eps);
            break;
        }
        if (tab.dtype == DType::kF32)
          static_cast<float*>(tab.weights)[i] = x;
        else
          static_cast<bf16*>(tab.weights)[i] = f32_to_bf16(x);
      }
    }
  }
  return distinct;
}

}  // namespace ref
}  // namespace hyperion
#endif  // HWY_ONCE
