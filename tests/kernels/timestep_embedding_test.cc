#include "kernels/timestep_embedding.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernel_test_util.h"

namespace hyperion {
namespace {

using namespace testing_util;

TEST(TimestepEmbedding, MatchesReferenceForUnetAndSdxlSettings) {
  const std::vector<float> t = {0.0f, 1.0f, 999.0f, 481.5f, 14.6146f};
  for (TimestepEmbeddingParams p :
       {TimestepEmbeddingParams{320, true, 0.0f}, TimestepEmbeddingParams{256, true, 0.0f},
        TimestepEmbeddingParams{33, false, 1.0f}, TimestepEmbeddingParams{8, true, 0.0f, 2.0f, 100.0f}}) {
    SCOPED_TRACE(testing::Message() << "dim " << p.dim << " flip " << p.flip_sin_to_cos);
    std::vector<float> out(t.size() * size_t(p.dim)), want(out.size());
    timestep_embedding(t.data(), int64_t(t.size()), p, out.data());
    ref::timestep_embedding(t.data(), int64_t(t.size()), p, want.data());
    // f32 arguments up to ~1000 rad: sin/cos of an argument rounded to f32 (ulp 6e-5).
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], want[i], 2e-4) << i;
  }
}

TEST(TimestepEmbedding, LayoutIsCosThenSinWithFlip) {
  // t = 0: sin = 0, cos = 1 for every frequency.
  const float t = 0.0f;
  std::vector<float> out(6);
  timestep_embedding(&t, 1, {6, true, 0.0f}, out.data());
  EXPECT_EQ(out, (std::vector<float>{1, 1, 1, 0, 0, 0}));
  timestep_embedding(&t, 1, {6, false, 0.0f}, out.data());
  EXPECT_EQ(out, (std::vector<float>{0, 0, 0, 1, 1, 1}));
  // The first frequency is 1: sin(t) at t = 1.
  const float one = 1.0f;
  timestep_embedding(&one, 1, {6, false, 1.0f}, out.data());
  EXPECT_FLOAT_EQ(out[0], std::sin(1.0f));
}

}  // namespace
}  // namespace hyperion
