// Every op of every kernel backend built into this binary (host, and a GPU backend when
// one is built) against the scalar ref:: kernels: the check a new backend must pass
// before any model runs on it. Inputs are made on the host; a backend on another device
// would get copies (today only the host backend exists, so the views are used directly).
#include "kernels/backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernel_test_util.h"
#include "kernels/embedding.h"
#include "kernels/grouped_gemm.h"
#include "kernels/moe_routing.h"
#include "kernels/rmsnorm.h"

namespace hyperion {
namespace {

using namespace testing_util;

void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  const std::string msg = error_message(fn);
  ASSERT_FALSE(msg.empty()) << "no hyperion::Error thrown";
  for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
}

class BackendParity : public testing::TestWithParam<KernelBackend*> {
 protected:
  KernelBackend& k() { return *GetParam(); }
};

// |got - want| <= rel * |want| + abs, element by element.
void expect_close(const Tensor& got, const Tensor& want, double rel, double abs,
                  const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  for (int64_t i = 0; i < got.numel(); ++i)
    ASSERT_NEAR(at(got, i), at(want, i), rel * std::fabs(at(want, i)) + abs) << what << " " << i;
}

TEST_P(BackendParity, Gemm) {
  std::mt19937 rng(1);
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const int64_t m = 37, n = 29, kk = 53;
    Tensor a = random_tensor(dt, {m, kk}, rng), b = random_tensor(dt, {n, kk}, rng);
    Tensor c = Tensor::zeros(DType::kF32, {m, n}), c_ref = Tensor::zeros(DType::kF32, {m, n});
    k().gemm_contiguous(Trans::kN, Trans::kT, m, n, kk, a.data(), dt, b.data(), dt, c.data(),
                        DType::kF32);
    ref::gemm(contiguous_gemm_args(Trans::kN, Trans::kT, m, n, kk, a.data(), dt, b.data(), dt,
                                   c_ref.data(), DType::kF32));
    expect_close(c, c_ref, 1e-4, 1e-4, std::string(dtype_name(dt)));
  }
}

TEST_P(BackendParity, RmsNormBothOffsets) {
  std::mt19937 rng(2);
  for (float offset : {0.0f, 1.0f}) {
    const int64_t n = 9, h = 70;
    Tensor x = random_tensor(DType::kF32, {n, h}, rng), w = random_tensor(DType::kF32, {h}, rng);
    Tensor dy = random_tensor(DType::kF32, {n, h}, rng);
    Tensor y(DType::kF32, {n, h}), y_ref(DType::kF32, {n, h}), rs(DType::kF32, {n}),
        rs_ref(DType::kF32, {n});
    k().rmsnorm_forward(x, w, 1e-6f, y, rs, offset);
    ref::rmsnorm_forward(x, w, 1e-6f, y_ref, rs_ref, offset);
    expect_close(y, y_ref, 2e-5, 1e-6, "y");
    Tensor dx(DType::kF32, {n, h}), dx_ref(DType::kF32, {n, h});
    Tensor dw = Tensor::zeros(DType::kF32, {h}), dw_ref = Tensor::zeros(DType::kF32, {h});
    k().rmsnorm_backward(dy, x, w, rs, dx, dw, false, offset);
    ref::rmsnorm_backward(dy, x, w, rs, dx_ref, dw_ref, false, offset);
    expect_close(dx, dx_ref, 1e-4, 1e-5, "dx");
    expect_close(dw, dw_ref, 1e-4, 1e-5, "dweight");
  }
}

TEST_P(BackendParity, GatedActivations) {
  std::mt19937 rng(3);
  for (GatedActivation act : {GatedActivation::kSilu, GatedActivation::kGeluTanh}) {
    const bool gelu = act == GatedActivation::kGeluTanh;
    Tensor g = random_tensor(DType::kF32, {5, 67}, rng, 2.0f),
           u = random_tensor(DType::kF32, {5, 67}, rng);
    Tensor dh = random_tensor(DType::kF32, {5, 67}, rng);
    Tensor h(DType::kF32, g.shape()), h_ref(DType::kF32, g.shape());
    k().gated_forward(act, g, u, h);
    (gelu ? ref::geglu_forward : ref::swiglu_forward)(g, u, h_ref);
    expect_close(h, h_ref, 1e-5, 1e-6, gated_activation_name(act));
    Tensor dg(DType::kF32, g.shape()), du(DType::kF32, g.shape());
    Tensor dg_ref(DType::kF32, g.shape()), du_ref(DType::kF32, g.shape());
    k().gated_backward(act, dh, g, u, dg, du);
    (gelu ? ref::geglu_backward : ref::swiglu_backward)(dh, g, u, dg_ref, du_ref);
    expect_close(dg, dg_ref, 1e-4, 1e-5, "dg");
    expect_close(du, du_ref, 1e-4, 1e-5, "du");
  }
}

TEST_P(BackendParity, RopeByStartAndByPosition) {
  std::mt19937 rng(4);
  const int64_t b = 2, t = 5, heads = 3, hd = 8;
  RopeTable table(64, hd, 10000.0);
  Tensor x = random_tensor(DType::kF32, {b, t, heads, hd}, rng);
  Tensor y(DType::kF32, x.shape()), y_ref(DType::kF32, x.shape());
  std::vector<int32_t> pos;
  for (int64_t i = 0; i < b * t; ++i) pos.push_back(static_cast<int32_t>(7 + i % t));
  Tensor positions = make_i32(pos);
  const TensorView positions_bt(positions.data(), DType::kI32, {b, t});
  k().rope_forward(x, y, 7, table);
  ref::rope_forward(x, y_ref, positions_bt, table);
  expect_close(y, y_ref, 1e-5, 1e-6, "start");
  Tensor rows = x.clone();
  TensorView flat(rows.data(), DType::kF32, {1, b * t, heads, hd});
  Tensor y2(DType::kF32, {1, b * t, heads, hd});
  k().rope_forward(flat, y2, positions, table);
  expect_close(y2, y_ref, 1e-5, 1e-6, "positions");
  Tensor dx(DType::kF32, x.shape()), dx_ref(DType::kF32, x.shape());
  k().rope_backward(x, dx, 7, table);
  ref::rope_backward(x, dx_ref, positions_bt, table);
  expect_close(dx, dx_ref, 1e-5, 1e-6, "backward");
}

TEST_P(BackendParity, Attention) {
  std::mt19937 rng(5);
  const int64_t b = 2, t = 11, hq = 4, hkv = 2, hd = 16;
  Tensor q = random_tensor(DType::kF32, {b, t, hq, hd}, rng);
  Tensor kt = random_tensor(DType::kF32, {b, t, hkv, hd}, rng);
  Tensor v = random_tensor(DType::kF32, {b, t, hkv, hd}, rng);
  Tensor o(DType::kF32, q.shape()), o_ref(DType::kF32, q.shape());
  Tensor lse(DType::kF32, {b, hq, t}), lse_ref(DType::kF32, {b, hq, t});
  k().attention_forward(q, kt, v, o, lse);
  ref::attention_forward(q, kt, v, o_ref, lse_ref);
  expect_close(o, o_ref, 1e-4, 1e-5, "out");
  expect_close(lse, lse_ref, 1e-5, 1e-5, "lse");
  Tensor dout = random_tensor(DType::kF32, q.shape(), rng);
  Tensor dq(DType::kF32, q.shape()), dk(DType::kF32, kt.shape()), dv(DType::kF32, v.shape());
  Tensor dq_ref(DType::kF32, q.shape()), dk_ref(DType::kF32, kt.shape()),
      dv_ref(DType::kF32, v.shape());
  k().attention_backward(q, kt, v, o, dout, lse, dq, dk, dv);
  ref::attention_backward(q, kt, v, o_ref, dout, lse_ref, dq_ref, dk_ref, dv_ref);
  expect_close(dq, dq_ref, 1e-3, 1e-4, "dq");
  expect_close(dk, dk_ref, 1e-3, 1e-4, "dk");
  expect_close(dv, dv_ref, 1e-3, 1e-4, "dv");
}

TEST_P(BackendParity, EmbeddingScaled) {
  std::mt19937 rng(6);
  Tensor table = random_tensor(DType::kF32, {13, 24}, rng);
  Tensor ids = make_i32({3, 0, 12, 3, 7});
  Tensor out(DType::kF32, {5, 24}), out_ref(DType::kF32, {5, 24});
  k().embedding_forward(table, ids, out, 4.0f);
  ref::embedding_forward(table, ids, out_ref, 4.0f);
  expect_close(out, out_ref, 0, 0, "forward");
  Tensor dt = Tensor::zeros(DType::kF32, {13, 24}), dt_ref = Tensor::zeros(DType::kF32, {13, 24});
  k().embedding_backward(ids, out, dt, 4.0f);
  ref::embedding_backward(ids, out, dt_ref, 4.0f);
  expect_close(dt, dt_ref, 1e-6, 1e-6, "backward");
}

TEST_P(BackendParity, CrossEntropy) {
  std::mt19937 rng(7);
  const int64_t n = 6, v = 41;
  Tensor logits = random_tensor(DType::kF32, {n, v}, rng, 3.0f);
  Tensor targets = make_i32({1, 40, kIgnoreIndex, 0, 17, 3});
  Tensor d(DType::kF32, {n, v}), d_ref(DType::kF32, {n, v});
  const CrossEntropyResult f = k().cross_entropy_forward(logits, targets);
  const CrossEntropyResult r = k().cross_entropy_fused(logits, targets, d, 0.5f);
  const CrossEntropyResult want = ref::cross_entropy(logits, targets, d_ref, 0.5f);
  EXPECT_EQ(f.count, want.count);
  EXPECT_NEAR(f.loss, want.loss, 1e-5 * std::fabs(want.loss));
  EXPECT_NEAR(r.loss, want.loss, 1e-5 * std::fabs(want.loss));
  expect_close(d, d_ref, 1e-4, 1e-6, "dlogits");
}

TEST_P(BackendParity, PagedCacheWriteReadAndAttention) {
  std::mt19937 rng(8);
  const int64_t pages = 4, page_tokens = 4, hkv = 2, hd = 8, hq = 4, len = 10;
  std::vector<float> kbuf(size_t(pages * page_tokens * hkv * hd)), vbuf(kbuf.size());
  PagedKvCache cache;
  cache.k = kbuf.data();
  cache.v = vbuf.data();
  cache.dtype = DType::kF32;
  cache.num_pages = pages;
  cache.page_tokens = page_tokens;
  cache.n_kv_heads = hkv;
  cache.head_dim = hd;
  const std::vector<int32_t> table = {2, 0, 3};  // positions 0..11 over pages 2, 0, 3
  std::vector<int64_t> slots;
  for (int64_t p = 0; p < len; ++p)
    slots.push_back(table[size_t(p / page_tokens)] * page_tokens + p % page_tokens);
  Tensor kn = random_tensor(DType::kF32, {len, hkv, hd}, rng),
         vn = random_tensor(DType::kF32, {len, hkv, hd}, rng);
  k().paged_kv_write(cache, kn, vn, slots.data());
  Tensor kr(DType::kF32, {len, hkv, hd}), vr(DType::kF32, {len, hkv, hd});
  k().paged_kv_read(cache, table.data(), len, kr, vr);
  expect_close(kr, kn, 0, 0, "k read back");
  expect_close(vr, vn, 0, 0, "v read back");
  Tensor q = random_tensor(DType::kF32, {1, hq, hd}, rng);
  Tensor o(DType::kF32, {1, hq, hd}), o_ref(DType::kF32, {1, hq, hd});
  const PagedAttentionRow row{table.data(), len};
  k().paged_attention(cache, q, &row, o, PagedAttentionParams{});
  ref::paged_attention(cache, q, &row, o_ref);
  expect_close(o, o_ref, 1e-4, 1e-5, "paged attention");
}

TEST_P(BackendParity, MixtureOfExpertsOps) {
  std::mt19937 rng(10);
  const int64_t b = 2, t = 7, n = b * t, e = 5, kk = 2, d = 12, f = 10;
  std::vector<float> logits = randn(size_t(n * e), rng);
  std::vector<float> probs(size_t(n * e)), weights(size_t(n * kk)), probs_ref(probs.size()),
      weights_ref(weights.size());
  std::vector<int32_t> experts(size_t(n * kk)), experts_ref(experts.size());
  k().router_topk_forward(logits.data(), n, e, kk, true, probs.data(), experts.data(),
                          weights.data());
  ref::router_topk_forward(logits.data(), n, e, kk, true, probs_ref.data(), experts_ref.data(),
                           weights_ref.data());
  EXPECT_EQ(experts, experts_ref);
  for (size_t i = 0; i < probs.size(); ++i) ASSERT_NEAR(probs[i], probs_ref[i], 1e-6);
  for (size_t i = 0; i < weights.size(); ++i) ASSERT_NEAR(weights[i], weights_ref[i], 1e-6);
  std::vector<float> dw = randn(weights.size(), rng), dl(logits.size()), dl_ref(logits.size());
  k().router_topk_backward(probs.data(), experts.data(), weights.data(), dw.data(), nullptr, n, e,
                           kk, true, dl.data());
  ref::router_topk_backward(probs.data(), experts.data(), weights.data(), dw.data(), nullptr, n, e,
                            kk, true, dl_ref.data());
  for (size_t i = 0; i < dl.size(); ++i) ASSERT_NEAR(dl[i], dl_ref[i], 1e-5);
  EXPECT_NEAR(k().load_balance_loss(probs.data(), experts.data(), b, t, e, kk, 0.01f, nullptr, 0),
              ref::load_balance_loss(probs.data(), experts.data(), b, t, e, kk, 0.01f, nullptr, 0),
              1e-6);
  EXPECT_NEAR(k().router_z_loss(logits.data(), n, e, 0.001f, nullptr, 0),
              ref::router_z_loss(logits.data(), n, e, 0.001f, nullptr, 0), 1e-6);

  MoeDispatch plan;
  moe_dispatch_plan(experts.data(), b, t, kk, e, -1, &plan);
  const int64_t rows = plan.rows;
  Tensor h = random_tensor(DType::kF32, {n, d}, rng);
  Tensor xs(DType::kF32, {rows, d}), xs_ref(DType::kF32, {rows, d});
  k().moe_gather_rows(h.data(), DType::kF32, plan.row_token.data(), rows, d, xs.data());
  ref::moe_gather_rows(h.data(), DType::kF32, plan.row_token.data(), rows, d, xs_ref.data());
  expect_close(xs, xs_ref, 0, 0, "gather");
  Tensor w = random_tensor(DType::kF32, {e, f, d}, rng);
  Tensor c(DType::kF32, {rows, f}), c_ref(DType::kF32, {rows, f});
  const std::span<const int64_t> sizes(plan.group_sizes.data(), plan.group_sizes.size());
  k().grouped_gemm(xs, w, sizes, c, 0.0f);
  ref::grouped_gemm(xs, w, sizes, c_ref);
  expect_close(c, c_ref, 1e-4, 1e-5, "grouped gemm");
  Tensor dxs(DType::kF32, {rows, d}), dxs_ref(DType::kF32, {rows, d});
  k().grouped_gemm_input_grad(c, w, sizes, dxs, 0.0f);
  ref::grouped_gemm_input_grad(c, w, sizes, dxs_ref);
  expect_close(dxs, dxs_ref, 1e-4, 1e-4, "grouped gemm input grad");
  Tensor gw = Tensor::zeros(DType::kF32, {e, f, d}), gw_ref = Tensor::zeros(DType::kF32, {e, f, d});
  k().grouped_gemm_weight_grad(xs, c, sizes, gw);
  ref::grouped_gemm_weight_grad(xs, c, sizes, gw_ref);
  expect_close(gw, gw_ref, 1e-4, 1e-4, "grouped gemm weight grad");
  Tensor out = Tensor::zeros(DType::kF32, {n, d}), out_ref = Tensor::zeros(DType::kF32, {n, d});
  k().moe_combine(xs.data(), DType::kF32, plan.pair_row.data(), weights.data(), n, kk, d,
                  out.as<float>());
  ref::moe_combine(xs.data(), DType::kF32, plan.pair_row.data(), weights.data(), n, kk, d,
                   out_ref.as<float>());
  expect_close(out, out_ref, 1e-5, 1e-6, "combine");
  Tensor dy(DType::kF32, {rows, d}), dy_ref(DType::kF32, {rows, d});
  std::vector<float> dwt(weights.size()), dwt_ref(weights.size());
  k().moe_combine_backward(h.as<float>(), xs.data(), DType::kF32, plan.pair_row.data(),
                           plan.row_token.data(), weights.data(), n, kk, d, rows, dy.data(),
                           dwt.data());
  ref::moe_combine_backward(h.as<float>(), xs.data(), DType::kF32, plan.pair_row.data(),
                            plan.row_token.data(), weights.data(), n, kk, d, rows, dy_ref.data(),
                            dwt_ref.data());
  expect_close(dy, dy_ref, 1e-5, 1e-6, "combine backward");
  for (size_t i = 0; i < dwt.size(); ++i) ASSERT_NEAR(dwt[i], dwt_ref[i], 1e-4);
  Tensor dsrc = Tensor::zeros(DType::kF32, {n, d}), dsrc_ref = Tensor::zeros(DType::kF32, {n, d});
  k().moe_scatter_add_rows(xs.data(), DType::kF32, plan.pair_row.data(), n, kk, d,
                           dsrc.as<float>());
  ref::moe_scatter_add_rows(xs.data(), DType::kF32, plan.pair_row.data(), n, kk, d,
                            dsrc_ref.as<float>());
  expect_close(dsrc, dsrc_ref, 1e-5, 1e-6, "scatter add");
}

TEST_P(BackendParity, MemoryOps) {
  std::mt19937 rng(9);
  Tensor a = random_tensor(DType::kF32, {1000}, rng);
  Tensor b(DType::kBF16, {1000}), back(DType::kF32, {1000}), c(DType::kF32, {1000});
  k().convert(a.data(), DType::kF32, b.data(), DType::kBF16, 1000);
  k().convert(b.data(), DType::kBF16, back.data(), DType::kF32, 1000);
  expect_close(back, a, 1.0 / 128, 0, "bf16 round trip");
  k().copy(a.data(), c.data(), c.nbytes());
  EXPECT_TRUE(bitwise_equal(a, c));
  k().zero(c.data(), c.nbytes());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(at(c, i), 0.0);
  DeviceBuffer buf(k().allocator(), 4096);
  EXPECT_EQ(buf.device(), k().device());
  EXPECT_TRUE(is_aligned(buf.data()));
}

// A view on another device is refused by name, never read as host memory.
TEST(HostBackend, RefusesViewsOfAnotherDevice) {
  Tensor x = Tensor::zeros(DType::kF32, {2, 8}), w = Tensor::zeros(DType::kF32, {8});
  Tensor y(DType::kF32, {2, 8}), rs(DType::kF32, {2});
  TensorView on_gpu = x;
  on_gpu.device = Device::kCuda;
  expect_error([&] { host_backend().rmsnorm_forward(on_gpu, w, 1e-6f, y, rs, 0.0f); },
               {"rmsnorm_forward", "host backend", "cuda"});
  EXPECT_EQ(&backend_for(Device::kHost), &host_backend());
  if (built_backends().size() == 1)
    expect_error([] { backend_for(Device::kCuda); }, {"no cuda kernel backend"});
}

INSTANTIATE_TEST_SUITE_P(Built, BackendParity, testing::ValuesIn(built_backends()),
                         [](const testing::TestParamInfo<KernelBackend*>& i) {
                           return std::string(i.param->name());
                         });

}  // namespace
}  // namespace hyperion
