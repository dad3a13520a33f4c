#include "kernels/embedding.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/threads.h"
#include "kernel_test_util.h"
#include "tensor/convert.h"

namespace hyperion {
namespace {

using namespace testing_util;

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> pick(0, int32_t(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = pick(rng);
  return ids;
}

const DType kDTypes[] = {DType::kF32, DType::kBF16};

TEST(Embedding, ForwardMatchesReference) {
  std::mt19937 rng(21);
  for (DType tt : kDTypes) {
    for (DType ot : kDTypes) {
      for (int64_t vocab : {1, 5, 17, 1000}) {
        for (int64_t hidden : {1, 7, 17, 64, 100}) {
          SCOPED_TRACE(fmt::format("table {} out {} V {} H {}", dtype_name(tt), dtype_name(ot),
                                   vocab, hidden));
          const int64_t n = 23;
          Tensor table = make_tensor(tt, {vocab, hidden}, randn(size_t(vocab * hidden), rng));
          Tensor ids = make_i32(random_ids(n, vocab, rng));
          Tensor out(ot, {n, hidden}), out_ref(ot, {n, hidden});
          embedding_forward(table, ids, out);
          ref::embedding_forward(table, ids, out_ref);
          // A gather and a single rounding: bitwise equal to the reference.
          ASSERT_EQ(std::memcmp(out.data(), out_ref.data(), out.nbytes()), 0);
        }
      }
    }
  }
}

TEST(Embedding, BackwardMatchesReferenceWithRepeatedIds) {
  std::mt19937 rng(22);
  for_each_target([&] {
    for (DType gt : kDTypes) {
      for (int64_t vocab : {1, 5, 17, 1000}) {
        for (int64_t hidden : {1, 7, 17, 64, 100}) {
          SCOPED_TRACE(fmt::format("dout {} V {} H {}", dtype_name(gt), vocab, hidden));
          const int64_t n = 40;
          // Few distinct ids so most of them repeat.
          auto idv = random_ids(n, std::min<int64_t>(vocab, 4), rng);
          Tensor ids = make_i32(idv);
          Tensor dout = make_tensor(gt, {n, hidden}, randn(size_t(n * hidden), rng));
          auto init = randn(size_t(vocab * hidden), rng);  // backward accumulates
          Tensor dtable = make_tensor(DType::kF32, {vocab, hidden}, init);
          Tensor dtable_ref = make_tensor(DType::kF32, {vocab, hidden}, init);
          embedding_backward(ids, dout, dtable);
          ref::embedding_backward(ids, dout, dtable_ref);
          // Same additions in the same order (ascending position): bitwise equal.
          ASSERT_EQ(std::memcmp(dtable.data(), dtable_ref.data(), dtable.nbytes()), 0);
        }
      }
    }
  });
}

// Gemma's scaled embedding (x = table[id] * sqrt(H)) and its gradient: the forward is
// bitwise equal to the reference (one rounding of the product), the gradient within
// rounding (repeated ids summed in order).
TEST(Embedding, ScaledForwardAndBackwardMatchReference) {
  std::mt19937 rng(26);
  const float scale = std::sqrt(96.0f);
  for_each_target([&] {
    for (DType tt : kDTypes) {
      for (int64_t hidden : {1, 7, 17, 96}) {
        SCOPED_TRACE(fmt::format("table {} H {}", dtype_name(tt), hidden));
        const int64_t vocab = 11, n = 29;
        Tensor table = make_tensor(tt, {vocab, hidden}, randn(size_t(vocab * hidden), rng));
        Tensor ids = make_i32(random_ids(n, vocab, rng));
        Tensor out(DType::kF32, {n, hidden}), out_ref(DType::kF32, {n, hidden});
        embedding_forward(table, ids, out, scale);
        ref::embedding_forward(table, ids, out_ref, scale);
        ASSERT_EQ(std::memcmp(out.data(), out_ref.data(), out.nbytes()), 0);
        Tensor plain(DType::kF32, {n, hidden});
        embedding_forward(table, ids, plain);
        for (int64_t i = 0; i < n * hidden; ++i)
          ASSERT_EQ(out.as<float>()[i], plain.as<float>()[i] * scale) << i;
        for (DType gt : kDTypes) {
          Tensor dout = make_tensor(gt, {n, hidden}, randn(size_t(n * hidden), rng));
          Tensor dt = Tensor::zeros(DType::kF32, {vocab, hidden});
          Tensor dt_ref = Tensor::zeros(DType::kF32, {vocab, hidden});
          embedding_backward(ids, dout, dt, scale);
          ref::embedding_backward(ids, dout, dt_ref, scale);
          // Within rounding: a compiler may fuse the scalar tail's multiply-add.
          for (int64_t i = 0; i < vocab * hidden; ++i)
            ASSERT_NEAR(dt.as<float>()[i], dt_ref.as<float>()[i],
                        1e-5 * (1 + std::fabs(dt_ref.as<float>()[i])))
                << dtype_name(gt) << " " << i;
        }
      }
    }
  });
  Tensor table = Tensor::zeros(DType::kF32, {4, 8});
  Tensor ids = make_i32({1, 2});
  Tensor out_bf16(DType::kBF16, {2, 8});
  expect_error([&] { embedding_forward(table, ids, out_bf16, scale); },
               {"embedding_forward", "f32 out"});
}

TEST(Embedding, BackwardSumsRepeatedIds) {
  const int64_t hidden = 3;
  Tensor ids = make_i32({2, 0, 2, 2});
  Tensor dout = make_tensor(DType::kF32, {4, hidden}, {1, 2, 3, 10, 20, 30, 4, 5, 6, 7, 8, 9});
  Tensor dtable = Tensor::zeros(DType::kF32, {3, hidden});
  embedding_backward(ids, dout, dtable);
  const std::vector<float> want = {10, 20, 30, 0, 0, 0, 12, 15, 18};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(dtable.as<float>()[i], want[i]) << i;
}

TEST(Embedding, BackwardDeterministicAcrossThreadCounts) {
  std::mt19937 rng(23);
  const RestoreNumThreads restore_threads;
  for (DType gt : kDTypes) {
    for (int64_t hidden : {5, 48, 1001}) {
      const int64_t n = 300, vocab = 50;
      auto idv = random_ids(n, 3, rng);  // heavy repetition
      idv[0] = idv[1] = idv[2] = int32_t(vocab - 1);
      Tensor ids = make_i32(idv);
      Tensor dout = make_tensor(gt, {n, hidden}, randn(size_t(n * hidden), rng));
      Tensor a = Tensor::zeros(DType::kF32, {vocab, hidden});
      Tensor b = Tensor::zeros(DType::kF32, {vocab, hidden});
      set_num_threads(1);
      embedding_backward(ids, dout, a);
      set_num_threads(2);
      embedding_backward(ids, dout, b);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0)
          << dtype_name(gt) << " H " << hidden;
    }
  }
}

TEST(Embedding, ErrorsNamePositionAndId) {
  Tensor table = Tensor::zeros(DType::kF32, {10, 4});
  Tensor out(DType::kF32, {3, 4});
  std::string msg = error_message([&] { embedding_forward(table, make_i32({1, 2, 10}), out); });
  EXPECT_NE(msg.find("embedding_forward"), std::string::npos) << msg;
  EXPECT_NE(msg.find("id 10 at position 2"), std::string::npos) << msg;
  msg = error_message([&] { embedding_forward(table, make_i32({-1, 2, 3}), out); });
  EXPECT_NE(msg.find("id -1 at position 0"), std::string::npos) << msg;

  Tensor dtable = Tensor::zeros(DType::kF32, {10, 4});
  Tensor dout = Tensor::zeros(DType::kF32, {3, 4});
  msg = error_message([&] { embedding_backward(make_i32({0, 12, 3}), dout, dtable); });
  EXPECT_NE(msg.find("embedding_backward"), std::string::npos) << msg;
  EXPECT_NE(msg.find("id 12 at position 1"), std::string::npos) << msg;
  // Nothing was written before the error.
  for (int i = 0; i < 40; ++i) EXPECT_EQ(dtable.as<float>()[i], 0.0f);

  Tensor out_bad(DType::kF32, {3, 5});
  msg = error_message([&] { embedding_forward(table, make_i32({1, 2, 3}), out_bad); });
  EXPECT_NE(msg.find("f32[3, 5]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f32[10, 4]"), std::string::npos) << msg;
  Tensor bf16_dtable(DType::kBF16, {10, 4});
  EXPECT_THROW(embedding_backward(make_i32({1, 2, 3}), dout, bf16_dtable), Error);
  Tensor f32_ids(DType::kF32, {3});
  EXPECT_THROW(embedding_forward(table, f32_ids, out), Error);
  Tensor dout_bad(DType::kF32, {2, 4});
  EXPECT_THROW(embedding_backward(make_i32({1, 2, 3}), dout_bad, dtable), Error);
}

TEST(Embedding, EmptyIds) {
  Tensor table = Tensor::zeros(DType::kF32, {10, 4});
  Tensor out(DType::kF32, {0, 4});
  embedding_forward(table, make_i32({}), out);
  embedding_backward(make_i32({}), out, table);
}

}  // namespace
}  // namespace hyperion
