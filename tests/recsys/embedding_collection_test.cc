// Loading tables from checkpoint pieces: any tiling of a table's rows loads; overlapping
// or missing pieces, and int8 serving tables, are refused naming the table.
#include "recsys/embedding_collection.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "base/error.h"
#include "io/safetensors.h"

namespace hyperion::recsys {
namespace {

DlrmConfig one_table(SparseOptimizer opt) {
  DlrmConfig c;
  c.table_rows = {6};
  c.embedding_dim = 2;
  c.bottom_mlp = {2};
  c.top_mlp = {1};
  c.sparse_optimizer = opt;
  c.bag_sizes = {1};
  return c;
}

// Writes pieces [first, first + rows) of a 6 x 2 table whose element (r, j) is 10 r + j.
std::string write_pieces(const std::vector<std::pair<int64_t, int64_t>>& pieces, DType dtype,
                         const std::string& name) {
  static std::vector<std::vector<float>> keep;
  io::SafetensorsWriter w;
  for (const auto& [first, rows] : pieces) {
    keep.emplace_back();
    for (int64_t r = first; r < first + rows; ++r)
      for (int64_t j = 0; j < 2; ++j) keep.back().push_back(float(10 * r + j));
    std::vector<int8_t>* bytes = nullptr;
    const void* data = keep.back().data();
    if (dtype == DType::kI8) {
      static std::vector<std::vector<int8_t>> q;
      q.emplace_back(keep.back().begin(), keep.back().end());
      bytes = &q.back();
      data = bytes->data();
    }
    w.add(fmt::format("embedding_bags.t_cat_0.weight@{}", first), dtype, {rows, 2}, data);
  }
  const std::string path = ::testing::TempDir() + name + ".safetensors";
  w.write(path);
  return path;
}

std::string load_error(const DlrmConfig& c, const std::string& path) {
  auto comm = dist::make_single_process_communicator();
  EmbeddingCollection e(c, *comm);
  const io::SafetensorsFile f = io::SafetensorsFile::open(path);
  const io::SafetensorsFile* files[] = {&f};
  try {
    e.load(files, {});
  } catch (const Error& err) {
    return err.what();
  }
  const float* w = static_cast<const float*>(e.local_weights(0));
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(w[i], float(10 * (i / 2) + i % 2)) << i;
  return "";
}

TEST(EmbeddingCollection, LoadsAnyTilingAndRefusesGapsAndOverlaps) {
  const DlrmConfig sgd = one_table(SparseOptimizer::kSgd);
  EXPECT_EQ(load_error(sgd, write_pieces({{0, 4}, {4, 2}}, DType::kF32, "tiles")), "");
  EXPECT_EQ(load_error(sgd, write_pieces({{3, 3}, {0, 1}, {1, 2}}, DType::kF32, "tiles3")), "");
  std::string m = load_error(sgd, write_pieces({{0, 4}, {2, 2}, {5, 1}}, DType::kF32, "overlap"));
  EXPECT_NE(m.find("embedding_bags.t_cat_0.weight overlap within rows [0, 6)"), std::string::npos)
      << m;
  m = load_error(sgd, write_pieces({{0, 4}}, DType::kF32, "short"));
  EXPECT_NE(m.find("stop at row 4 of the rows [0, 6)"), std::string::npos) << m;
  m = load_error(sgd, write_pieces({{0, 6}}, DType::kI8, "int8"));
  EXPECT_NE(m.find("an int8 serving table cannot resume training"), std::string::npos) << m;
  // Adagrad needs its state: a checkpoint without it names the optimizer.
  m = load_error(one_table(SparseOptimizer::kAdagrad),
                 write_pieces({{0, 6}}, DType::kF32, "nostate"));
  EXPECT_NE(m.find("another dlrm.sparse_optimizer than adagrad"), std::string::npos) << m;
}

}  // namespace
}  // namespace hyperion::recsys
