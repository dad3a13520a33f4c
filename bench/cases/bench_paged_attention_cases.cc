// Bench cases: paged decode attention over a KV cache of 64 sequences with lengths drawn
// uniformly from [64, 2048] (fixed seed), Hq = Hkv = 8, D = 64, 16-token pages scattered
// through the pool in random order. One query per sequence (a decode step).
//   paged_attn_bf16_ragged  each row reads its own length (the serving path)
//   paged_attn_int8_ragged  the same over an int8 cache with per-(token, head) scales
//   paged_attn_bf16_padded  every row computes over the longest length (the padded batch)
// Memory-bound: bytes = the KV bytes the case has to read (K, V and scales), from
// paged_kv_bytes_per_token times the positions read (sum of lengths, or rows x longest).
#include <algorithm>
#include <numeric>
#include <random>

#include "cases/bench_registry.h"
#include "kernels/paged_attention.h"

namespace hyperion::bench {

namespace {

struct PagedCase {
  static constexpr int64_t kRows = 64, kHeads = 8, kDim = 64, kPageTokens = 16;
  std::vector<int64_t> lengths;
  int64_t longest = 0, total = 0;

  PagedCase() {
    std::mt19937 rng(2024);
    std::uniform_int_distribution<int64_t> len(64, 2048);
    for (int64_t i = 0; i < kRows; ++i) lengths.push_back(len(rng));
    longest = *std::max_element(lengths.begin(), lengths.end());
    total = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  }
};

// Everything one case owns: the page pool (every row has pages for the longest length, so
// the same layout serves the padded case), shuffled page tables, q and out.
struct PagedState {
  std::shared_ptr<Tensor> k, v, k_scale, v_scale, q, out;
  std::vector<std::vector<int32_t>> tables;
  std::vector<PagedAttentionRow> rows;
  PagedKvCache cache;
  PagedAttentionParams params;
};

std::shared_ptr<PagedState> make_paged_state(DType dtype, bool padded) {
  const PagedCase pc;
  auto s = std::make_shared<PagedState>();
  const int64_t pages_per_row = (pc.longest + PagedCase::kPageTokens - 1) / PagedCase::kPageTokens;
  const int64_t pages = PagedCase::kRows * pages_per_row;
  const Shape kv_shape{pages, PagedCase::kHeads, PagedCase::kPageTokens, PagedCase::kDim};
  if (dtype == DType::kI8) {
    s->k = random_tensor(dtype, kv_shape, 11, -127.0f, 128.0f);
    s->v = random_tensor(dtype, kv_shape, 12, -127.0f, 128.0f);
    const Shape scale_shape{pages, PagedCase::kHeads, PagedCase::kPageTokens};
    s->k_scale = random_tensor(DType::kF32, scale_shape, 13, 0.001f, 0.02f);
    s->v_scale = random_tensor(DType::kF32, scale_shape, 14, 0.001f, 0.02f);
    s->cache.k_scale = s->k_scale->as<float>();
    s->cache.v_scale = s->v_scale->as<float>();
  } else {
    s->k = random_tensor(dtype, kv_shape, 11);
    s->v = random_tensor(dtype, kv_shape, 12);
  }
  s->cache.k = s->k->data();
  s->cache.v = s->v->data();
  s->cache.dtype = dtype;
  s->cache.num_pages = pages;
  s->cache.page_tokens = PagedCase::kPageTokens;
  s->cache.n_kv_heads = PagedCase::kHeads;
  s->cache.head_dim = PagedCase::kDim;

  std::vector<int32_t> ids(static_cast<size_t>(pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  for (int64_t i = 0; i < PagedCase::kRows; ++i)
    s->tables.emplace_back(ids.begin() + i * pages_per_row, ids.begin() + (i + 1) * pages_per_row);
  for (int64_t i = 0; i < PagedCase::kRows; ++i)
    s->rows.push_back({s->tables[size_t(i)].data(), pc.lengths[size_t(i)]});
  s->q = random_tensor(DType::kBF16, {PagedCase::kRows, PagedCase::kHeads, PagedCase::kDim}, 15);
  s->out = std::make_shared<Tensor>(DType::kBF16,
                                    Shape{PagedCase::kRows, PagedCase::kHeads, PagedCase::kDim});
  if (padded) {
    s->params.mode = PagedAttentionMode::kPadded;
    s->params.padded_length = pc.longest;
  }
  return s;
}

}  // namespace

std::vector<KernelBench> paged_attention_benches() {
  const PagedCase pc;
  std::vector<KernelBench> v;
  auto add = [&](const std::string& name, DType dtype, bool padded) {
    const int64_t positions = padded ? PagedCase::kRows * pc.longest : pc.total;
    const double bytes = double(positions) * double(paged_kv_bytes_per_token(
                                                 dtype, PagedCase::kHeads, PagedCase::kDim));
    v.push_back({name, Bound::kMemory, 0, bytes, [dtype, padded] {
                   auto s = make_paged_state(dtype, padded);
                   return make_state([s] {
                     paged_attention(s->cache, *s->q, s->rows.data(), *s->out, s->params);
                   });
                 }});
  };
  add("paged_attn_bf16_ragged", DType::kBF16, false);
  add("paged_attn_int8_ragged", DType::kI8, false);
  add("paged_attn_bf16_padded", DType::kBF16, true);
  return v;
}

}  // namespace hyperion::bench
