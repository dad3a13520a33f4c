#include "kernels/group_norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "finite_difference.h"
#include "kernel_test_util.h"

namespace hyperion {
namespace {

using namespace testing_util;

// Odd channel counts (tails), one group per channel, one group in all, more pixels than
// one statistics block (64), and a UNet-like 32 groups of 10.
const std::vector<GroupNormShape> kShapes = {{1, 1, 1, 1},   {2, 7, 6, 3},     {1, 65, 12, 4},
                                             {3, 10, 17, 1}, {2, 130, 320, 32}, {1, 9, 24, 24}};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * std::max(1.0, double(std::fabs(want[i])))) << what << " " << i;
}

struct Data {
  std::vector<float> x, gamma, beta, dy;
};

Data random_data(const GroupNormShape& s, std::mt19937& rng) {
  const size_t n = size_t(s.batch * s.pixels * s.channels);
  Data d{randn(n, rng), randn(size_t(s.channels), rng), randn(size_t(s.channels), rng), randn(n, rng)};
  for (float& v : d.x) v = 3.0f + 2.0f * v;  // an offset mean: the variance must not cancel
  return d;
}

TEST(GroupNorm, ForwardMatchesReference) {
  std::mt19937 rng(1);
  for_each_target([&] {
    for (const GroupNormShape& s : kShapes) {
      SCOPED_TRACE(testing::Message() << s.batch << "x" << s.pixels << "x" << s.channels << " G" << s.groups);
      const Data d = random_data(s, rng);
      const size_t stats = size_t(s.batch * s.groups);
      std::vector<float> y(d.x.size()), y_ref(d.x.size()), m(stats), m_ref(stats), r(stats), r_ref(stats);
      group_norm_forward(s, d.x.data(), d.gamma.data(), d.beta.data(), 1e-5f, y.data(), m.data(), r.data());
      ref::group_norm_forward(s, d.x.data(), d.gamma.data(), d.beta.data(), 1e-5f, y_ref.data(),
                              m_ref.data(), r_ref.data());
      expect_close(m, m_ref, 1e-6, "mean");
      expect_close(r, r_ref, 1e-5, "rstd");
      expect_close(y, y_ref, 2e-5, "y");
      // In place.
      std::vector<float> inplace = d.x;
      group_norm_forward(s, inplace.data(), d.gamma.data(), d.beta.data(), 1e-5f, inplace.data(),
                         m.data(), r.data());
      EXPECT_EQ(inplace, y);
    }
  });
}

TEST(GroupNorm, BackwardMatchesReferenceAndAccumulates) {
  std::mt19937 rng(2);
  for_each_target([&] {
    for (const GroupNormShape& s : kShapes) {
      SCOPED_TRACE(testing::Message() << s.batch << "x" << s.pixels << "x" << s.channels << " G" << s.groups);
      const Data d = random_data(s, rng);
      const size_t stats = size_t(s.batch * s.groups);
      std::vector<float> y(d.x.size()), m(stats), r(stats);
      group_norm_forward(s, d.x.data(), d.gamma.data(), d.beta.data(), 1e-5f, y.data(), m.data(), r.data());
      const auto dg0 = randn(size_t(s.channels), rng), db0 = randn(size_t(s.channels), rng);
      std::vector<float> dx(d.x.size()), dx_ref(d.x.size()), dg = dg0, dg_ref = dg0, db = db0, db_ref = db0;
      group_norm_backward(s, d.dy.data(), d.x.data(), d.gamma.data(), m.data(), r.data(), dx.data(),
                          dg.data(), db.data());
      ref::group_norm_backward(s, d.dy.data(), d.x.data(), d.gamma.data(), m.data(), r.data(),
                               dx_ref.data(), dg_ref.data(), db_ref.data());
      expect_close(dx, dx_ref, 5e-5, "dx");
      expect_close(dg, dg_ref, 2e-5, "dgamma");
      expect_close(db, db_ref, 2e-5, "dbeta");
    }
  });
}

TEST(GroupNorm, ReferenceBackwardMatchesFiniteDifferences) {
  std::mt19937 rng(3);
  const GroupNormShape s{2, 5, 6, 2};
  const Data d = random_data(s, rng);
  const size_t stats = size_t(s.batch * s.groups);
  std::vector<float> y(d.x.size()), m(stats), r(stats);
  ref::group_norm_forward(s, d.x.data(), d.gamma.data(), d.beta.data(), 1e-5f, y.data(), m.data(), r.data());
  std::vector<float> dx(d.x.size()), dg(d.gamma.size(), 0.0f), db(d.beta.size(), 0.0f);
  ref::group_norm_backward(s, d.dy.data(), d.x.data(), d.gamma.data(), m.data(), r.data(), dx.data(),
                           dg.data(), db.data());
  std::vector<float> mm(stats), rr(stats);
  auto fx = [&](const std::vector<float>& v, std::vector<float>& out) {
    ref::group_norm_forward(s, v.data(), d.gamma.data(), d.beta.data(), 1e-5f, out.data(), mm.data(), rr.data());
  };
  auto fg = [&](const std::vector<float>& v, std::vector<float>& out) {
    ref::group_norm_forward(s, d.x.data(), v.data(), d.beta.data(), 1e-5f, out.data(), mm.data(), rr.data());
  };
  auto fb = [&](const std::vector<float>& v, std::vector<float>& out) {
    ref::group_norm_forward(s, d.x.data(), d.gamma.data(), v.data(), 1e-5f, out.data(), mm.data(), rr.data());
  };
  const auto cx = sample_coords(d.x.size(), 16, rng);
  const auto fdx = finite_difference(fx, d.x, d.dy, cx, 1e-3);
  for (size_t i = 0; i < cx.size(); ++i) EXPECT_NEAR(dx[cx[i]], fdx[i], 2e-3) << "dx " << cx[i];
  const auto cg = sample_coords(d.gamma.size(), 6, rng);
  const auto fdg = finite_difference(fg, d.gamma, d.dy, cg);
  for (size_t i = 0; i < cg.size(); ++i) EXPECT_NEAR(dg[cg[i]], fdg[i], 2e-3) << "dgamma " << cg[i];
  const auto fdb = finite_difference(fb, d.beta, d.dy, cg);
  for (size_t i = 0; i < cg.size(); ++i) EXPECT_NEAR(db[cg[i]], fdb[i], 2e-3) << "dbeta " << cg[i];
}

TEST(GroupNorm, SameBitsForAnyThreadCount) {
  RestoreNumThreads restore;
  std::mt19937 rng(4);
  const GroupNormShape s{2, 300, 64, 32};
  const Data d = random_data(s, rng);
  std::vector<float> outs[2];
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    const size_t stats = size_t(s.batch * s.groups);
    std::vector<float> y(d.x.size()), m(stats), r(stats), dx(d.x.size()), dg(64, 0.0f), db(64, 0.0f);
    group_norm_forward(s, d.x.data(), d.gamma.data(), d.beta.data(), 1e-5f, y.data(), m.data(), r.data());
    group_norm_backward(s, d.dy.data(), d.x.data(), d.gamma.data(), m.data(), r.data(), dx.data(),
                        dg.data(), db.data());
    for (auto* v : {&y, &dx, &dg, &db}) outs[threads - 1].insert(outs[threads - 1].end(), v->begin(), v->end());
  }
  EXPECT_EQ(outs[0], outs[1]);
}

TEST(GroupNorm, RefusesChannelsNotSplittingIntoGroups) {
  std::vector<float> buf(64);
  EXPECT_NE(error_message([&] {
              group_norm_forward({1, 2, 10, 4}, buf.data(), buf.data(), buf.data(), 1e-5f, buf.data(),
                                 buf.data(), buf.data());
            }).find("10 channels do not split into 4 groups"),
            std::string::npos);
}

}  // namespace
}  // namespace hyperion
