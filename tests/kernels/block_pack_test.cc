// The interleaved decode layout (kernels/block_pack.h): packing keeps every value bit for
// bit, including the rows past the last group of 8; every instruction set's group kernel
// equals the reference dot of the file's rows for every row count, prefill's (more rows
// than one pass takes) included.
#include "kernels/block_pack.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "block_test_util.h"

namespace hyperion {
namespace {

using namespace block_test;

constexpr BlockType kAll[] = {BlockType::kQ4_0, BlockType::kQ4_1, BlockType::kQ5_0, BlockType::kQ5_1,
                              BlockType::kQ8_0, BlockType::kQ4_K, BlockType::kQ5_K, BlockType::kQ6_K};

TEST(BlockPack, PackedRowsDequantiseToTheFilesValuesBitForBit) {
  std::mt19937 rng(21);
  for (BlockType t : kAll) {
    SCOPED_TRACE(block_format(t).name);
    const int64_t k = block_format(t).values * 3, rows = 8 * 2 + 5;
    const auto w = random_blocks(t, rows * k, rng);
    std::vector<float> want(size_t(rows * k)), got(size_t(rows * k));
    dequantize_blocks_reference(t, w.data(), want.data(), rows * k);
    const PackedBlocks p = pack_blocks(t, w.data(), rows, k);
    EXPECT_EQ(p.groups, 2);
    EXPECT_EQ(p.data.size(), size_t(2 * 3) * packed_group_block_bytes(t));
    dequantize_packed_rows(p, 0, rows, got.data(), DType::kF32);
    for (size_t e = 0; e < want.size(); ++e) ASSERT_EQ(got[e], want[e]) << "element " << e;
  }
}

TEST(BlockPack, EveryIsaEqualsTheReferenceDotForEveryRowCount) {
  std::mt19937 rng(23);
  for (BlockIsa isa : {BlockIsa::kPortable, BlockIsa::kAvx2, BlockIsa::kAvx512Vnni}) {
    set_block_isa_for_testing(isa);
    for (BlockType t : kAll) {
      const int64_t k = block_format(t).values * 2, rows = 8 * 3 + 3;
      const auto w = random_blocks(t, rows * k, rng);
      const PackedBlocks p = pack_blocks(t, w.data(), rows, k);
      for (int64_t m = 1; m <= kBlockDotMaxRows + 3; ++m) {
        SCOPED_TRACE(testing::Message() << block_format(t).name << " m " << m << " isa " << block_isa_name());
        const auto x = randn(size_t(m * k), rng, 1.0f);
        std::vector<float> y(size_t(m * rows), 0.5f);
        packed_block_matmul(p, m, x.data(), DType::kF32, y.data(), DType::kF32, 1.0f);
        std::vector<unsigned char> act(block_act_row_bytes(t, k));
        std::vector<float> wv(static_cast<size_t>(k));
        for (int64_t i = 0; i < m; ++i) {
          quantize_block_activations(t, x.data() + i * k, DType::kF32, k, act.data());
          for (int64_t r = 0; r < rows; ++r) {
            const unsigned char* wr = w.data() + size_t(r) * block_bytes(t, k);
            dequantize_blocks_reference(t, wr, wv.data(), k);
            double want = 0.5 + block_dot_reference(t, wr, act.data(), k), mag = 0;
            for (int64_t e = 0; e < k; ++e) mag += std::fabs(double(wv[size_t(e)]) * x[size_t(i * k + e)]);
            ASSERT_NEAR(y[size_t(i * rows + r)], want, 3e-5 * mag + 1e-6) << "row " << i << " col " << r;
          }
        }
      }
    }
  }
  set_block_isa_for_testing(BlockIsa::kAuto);
}

}  // namespace
}  // namespace hyperion
