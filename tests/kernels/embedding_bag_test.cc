#include "kernels/embedding_bag.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/quantize.h"

namespace hyperion {
namespace {

using namespace testing_util;

// Tables of mixed shapes and the rows behind them (f32 values; bf16 / int8 copies).
struct TableSet {
  std::vector<std::vector<float>> f32;
  std::vector<std::vector<bf16>> b16;
  std::vector<std::vector<int8_t>> i8;
  std::vector<std::vector<float>> scales;
  std::vector<std::vector<float>> state;
  std::vector<EmbeddingBagTable> tables;
  int64_t width = 0;
};

TableSet make_tables(DType dtype, const std::vector<std::pair<int64_t, int64_t>>& shapes,
                     Pooling pooling, SparseOptimizer opt, std::mt19937& rng) {
  TableSet s;
  s.f32.resize(shapes.size());
  s.b16.resize(shapes.size());
  s.i8.resize(shapes.size());
  s.scales.resize(shapes.size());
  s.state.resize(shapes.size());
  for (size_t t = 0; t < shapes.size(); ++t) {
    const auto [rows, dim] = shapes[t];
    s.f32[t] = randn(size_t(rows * dim), rng, 0.5f);
    EmbeddingBagTable tab;
    tab.rows = rows;
    tab.dim = dim;
    tab.dtype = dtype;
    tab.pooling = pooling;
    tab.out_column = s.width + 1;  // a gap column before each table
    s.width += dim + 1;
    if (dtype == DType::kF32) {
      tab.weights = s.f32[t].data();
    } else if (dtype == DType::kBF16) {
      s.b16[t].resize(s.f32[t].size());
      for (size_t i = 0; i < s.f32[t].size(); ++i) s.b16[t][i] = f32_to_bf16(s.f32[t][i]);
      tab.weights = s.b16[t].data();
    } else {
      s.i8[t].resize(s.f32[t].size());
      s.scales[t].resize(size_t(rows));
      quantize_rows(TensorView(s.f32[t].data(), DType::kF32, {rows, dim}),
                    TensorView(s.i8[t].data(), DType::kI8, {rows, dim}), s.scales[t].data());
      tab.weights = s.i8[t].data();
      tab.row_scales = s.scales[t].data();
    }
    // Non-zero starting state, so a wrongly touched row shows.
    s.state[t].assign(size_t(rows * sparse_optimizer_state_per_row(opt, dim)), 0.25f);
    tab.state = s.state[t].empty() ? nullptr : s.state[t].data();
    s.tables.push_back(tab);
  }
  s.width += 3;
  return s;
}

struct Bags {
  std::vector<int32_t> ids;
  std::vector<int64_t> offsets{0};
  std::vector<float> weights;
  BagBatch view(int64_t tables, int64_t batch, bool weighted) const {
    return {tables, batch, ids.data(), offsets.data(), weighted ? weights.data() : nullptr};
  }
};

// Bags of 0..max_bag ids drawn from a few hot ids and the whole table (duplicates within
// and across bags).
Bags make_bags(const std::vector<std::pair<int64_t, int64_t>>& shapes, int64_t batch, int max_bag,
               std::mt19937& rng) {
  Bags b;
  std::uniform_int_distribution<int> len(0, max_bag);
  std::uniform_real_distribution<float> w(-1.5f, 1.5f);
  for (const auto& [rows, dim] : shapes) {
    std::uniform_int_distribution<int32_t> any(0, int32_t(rows - 1));
    std::uniform_int_distribution<int32_t> hot(0, int32_t(std::min<int64_t>(rows, 3) - 1));
    for (int64_t i = 0; i < batch; ++i) {
      const int n = len(rng);
      for (int k = 0; k < n; ++k) {
        b.ids.push_back(k % 2 ? hot(rng) : any(rng));
        b.weights.push_back(w(rng));
      }
      b.offsets.push_back(int64_t(b.ids.size()));
    }
  }
  return b;
}

const std::vector<std::pair<int64_t, int64_t>> kShapes = {{50, 128}, {7, 24}, {300, 7}, {1, 64}};

void expect_near_all(const std::vector<float>& a, const std::vector<float>& b, float tol,
                     const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], tol * (1.0f + std::fabs(b[i]))) << what << " at " << i;
}

TEST(EmbeddingBag, ForwardMatchesReference) {
  RestoreNumThreads restore;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI8})
    for (Pooling pooling : {Pooling::kSum, Pooling::kMean, Pooling::kSqrtN})
      for (bool weighted : {false, true})
        for (int threads : {1, 2}) {
          SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " " << pooling_name(pooling)
                                            << " weighted " << weighted << " threads " << threads);
          set_num_threads(threads);
          std::mt19937 rng(7);
          TableSet s = make_tables(dtype, kShapes, pooling, SparseOptimizer::kSgd, rng);
          const int64_t batch = 37;
          Bags b = make_bags(kShapes, batch, 25, rng);
          const BagBatch bags = b.view(int64_t(kShapes.size()), batch, weighted);
          std::vector<float> want(size_t(batch * s.width), -7.0f);
          ref::embedding_bag_forward(s.tables, bags, want.data(), s.width);
          for_each_target([&] {
            std::vector<float> got(size_t(batch * s.width), -7.0f);
            embedding_bag_forward(s.tables, bags, got.data(), s.width);
            expect_near_all(got, want, 2e-6f, "pooled");
          });
        }
}

TEST(EmbeddingBag, PoolingByHand) {
  // Table of 3 rows, dim 2; bags {0, 2, 2}, {}, {1} with weights.
  std::vector<float> w = {1, 2, 10, 20, 100, 200};
  EmbeddingBagTable t;
  t.weights = w.data();
  t.rows = 3;
  t.dim = 2;
  std::vector<int32_t> ids = {0, 2, 2, 1};
  std::vector<int64_t> off = {0, 3, 3, 4};
  std::vector<float> wt = {1, 0.5f, 0.5f, 2};
  for (Pooling p : {Pooling::kSum, Pooling::kMean, Pooling::kSqrtN}) {
    t.pooling = p;
    std::vector<float> out(6, -1.0f);
    embedding_bag_forward({&t, 1}, {1, 3, ids.data(), off.data(), wt.data()}, out.data(), 2);
    const float f3 = p == Pooling::kSum    ? 1.0f
                     : p == Pooling::kMean ? 1.0f / 3
                                           : 1 / std::sqrt(3.0f);
    const float f1 = 1.0f;
    EXPECT_FLOAT_EQ(out[0], (1 + 100) * f3);
    EXPECT_FLOAT_EQ(out[1], (2 + 200) * f3);
    EXPECT_EQ(out[2], 0.0f);  // the empty bag
    EXPECT_EQ(out[3], 0.0f);
    EXPECT_FLOAT_EQ(out[4], 20 * f1);
    EXPECT_FLOAT_EQ(out[5], 40 * f1);
  }
}

TEST(EmbeddingBag, FusedUpdateMatchesReferenceWithDuplicates) {
  RestoreNumThreads restore;
  for (DType dtype : {DType::kF32, DType::kBF16})
    for (SparseOptimizer opt :
         {SparseOptimizer::kSgd, SparseOptimizer::kAdagrad, SparseOptimizer::kRowwiseAdagrad})
      for (Pooling pooling : {Pooling::kSum, Pooling::kMean, Pooling::kSqrtN})
        for (int threads : {1, 2}) {
          SCOPED_TRACE(::testing::Message()
                       << dtype_name(dtype) << " " << sparse_optimizer_name(opt) << " "
                       << pooling_name(pooling) << " threads " << threads);
          set_num_threads(threads);
          for_each_target([&] {
            std::mt19937 rng(11);
            TableSet want = make_tables(dtype, kShapes, pooling, opt, rng);
            std::mt19937 rng2(11);
            TableSet got = make_tables(dtype, kShapes, pooling, opt, rng2);
            const int64_t batch = 29;
            Bags b = make_bags(kShapes, batch, 9, rng);
            const BagBatch bags = b.view(int64_t(kShapes.size()), batch, true);
            const std::vector<float> dout = randn(size_t(batch * want.width), rng);
            const SparseOptimizerArgs args{opt, 0.05f, 1e-8f};
            const int64_t n_ref = ref::embedding_bag_backward_update(want.tables, bags, dout.data(),
                                                                     want.width, args);
            EmbeddingBagScratch scratch;
            const int64_t n = embedding_bag_backward_update(got.tables, bags, dout.data(),
                                                            got.width, args, &scratch);
            EXPECT_EQ(n, n_ref);
            for (size_t t = 0; t < kShapes.size(); ++t) {
              if (dtype == DType::kF32) {
                expect_near_all(got.f32[t], want.f32[t], 1e-5f, "weights");
              } else {
                for (size_t i = 0; i < got.b16[t].size(); ++i)
                  ASSERT_NEAR(bf16_to_f32(got.b16[t][i]), bf16_to_f32(want.b16[t][i]),
                              1e-2f * (1 + std::fabs(bf16_to_f32(want.b16[t][i]))))
                      << "table " << t << " element " << i;
              }
              expect_near_all(got.state[t], want.state[t], 1e-5f, "state");
            }
          });
        }
}

TEST(EmbeddingBag, UpdateTouchesOnlyUsedRows) {
  std::mt19937 rng(3);
  const std::vector<std::pair<int64_t, int64_t>> shape = {{1000, 16}};
  TableSet s = make_tables(DType::kF32, shape, Pooling::kSum, SparseOptimizer::kAdagrad, rng);
  const std::vector<float> before = s.f32[0], state_before = s.state[0];
  std::vector<int32_t> ids = {5, 17, 5, 999};
  std::vector<int64_t> off = {0, 2, 4};
  std::vector<float> dout = randn(size_t(2 * s.width), rng);
  const int64_t n =
      embedding_bag_backward_update(s.tables, {1, 2, ids.data(), off.data(), nullptr}, dout.data(),
                                    s.width, {SparseOptimizer::kAdagrad, 0.1f, 1e-10f});
  EXPECT_EQ(n, 3);
  for (int64_t row = 0; row < 1000; ++row) {
    const bool used = row == 5 || row == 17 || row == 999;
    for (int64_t j = 0; j < 16; ++j) {
      const size_t i = size_t(row * 16 + j);
      EXPECT_EQ(s.f32[0][i] != before[i], used) << "row " << row;
      EXPECT_EQ(s.state[0][i] != state_before[i], used) << "row " << row;
    }
  }
}

// The accumulated gradient of L = sum(dout * pooled) equals finite differences of the
// forward pass.
TEST(EmbeddingBag, GradientMatchesFiniteDifferences) {
  std::mt19937 rng(5);
  const std::vector<std::pair<int64_t, int64_t>> shape = {{6, 5}};
  for (Pooling pooling : {Pooling::kSum, Pooling::kMean, Pooling::kSqrtN}) {
    TableSet s = make_tables(DType::kF32, shape, pooling, SparseOptimizer::kAccumulate, rng);
    Bags b = make_bags(shape, 4, 6, rng);
    const BagBatch bags = b.view(1, 4, true);
    const std::vector<float> dout = randn(size_t(4 * s.width), rng);
    auto loss = [&]() {
      std::vector<float> out(size_t(4 * s.width), 0.0f);
      embedding_bag_forward(s.tables, bags, out.data(), s.width);
      double l = 0;
      for (size_t i = 0; i < out.size(); ++i) l += double(out[i]) * dout[i];
      return l;
    };
    std::vector<float> grad(s.f32[0].size(), 0.0f);
    EmbeddingBagTable g = s.tables[0];
    g.weights = grad.data();
    embedding_bag_backward_update({&g, 1}, bags, dout.data(), s.width,
                                  {SparseOptimizer::kAccumulate, 0, 0});
    for (size_t i = 0; i < grad.size(); ++i) {
      const float x = s.f32[0][i], h = 1e-2f;
      s.f32[0][i] = x + h;
      const double up = loss();
      s.f32[0][i] = x - h;
      const double down = loss();
      s.f32[0][i] = x;
      EXPECT_NEAR(grad[i], (up - down) / (2 * h), 2e-3) << pooling_name(pooling) << " " << i;
    }
  }
}

TEST(EmbeddingBag, DedupIds) {
  std::vector<int32_t> ids = {9, 3, 9, 0, 3, 3}, unique, inverse;
  dedup_ids(ids.data(), int64_t(ids.size()), unique, inverse);
  EXPECT_EQ(unique, (std::vector<int32_t>{0, 3, 9}));
  for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(unique[size_t(inverse[i])], ids[i]);
}

TEST(EmbeddingBag, RejectsBadInput) {
  std::vector<float> w(20, 0.0f), out(10, 0.0f);
  EmbeddingBagTable t;
  t.weights = w.data();
  t.rows = 4;
  t.dim = 5;
  std::vector<int32_t> ids = {1, 4};
  std::vector<int64_t> off = {0, 1, 2};
  const std::string msg = error_message([&] {
    embedding_bag_forward({&t, 1}, {1, 2, ids.data(), off.data(), nullptr}, out.data(), 5);
  });
  EXPECT_NE(msg.find("id 4 at position 1 is out of range for table 0 (4 rows)"), std::string::npos)
      << msg;
  ids[1] = 0;
  off = {0, 2, 1};
  EXPECT_NE(
      error_message([&] {
        embedding_bag_forward({&t, 1}, {1, 2, ids.data(), off.data(), nullptr}, out.data(), 5);
      }).find("offsets decrease at bag 1"),
      std::string::npos);
  off = {0, 1, 2};
  EXPECT_NE(
      error_message([&] {
        embedding_bag_forward({&t, 1}, {1, 2, ids.data(), off.data(), nullptr}, out.data(), 4);
      }).find("writes columns [0, 5) of rows 4 wide"),
      std::string::npos);
  EXPECT_NE(error_message([&] {
              embedding_bag_backward_update({&t, 1}, {1, 2, ids.data(), off.data(), nullptr},
                                            out.data(), 5, {SparseOptimizer::kAdagrad, 0.1f, 0});
            }).find("adagrad needs optimizer state for table 0"),
            std::string::npos);
  EXPECT_NE(error_message([] {
              parse_pooling("max", "config key pooling");
            }).find("config key pooling: unknown pooling 'max'"),
            std::string::npos);
}

}  // namespace
}  // namespace hyperion
