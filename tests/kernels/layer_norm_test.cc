#include "kernels/layer_norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "finite_difference.h"
#include "kernel_test_util.h"

namespace hyperion {
namespace {

using namespace testing_util;

const std::vector<std::pair<int64_t, int64_t>> kShapes = {{1, 1},  {3, 7},   {5, 17},  {40, 33},
                                                          {2, 320}, {77, 64}, {9, 129}};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * std::max(1.0, double(std::fabs(want[i])))) << what << " " << i;
}

std::vector<float> offset_randn(size_t n, std::mt19937& rng) {
  auto v = randn(n, rng);
  for (float& x : v) x = 2.0f + 1.5f * x;
  return v;
}

TEST(LayerNorm, ForwardAndBackwardMatchReference) {
  std::mt19937 rng(1);
  for_each_target([&] {
    for (auto [rows, cols] : kShapes) {
      SCOPED_TRACE(testing::Message() << rows << "x" << cols);
      const auto x = offset_randn(size_t(rows * cols), rng), dy = randn(x.size(), rng);
      const auto g = randn(size_t(cols), rng), b = randn(size_t(cols), rng);
      std::vector<float> y(x.size()), y_ref(x.size()), m(static_cast<size_t>(rows)), m_ref(m.size()),
          r(m.size()), r_ref(m.size());
      layer_norm_forward(x.data(), rows, cols, g.data(), b.data(), 1e-5f, y.data(), m.data(), r.data());
      ref::layer_norm_forward(x.data(), rows, cols, g.data(), b.data(), 1e-5f, y_ref.data(),
                              m_ref.data(), r_ref.data());
      expect_close(m, m_ref, 1e-6, "mean");
      expect_close(r, r_ref, 1e-5, "rstd");
      expect_close(y, y_ref, 2e-5, "y");
      const auto dg0 = randn(size_t(cols), rng), db0 = randn(size_t(cols), rng);
      std::vector<float> dx(x.size()), dx_ref(x.size()), dg = dg0, dg_ref = dg0, db = db0, db_ref = db0;
      layer_norm_backward(dy.data(), x.data(), rows, cols, g.data(), m.data(), r.data(), dx.data(),
                          dg.data(), db.data());
      ref::layer_norm_backward(dy.data(), x.data(), rows, cols, g.data(), m.data(), r.data(),
                               dx_ref.data(), dg_ref.data(), db_ref.data());
      expect_close(dx, dx_ref, 5e-5, "dx");
      expect_close(dg, dg_ref, 2e-5, "dgamma");
      expect_close(db, db_ref, 2e-5, "dbeta");
      // dx may overwrite dy.
      std::vector<float> inplace = dy, dg2 = dg0, db2 = db0;
      layer_norm_backward(inplace.data(), x.data(), rows, cols, g.data(), m.data(), r.data(),
                          inplace.data(), dg2.data(), db2.data());
      EXPECT_EQ(inplace, dx);
    }
  });
}

TEST(LayerNorm, ReferenceBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(2);
  const int64_t rows = 3, cols = 7;
  const auto x = offset_randn(size_t(rows * cols), rng), dy = randn(x.size(), rng);
  const auto g = randn(size_t(cols), rng), b = randn(size_t(cols), rng);
  std::vector<float> y(x.size()), m(rows), r(rows), dx(x.size()), dg(cols, 0.0f), db(cols, 0.0f);
  ref::layer_norm_forward(x.data(), rows, cols, g.data(), b.data(), 1e-5f, y.data(), m.data(), r.data());
  ref::layer_norm_backward(dy.data(), x.data(), rows, cols, g.data(), m.data(), r.data(), dx.data(),
                           dg.data(), db.data());
  std::vector<float> mm(rows), rr(rows);
  auto fx = [&](const std::vector<float>& v, std::vector<float>& out) {
    ref::layer_norm_forward(v.data(), rows, cols, g.data(), b.data(), 1e-5f, out.data(), mm.data(), rr.data());
  };
  auto fg = [&](const std::vector<float>& v, std::vector<float>& out) {
    ref::layer_norm_forward(x.data(), rows, cols, v.data(), b.data(), 1e-5f, out.data(), mm.data(), rr.data());
  };
  const auto cx = sample_coords(x.size(), 12, rng);
  const auto fdx = finite_difference(fx, x, dy, cx, 1e-3);
  for (size_t i = 0; i < cx.size(); ++i) EXPECT_NEAR(dx[cx[i]], fdx[i], 2e-3) << "dx " << cx[i];
  const auto cg = sample_coords(g.size(), 5, rng);
  const auto fdg = finite_difference(fg, g, dy, cg);
  for (size_t i = 0; i < cg.size(); ++i) EXPECT_NEAR(dg[cg[i]], fdg[i], 2e-3) << "dgamma " << cg[i];
  double dbeta_sum = 0.0;  // dbeta[c] = sum over rows of dy[:, c]
  for (int64_t i = 0; i < rows; ++i) dbeta_sum += dy[size_t(i * cols + 2)];
  EXPECT_NEAR(db[2], dbeta_sum, 1e-6);
}

TEST(LayerNorm, SameBitsForAnyThreadCount) {
  RestoreNumThreads restore;
  std::mt19937 rng(3);
  const int64_t rows = 200, cols = 96;
  const auto x = offset_randn(size_t(rows * cols), rng), dy = randn(x.size(), rng);
  const auto g = randn(size_t(cols), rng), b = randn(size_t(cols), rng);
  std::vector<float> outs[2];
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::vector<float> y(x.size()), m(rows), r(rows), dx(x.size()), dg(cols, 0.0f), db(cols, 0.0f);
    layer_norm_forward(x.data(), rows, cols, g.data(), b.data(), 1e-5f, y.data(), m.data(), r.data());
    layer_norm_backward(dy.data(), x.data(), rows, cols, g.data(), m.data(), r.data(), dx.data(),
                        dg.data(), db.data());
    for (auto* v : {&y, &dx, &dg, &db}) outs[threads - 1].insert(outs[threads - 1].end(), v->begin(), v->end());
  }
  EXPECT_EQ(outs[0], outs[1]);
}

}  // namespace
}  // namespace hyperion
