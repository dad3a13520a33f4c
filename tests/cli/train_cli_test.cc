// End-to-end tests of the training commands through the hyperion binary: train, plan,
// eval, generate, convert and data prepare, their --json keys, and their errors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "../train/train_test_util.h"
#include "../test_files.h"
#include "cli_test_util.h"

namespace {

namespace fs = std::filesystem;

using Result = hyperion::testing_util::CliResult;

Result run(const std::string& args, bool with_stderr = true) {
  return hyperion::testing_util::run_cli(args, with_stderr);
}

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

// One tiny training run shared by the tests of this file (per process).
class TrainCli : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = testing::TempDir() + "hyperion_train_cli_" + std::to_string(::getpid());
    fs::remove_all(root_);
    fs::create_directories(root_);
    corpus_ = hyperion::testing_util::small_corpus();  // the first 256 KB
    Result r = run("train --json dataset_path=" + corpus_ +
                       " vocab_size=512 base_emb_dim=64 base_num_decoder_layers=2"
                       " base_num_query_heads=4 base_num_kv_heads=2 base_mlp_dim=192"
                       " max_target_length=64 per_device_batch_size=4 steps=6 peak_tflops=1"
                       " sample_count=1 sample_max_tokens=4 eval_batches=2"
                       " base_output_directory=" +
                       root_ + " run_name=r",
                   false);
    ASSERT_EQ(r.code, 0) << r.out;
    summary_ = nlohmann::json::parse(r.out);
    run_dir_ = root_ + "/r";
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static inline std::string root_, corpus_, run_dir_;
  static inline nlohmann::json summary_;
};

TEST_F(TrainCli, TrainJsonSummaryAndMetrics) {
  for (const char* k : {"run_dir", "checkpoint", "steps", "final_loss", "eval_loss",
                        "eval_perplexity", "tokens_per_s", "mfu", "samples"})
    EXPECT_TRUE(summary_.contains(k)) << k;
  EXPECT_EQ(summary_["steps"], 6);
  EXPECT_EQ(summary_["checkpoint"], run_dir_ + "/checkpoints/6");
  std::ifstream in(run_dir_ + "/metrics.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    for (const char* k : {"step", "loss", "grad_norm", "lr", "step_s", "tokens_per_s", "tflops",
                          "mfu", "data_wait_s"})
      ASSERT_TRUE(j.contains(k)) << k;
    ++lines;
  }
  EXPECT_EQ(lines, 6);
}

TEST_F(TrainCli, EvalOnTextAndShard) {
  const std::string text = root_ + "/held.txt";
  std::ofstream(text) << "A fortune a day keeps the doctor away.\n%\nNothing is certain.\n";
  Result r =
      run("eval --checkpoint " + run_dir_ + " --text " + text + " --json --seq-len 32", false);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_GT(j["tokens"].get<int64_t>(), 10);
  EXPECT_NEAR(j["perplexity"].get<double>(), std::exp(j["loss"].get<double>()), 1e-6);
  Result s = run("eval --checkpoint " + run_dir_ + "/checkpoints/6 --shard " +
                     hyperion::testing_util::prepared_dataset(root_) + "/val.bin --json",
                 false);
  ASSERT_EQ(s.code, 0) << s.out;
  EXPECT_GT(nlohmann::json::parse(s.out)["tokens"].get<int64_t>(), 1000);
  // Errors: missing file, both sources, bad checkpoint.
  EXPECT_EQ(run("eval --checkpoint " + run_dir_ + " --text /nonexistent.txt").code, 1);
  Result both = run("eval --checkpoint " + run_dir_ + " --text a --shard b");
  EXPECT_EQ(both.code, 2);
  EXPECT_TRUE(contains(both.out, "exactly one")) << both.out;
  Result bad = run("eval --checkpoint " + root_ + " --text " + text);
  EXPECT_EQ(bad.code, 1);
  EXPECT_TRUE(contains(bad.out, root_)) << bad.out;
}

TEST_F(TrainCli, GenerateIsDeterministicPerSeed) {
  const std::string base = "generate --checkpoint " + run_dir_ + " --prompt 'The' --json ";
  Result a = run(base + "--max-tokens 6 --seed 5 --top-k 20 --top-p 0.9", false);
  Result b = run(base + "--max-tokens 6 --seed 5 --top-k 20 --top-p 0.9", false);
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_EQ(a.out, b.out);
  auto j = nlohmann::json::parse(a.out);
  EXPECT_LE(j["tokens"].size(), 6u);
  EXPECT_TRUE(j["finish_reason"] == "length" || j["finish_reason"] == "stop");
  Result greedy = run(base + "--max-tokens 4 --temperature 0", false);
  ASSERT_EQ(greedy.code, 0) << greedy.out;
  Result bad = run(base + "--top-p 2");  // a usage error, before the checkpoint is read
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(contains(bad.out, "--top-p must be in (0, 1], got 2")) << bad.out;
  Result unknown = run(base + "--temprature 1");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_TRUE(contains(unknown.out, "--temprature")) << unknown.out;
}

TEST_F(TrainCli, ConvertToGguf) {
  const std::string out = root_ + "/m.gguf";
  Result r = run("convert --checkpoint " + run_dir_ + " --to gguf --type q8_0 --output " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream f(out, std::ios::binary);
  char magic[4] = {};
  f.read(magic, 4);
  EXPECT_EQ(std::string(magic, 4), "GGUF");
  Result bad = run("convert --checkpoint " + run_dir_ + " --to onnx");
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(contains(bad.out, "--to")) << bad.out;
}

TEST(PlanCli, JsonForPresetsAndErrors) {
  Result r = run("plan llama2-7b --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["params"], 6738415616);
  EXPECT_GT(j["flops_per_token"].get<double>(), 6.0 * 6.5e9);
  for (const char* k : {"weights", "gradients", "optimizer", "activations", "total"})
    EXPECT_TRUE(j["memory"].contains(k)) << k;
  // Remat policies order the activation memory.
  auto act = [](const std::string& policy) {
    Result p = run("plan llama2-7b remat_policy=" + policy + " --json", false);
    return nlohmann::json::parse(p.out)["memory"]["activations"].get<int64_t>();
  };
  EXPECT_GT(act("none"), act("minimal"));
  EXPECT_GT(act("minimal"), act("full"));
  Result bad = run("plan llama2-7b stepz=3");
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(contains(bad.out, "stepz")) << bad.out;
  Result missing = run("plan no-such-preset");
  EXPECT_EQ(missing.code, 1);
  EXPECT_TRUE(contains(missing.out, "no-such-preset")) << missing.out;
}

TEST(PlanCli, MoePresetsReportExpertsAndCapacity) {
  Result r = run("plan mixtral-8x7b --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["params"], 46702792704);
  EXPECT_EQ(j["active_params"], 12879925248);
  EXPECT_EQ(j["moe"]["experts"], 8);
  EXPECT_EQ(j["moe"]["experts_per_token"], 2);
  EXPECT_EQ(j["moe"]["dropless"], true);
  // FLOPs follow the active parameters, not the total.
  EXPECT_LT(j["flops_per_token"].get<double>(), 6.0 * 14e9);
  Result c = run("plan mixtral-tiny capacity_factor=1.25 --json", false);
  ASSERT_EQ(c.code, 0) << c.out;
  auto jc = nlohmann::json::parse(c.out);
  EXPECT_EQ(jc["moe"]["capacity"], 80);  // ceil(256 * 2 / 8) * 1.25
  EXPECT_EQ(jc["moe"]["dropless"], false);
  Result text = run("plan mixtral-tiny", false);
  EXPECT_TRUE(contains(text.out, "dropless")) << text.out;
}

TEST(BenchMoeCli, LayerSuiteJsonAndErrors) {
  Result r =
      run("--threads 1 bench moe --suite layer --config mixtral-tiny --steps 1 --warmup 0 "
          "--peak-tflops 1 --json",
          false);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["layer"].size(), 5u);  // dense peer, dropless, cf 1.0 / 1.25 / 2.0
  for (const auto& row : j["layer"])
    for (const char* k : {"name", "fwd_ms", "bwd_ms", "tokens_per_s", "active_tflops", "vs_dense",
                          "dropped_fraction"})
      EXPECT_TRUE(row.contains(k)) << k;
  EXPECT_EQ(j["layer"][0]["vs_dense"].get<double>(), 1.0);
  Result bad = run("bench moe --suite nope");
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(contains(bad.out, "--suite")) << bad.out;
  Result dense = run("bench moe --suite layer --config tiny --peak-tflops 1");
  EXPECT_EQ(dense.code, 1);
  EXPECT_TRUE(contains(dense.out, "no experts")) << dense.out;
}

TEST(DataCli, PrepareJson) {
  const std::string dir = testing::TempDir() + "hyperion_data_cli_" + std::to_string(::getpid());
  fs::create_directories(dir);
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += "Document number " + std::to_string(i) + " talks about cats, dogs and birds.\n\n";
  std::ofstream(dir + "/in.txt") << text;
  Result r = run(
      "data prepare --input " + dir + "/in.txt --output " + dir + "/out --vocab-size 300 --json",
      false);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["documents"], 200);
  EXPECT_TRUE(fs::exists(dir + "/out/train.bin"));
  EXPECT_TRUE(fs::exists(dir + "/out/tokenizer.model"));
  fs::remove_all(dir);
}

}  // namespace
