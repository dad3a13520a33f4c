// Decode attention over the paged KV cache at the shapes models use (head_dim 64 and 128,
// 1 to 8 query heads per kv head, f32 / bf16 / int8 pages, contexts from 1 to over 700
// positions), on every built backend, through both interfaces: per-call host tables and a
// step's tables in the backend's memory (PagedStepTables, with padding rows: a negative
// slot writes nothing, a length of 0 gives zeros). On a GPU this is the split
// (flash-decoding) kernel of src/kernels/cuda/paged_decode.cu against the scalar
// reference; on the host and the simulated device (registered here where no GPU is), the
// step tables' semantics.
// Tolerance: 1e-4 relative to the output's largest element with f32 outputs (f32 math
// in another order; int8 pages dequantised the same way on both sides), 1e-2 with bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "simulated_device.h"
#include "kernels/backend.h"

namespace hyperion {
namespace {

using namespace testing_util;

class PagedStepParity : public testing::TestWithParam<KernelBackend*> {
 protected:
  KernelBackend& k() { return *GetParam(); }
  // Device copy of host bytes (kept alive by the returned buffer).
  DeviceBuffer up(const void* src, size_t bytes) {
    DeviceBuffer b(k().allocator(), std::max<size_t>(bytes, 64));
    k().zero(b.data(), b.bytes());
    if (bytes > 0) k().upload(src, b.data(), bytes);
    return b;
  }
  template <typename T>
  DeviceBuffer up(const std::vector<T>& v) {
    return up(v.data(), v.size() * sizeof(T));
  }
  TensorView view(const DeviceBuffer& b, DType dt, Shape s) { return k().view(b.data(), dt, s); }
  Tensor down(const DeviceBuffer& b, DType dt, Shape s) {
    Tensor t(dt, s);
    k().download(b.data(), t.data(), t.nbytes());
    return t;
  }
};

// |got - want| <= tol * max|want| (+ NaN never passes).
void expect_close_to_max(const Tensor& got, const Tensor& want, double tol,
                         const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  double peak = 0;
  for (int64_t i = 0; i < want.numel(); ++i) peak = std::max(peak, std::fabs(at(want, i)));
  for (int64_t i = 0; i < got.numel(); ++i)
    ASSERT_NEAR(at(got, i), at(want, i), tol * std::max(peak, 1e-3)) << what << " element " << i;
}

TEST_P(PagedStepParity, DecodeAttentionAtModelShapes) {
  std::mt19937 rng(21);
  const int64_t pt = 16, hkv = 2, pages = 64;
  // Rows: a fresh sequence, one that needs several tiles and splits, a padding row, one
  // inside its first pages.
  const std::vector<int64_t> lengths = {1, 733, 0, 37};
  const int64_t n = static_cast<int64_t>(lengths.size());
  for (int64_t d : {64, 128}) {
    for (int64_t group : {1, 3, 4, 8}) {
      for (DType cdt : {DType::kBF16, DType::kF32, DType::kI8}) {
        const int64_t hq = hkv * group;
        const std::string what = "head_dim " + std::to_string(d) + ", group " +
                                 std::to_string(group) + ", " + std::string(dtype_name(cdt)) + " pages";
        SCOPED_TRACE(what);
        const int64_t elems = pages * pt * hkv * d;
        DeviceBuffer kc(k().allocator(), static_cast<size_t>(elems) * dtype_size(cdt)),
            vc(k().allocator(), kc.bytes()),
            ks(k().allocator(), static_cast<size_t>(pages * pt * hkv) * 4),
            vs(k().allocator(), ks.bytes());
        for (DeviceBuffer* b : {&kc, &vc, &ks, &vs}) k().zero(b->data(), b->bytes());
        PagedKvCache cache;
        cache.k = kc.data();
        cache.v = vc.data();
        if (cdt == DType::kI8) {
          cache.k_scale = ks.as<float>();
          cache.v_scale = vs.as<float>();
        }
        cache.dtype = cdt;
        cache.num_pages = pages;
        cache.page_tokens = pt;
        cache.n_kv_heads = hkv;
        cache.head_dim = d;
        // Each row's pages: a shuffled slice of the pool.
        std::vector<int32_t> order(static_cast<size_t>(pages));
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        std::vector<std::vector<int32_t>> tables(static_cast<size_t>(n));
        size_t next = 0;
        for (int64_t r = 0; r < n; ++r)
          for (int64_t i = 0; i < (lengths[static_cast<size_t>(r)] + pt - 1) / pt; ++i)
            tables[static_cast<size_t>(r)].push_back(order[next++]);
        // Keys and values of every row's positions (per-call write, host slots).
        for (int64_t r = 0; r < n; ++r) {
          const int64_t len = lengths[static_cast<size_t>(r)];
          if (len == 0) continue;
          std::vector<int64_t> slots;
          for (int64_t p = 0; p < len; ++p)
            slots.push_back(int64_t(tables[static_cast<size_t>(r)][static_cast<size_t>(p / pt)]) *
                                pt +
                            p % pt);
          Tensor kn = random_tensor(DType::kF32, {len, hkv, d}, rng),
                 vn = random_tensor(DType::kF32, {len, hkv, d}, rng);
          DeviceBuffer dk = up(kn.data(), kn.nbytes()), dv = up(vn.data(), vn.nbytes());
          k().paged_kv_write(cache, view(dk, DType::kF32, {len, hkv, d}),
                             view(dv, DType::kF32, {len, hkv, d}), slots.data());
        }
        // The host reference reads a host copy of the cache.
        std::vector<unsigned char> kh(kc.bytes()), vh(vc.bytes());
        std::vector<float> ksh(static_cast<size_t>(pages * pt * hkv)), vsh(ksh.size());
        k().download(kc.data(), kh.data(), kh.size());
        k().download(vc.data(), vh.data(), vh.size());
        k().download(ks.data(), ksh.data(), ksh.size() * 4);
        k().download(vs.data(), vsh.data(), vsh.size() * 4);
        PagedKvCache host_cache = cache;
        host_cache.k = kh.data();
        host_cache.v = vh.data();
        if (cdt == DType::kI8) {
          host_cache.k_scale = ksh.data();
          host_cache.v_scale = vsh.data();
        }
        // The step tables.
        std::vector<int64_t> starts, lens(lengths.begin(), lengths.end()), slots(n, -1);
        std::vector<int32_t> flat;
        for (int64_t r = 0; r < n; ++r) {
          starts.push_back(static_cast<int64_t>(flat.size()));
          for (int32_t id : tables[static_cast<size_t>(r)]) flat.push_back(id);
        }
        DeviceBuffer dstart = up(starts), dlen = up(lens), dslots = up(slots), dpages = up(flat);
        PagedStepTables t;
        t.slots = dslots.as<int64_t>();
        t.page_start = dstart.as<int64_t>();
        t.lengths = dlen.as<int64_t>();
        t.pages = dpages.as<int32_t>();
        t.n = n;
        t.n_pages = static_cast<int64_t>(flat.size());

        PagedAttentionParams plain, local;
        local.window = 50;
        local.softcap = 5.0f;
        for (const PagedAttentionParams& params : {plain, local}) {
          const std::string how = params.window > 0 ? " (window 50, softcap 5)" : "";
          Tensor q = random_tensor(DType::kF32, {n, hq, d}, rng);
          Tensor want = Tensor::zeros(DType::kF32, {n, hq, d});
          for (int64_t r = 0; r < n; ++r) {
            const int64_t len = lengths[static_cast<size_t>(r)];
            if (len == 0) continue;
            Tensor qr(DType::kF32, {1, hq, d}), o(DType::kF32, {1, hq, d});
            std::copy_n(q.as<float>() + r * hq * d, hq * d, qr.as<float>());
            const PagedAttentionRow row{tables[static_cast<size_t>(r)].data(), len};
            ref::paged_attention(host_cache, qr, &row, o, params);
            std::copy_n(o.as<float>(), hq * d, want.as<float>() + r * hq * d);
          }
          for (DType io : {DType::kF32, DType::kBF16}) {
            const double tol = io == DType::kF32 ? 1e-4 : 1e-2;
            Tensor qio(io, {n, hq, d});
            convert_any(q.data(), DType::kF32, qio.data(), io, static_cast<size_t>(q.numel()));
            DeviceBuffer dq = up(qio.data(), qio.nbytes());
            // Poisoned output: every element must be written.
            std::vector<unsigned char> poison(qio.nbytes(), 0xff);
            DeviceBuffer dout = up(poison.data(), poison.size());
            k().paged_attention(cache, view(dq, io, {n, hq, d}), t, view(dout, io, {n, hq, d}),
                                params);
            Tensor got = down(dout, io, {n, hq, d});
            Tensor got32(DType::kF32, {n, hq, d});
            convert_any(got.data(), io, got32.data(), DType::kF32,
                        static_cast<size_t>(got.numel()));
            expect_close_to_max(got32, want, tol,
                                "step tables, " + std::string(dtype_name(io)) + how);
            // The per-call form over the rows with keys (the padding row dropped).
            std::vector<PagedAttentionRow> rows;
            std::vector<int64_t> keep;
            for (int64_t r = 0; r < n; ++r)
              if (lengths[static_cast<size_t>(r)] > 0) {
                rows.push_back({tables[static_cast<size_t>(r)].data(),
                                lengths[static_cast<size_t>(r)]});
                keep.push_back(r);
              }
            const int64_t nk = static_cast<int64_t>(keep.size());
            Tensor qk(io, {nk, hq, d}), wk(DType::kF32, {nk, hq, d});
            const size_t row_bytes = qio.nbytes() / static_cast<size_t>(n);
            for (int64_t i = 0; i < nk; ++i) {
              std::memcpy(static_cast<unsigned char*>(qk.data()) + i * row_bytes,
                          static_cast<unsigned char*>(qio.data()) + keep[i] * row_bytes,
                          row_bytes);
              std::copy_n(want.as<float>() + keep[i] * hq * d, hq * d,
                          wk.as<float>() + i * hq * d);
            }
            DeviceBuffer dqk = up(qk.data(), qk.nbytes()), dok = up(poison.data(), qk.nbytes());
            k().paged_attention(cache, view(dqk, io, {nk, hq, d}), rows.data(),
                                view(dok, io, {nk, hq, d}), params);
            Tensor gk = down(dok, io, {nk, hq, d}), gk32(DType::kF32, {nk, hq, d});
            convert_any(gk.data(), io, gk32.data(), DType::kF32, static_cast<size_t>(gk.numel()));
            expect_close_to_max(gk32, wk, tol,
                                "per-call rows, " + std::string(dtype_name(io)) + how);
          }
        }
      }
    }
  }
}

// On a GPU a NaN key makes its row's attention NaN: the split kernel must not turn it into
// zeros as it does a row without keys. (The host's AVX-512 exp clamps its input, so there
// a NaN score becomes a finite weight; the portable host path gives NaN.)
TEST_P(PagedStepParity, ANanKeyGivesNanOnAGpu) {
  if (k().device() == Device::kHost || std::string(k().name()) == "simulated")
    GTEST_SKIP() << "the host kernels' exp clamps NaN";
  std::mt19937 rng(23);
  const int64_t pt = 16, hkv = 1, hq = 4, d = 64, pages = 4, len = 40;
  DeviceBuffer kc(k().allocator(), static_cast<size_t>(pages * pt * hkv * d) * 4),
      vc(k().allocator(), kc.bytes());
  PagedKvCache cache;
  cache.k = kc.data();
  cache.v = vc.data();
  cache.dtype = DType::kF32;
  cache.num_pages = pages;
  cache.page_tokens = pt;
  cache.n_kv_heads = hkv;
  cache.head_dim = d;
  Tensor kn = random_tensor(DType::kF32, {len, hkv, d}, rng),
         vn = random_tensor(DType::kF32, {len, hkv, d}, rng);
  kn.as<float>()[17 * d + 5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<int64_t> slots;
  for (int64_t p = 0; p < len; ++p) slots.push_back(p);
  DeviceBuffer dk = up(kn.data(), kn.nbytes()), dv = up(vn.data(), vn.nbytes());
  k().paged_kv_write(cache, view(dk, DType::kF32, {len, hkv, d}),
                     view(dv, DType::kF32, {len, hkv, d}), slots.data());
  const std::vector<int32_t> table = {0, 1, 2};
  const PagedAttentionRow row{table.data(), len};
  Tensor q = random_tensor(DType::kF32, {1, hq, d}, rng);
  DeviceBuffer dq = up(q.data(), q.nbytes()), dout = up(q.data(), q.nbytes());
  k().paged_attention(cache, view(dq, DType::kF32, {1, hq, d}), &row,
                      view(dout, DType::kF32, {1, hq, d}), PagedAttentionParams{});
  const Tensor out = down(dout, DType::kF32, {1, hq, d});
  for (int64_t i = 0; i < out.numel(); ++i) ASSERT_TRUE(std::isnan(at(out, i))) << i;
}

// The step tables' write: rows with a negative slot write nothing, the others land at
// their slots as the per-call write puts them.
TEST_P(PagedStepParity, StepWriteSkipsPaddingRows) {
  std::mt19937 rng(22);
  const int64_t pt = 4, hkv = 2, d = 64, pages = 3, n = 5;
  const int64_t elems = pages * pt * hkv * d;
  DeviceBuffer kc(k().allocator(), static_cast<size_t>(elems) * 4), vc(k().allocator(), kc.bytes());
  k().zero(kc.data(), kc.bytes());
  k().zero(vc.data(), vc.bytes());
  PagedKvCache cache;
  cache.k = kc.data();
  cache.v = vc.data();
  cache.dtype = DType::kF32;
  cache.num_pages = pages;
  cache.page_tokens = pt;
  cache.n_kv_heads = hkv;
  cache.head_dim = d;
  const std::vector<int64_t> slots = {5, -1, 0, -1, 11};
  Tensor kn = random_tensor(DType::kF32, {n, hkv, d}, rng),
         vn = random_tensor(DType::kF32, {n, hkv, d}, rng);
  DeviceBuffer dk = up(kn.data(), kn.nbytes()), dv = up(vn.data(), vn.nbytes()), ds = up(slots);
  PagedStepTables t;
  t.slots = ds.as<int64_t>();
  t.n = n;
  k().paged_kv_write(cache, view(dk, DType::kF32, {n, hkv, d}), view(dv, DType::kF32, {n, hkv, d}),
                     t);
  std::vector<float> kh(static_cast<size_t>(elems)), vh(kh.size());
  k().download(kc.data(), kh.data(), kh.size() * 4);
  k().download(vc.data(), vh.data(), vh.size() * 4);
  std::vector<float> kw(kh.size(), 0.0f), vw(kh.size(), 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    if (slots[static_cast<size_t>(i)] < 0) continue;
    const int64_t page = slots[static_cast<size_t>(i)] / pt, off = slots[static_cast<size_t>(i)] % pt;
    for (int64_t h = 0; h < hkv; ++h)
      for (int64_t c = 0; c < d; ++c) {
        const size_t at_cache = static_cast<size_t>(((page * hkv + h) * pt + off) * d + c);
        kw[at_cache] = kn.as<float>()[(i * hkv + h) * d + c];
        vw[at_cache] = vn.as<float>()[(i * hkv + h) * d + c];
      }
  }
  EXPECT_EQ(kh, kw);
  EXPECT_EQ(vh, vw);
}

// Every built backend, and the simulated device where no GPU is usable (it checks that the
// step tables are read from device memory only).
std::vector<KernelBackend*> backends() {
  testing_util::simulated_device();
  return built_backends();
}

INSTANTIATE_TEST_SUITE_P(Built, PagedStepParity, testing::ValuesIn(backends()),
                         [](const testing::TestParamInfo<KernelBackend*>& i) {
                           return std::string(i.param->name());
                         });

}  // namespace
}  // namespace hyperion
