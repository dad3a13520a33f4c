// `hyperion train` for a recommender (model_type: dlrm): the synthetic task is learned
// (held-out AUC above 0.75), a run split by a stop and a resume ends bit-exactly where an
// uninterrupted one does, Criteo files train and bad lines stop the run naming them, and
// two ranks equal one process.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../cli/cli_test_util.h"
#include "base/error.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "train/train_config.h"
#include "train/trainer.h"
#include "train_test_util.h"

namespace hyperion {
namespace {

using namespace testing_util;

#if defined(__SANITIZE_ADDRESS__)
constexpr const char* kRankEnv = "ASAN_OPTIONS=detect_leaks=0 ";
#else
constexpr const char* kRankEnv = "";
#endif

std::string dlrm_tiny() {
  return std::string(HYPERION_SOURCE_DIR) + "/configs/dlrm-tiny.yml";
}

// dlrm-tiny with a small batch and run directory under `root`.
std::vector<std::string> small_dlrm(const std::string& root, const std::string& name,
                                    int64_t steps) {
  return {"base_output_directory=" + root,
          "run_name=" + name,
          "steps=" + std::to_string(steps),
          "per_device_batch_size=64",
          "peak_tflops=1",
          "log_period=1000",
          "eval_interval=0",
          "dlrm.eval_examples=2048"};
}

TrainResult train(const std::vector<std::string>& overrides, const TrainOptions& opts = {}) {
  Config c = load_train_config(dlrm_tiny(), overrides);
  return run_training(c, "dlrm-tiny", opts);
}

std::vector<nlohmann::json> metrics(const std::string& run_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// Every tensor of a checkpoint's files, by name.
std::map<std::string, std::vector<unsigned char>> tensors(const std::string& dir) {
  std::map<std::string, std::vector<unsigned char>> out;
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    const io::SafetensorsFile file = io::SafetensorsFile::open(dir + "/" + f);
    for (const io::SafetensorsTensor& t : file.tensors()) {
      const auto* p = static_cast<const unsigned char*>(t.data);
      out[t.name].assign(p, p + t.nbytes);
    }
  }
  return out;
}

TEST(RecsysTrain, LearnsTheSyntheticTask) {
  ScopedSingleThread one;
  const std::string root = process_temp_root("recsys");
  std::vector<std::string> o = small_dlrm(root, "learn", 600);
  o.push_back("per_device_batch_size=256");
  o.push_back("eval_interval=300");
  o.push_back("dlrm.eval_examples=8192");
  const TrainResult r = train(o);
  EXPECT_EQ(r.steps, 600);
  EXPECT_GT(r.auc, 0.75);
  EXPECT_EQ(r.eval_tokens, 8192);
  // metrics.jsonl: auc at the evaluation step, samples_per_s on every line.
  const auto m = metrics(r.run_dir);
  ASSERT_EQ(m.size(), 600u);
  EXPECT_TRUE(m[299].contains("auc"));
  EXPECT_FALSE(m[298].contains("auc"));
  EXPECT_GT(m[299]["auc"].get<double>(), 0.7);
  EXPECT_GT(m[5]["samples_per_s"].get<double>(), 0);
  EXPECT_LT(m.back()["loss"].get<double>(), m.front()["loss"].get<double>());
}

TEST(RecsysTrain, ResumeIsBitExact) {
  ScopedSingleThread one;
  const std::string root = process_temp_root("recsys");
  for (const char* sharding : {"table", "row"}) {
    SCOPED_TRACE(sharding);
    std::vector<std::string> straight = small_dlrm(root, std::string("straight-") + sharding, 20);
    straight.push_back(std::string("dlrm.sharding=") + sharding);
    const TrainResult a = train(straight);
    std::vector<std::string> split = small_dlrm(root, std::string("split-") + sharding, 20);
    split.push_back(std::string("dlrm.sharding=") + sharding);
    TrainOptions stop;
    stop.stop_at = 9;
    const TrainResult first = train(split, stop);
    EXPECT_EQ(first.steps, 9);
    const TrainResult b = train(split);  // the same command resumes from step 9
    EXPECT_EQ(b.start_step, 9);
    EXPECT_EQ(b.steps, 20);
    const auto ta = tensors(a.checkpoint), tb = tensors(b.checkpoint);
    ASSERT_EQ(ta.size(), tb.size());
    for (const auto& [name, bytes] : ta) EXPECT_TRUE(tb.at(name) == bytes) << name;
    // The resumed run's metrics continue the same losses.
    const auto ma = metrics(a.run_dir), mb = metrics(b.run_dir);
    ASSERT_EQ(ma.size(), mb.size());
    for (size_t i = 0; i < ma.size(); ++i) EXPECT_EQ(ma[i]["loss"], mb[i]["loss"]) << i;
  }
}

TEST(RecsysTrain, TrainsOnCriteoFilesAndNamesABadLine) {
  ScopedSingleThread one;
  const std::string root = process_temp_root("recsys");
  const std::string sample =
      std::string(HYPERION_SOURCE_DIR) + "/tests/recsys/data/criteo_sample.tsv";
  std::vector<std::string> o = small_dlrm(root, "criteo", 6);
  o.push_back("dataset_path=" + sample);
  o.push_back("dlrm.eval_dataset_path=" + sample);
  o.push_back("per_device_batch_size=8");
  o.push_back("dlrm.eval_examples=16");
  const TrainResult r = train(o);
  EXPECT_EQ(r.steps, 6);
  EXPECT_EQ(r.eval_tokens, 16);
  EXPECT_GE(r.auc, 0.0);
  // A malformed line in the middle of a file stops the run naming the file, line and field.
  std::string text = io::read_file(sample);
  const size_t third = text.find('\n', text.find('\n') + 1) + 1;
  text.insert(third, "1\t2\tx\n");
  const std::string bad = root + "/bad.tsv";
  io::write_file_atomic(bad, text);
  o = small_dlrm(root, "criteo-bad", 6);
  o.push_back("dataset_path=" + bad);
  o.push_back("per_device_batch_size=8");
  try {
    train(o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.tsv:3"), std::string::npos) << e.what();
  }
}

TEST(RecsysTrain, RejectsBadKeys) {
  for (const auto& [kv, want] : std::vector<std::pair<std::string, std::string>>{
           {"dlrm.bottom_mlp=64,32,8", "must equal dlrm.embedding_dim (16)"},
           {"dlrm.top_mlp=64,2", "the last top MLP width must be 1"},
           {"dlrm.table_rows=10,x", "'10,x' is not a comma-separated list of positive integers"},
           {"dlrm.pooling=max", "unknown pooling 'max'"},
           {"dlrm.sharding=column", "must be table or row"},
           {"model_type=bert", "must be decoder, dlrm or diffusion"}}) {
    try {
      Config c = load_train_config(dlrm_tiny(), {kv});
      parse_train_config(c, "dlrm-tiny");
      ADD_FAILURE() << kv << ": no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << kv << ": " << e.what();
    }
  }
}

// Two ranks (mpirun through --nproc) train the same global batch as one process: the
// losses agree to float order, and the 2-rank checkpoint resumes in one process.
TEST(RecsysTrain, TwoRanksEqualOneProcess) {
  const std::string root = process_temp_root("recsys");
  for (const char* sharding : {"table", "row"}) {
    SCOPED_TRACE(sharding);
    const std::string common = fmt::format(
        "train {} base_output_directory={} steps=4 peak_tflops=1 dlrm.eval_examples=512 "
        "eval_interval=0 dlrm.sharding={} learning_rate=0.01",
        dlrm_tiny(), root, sharding);
    // Open MPI leaks at MPI_Finalize (distributed_train_test.cc): sanitizer builds turn leak
    // checking off for the ranks.
    const CliResult two = run_shell(
        fmt::format("{}{} --threads 1 {} run_name=two-{} per_device_batch_size=32 --nproc 2 "
                    "--allow-run-as-root 2>&1",
                    kRankEnv, HYPERION_CLI_PATH, common, sharding));
    ASSERT_EQ(two.code, 0) << two.out;
    const CliResult one =
        run_cli(fmt::format("{} run_name=one-{} per_device_batch_size=64", common, sharding));
    ASSERT_EQ(one.code, 0) << one.out;
    const auto m2 = metrics(root + "/two-" + sharding), m1 = metrics(root + "/one-" + sharding);
    ASSERT_EQ(m2.size(), 4u);
    ASSERT_EQ(m1.size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      const double a = m2[i]["loss"].get<double>(), b = m1[i]["loss"].get<double>();
      EXPECT_NEAR(a, b, 1e-5 * (1 + std::fabs(b))) << "step " << i + 1;
    }
    // The sharded checkpoint (one file per rank) continues in one process.
    const CliResult resumed = run_cli(fmt::format(
        "train --resume {}/two-{} steps=6 per_device_batch_size=64 --json", root, sharding));
    ASSERT_EQ(resumed.code, 0) << resumed.out;
    EXPECT_NE(resumed.out.find("\"start_step\": 4"), std::string::npos) << resumed.out;
    EXPECT_NE(resumed.out.find("\"auc\""), std::string::npos) << resumed.out;
  }
}

}  // namespace
}  // namespace hyperion
