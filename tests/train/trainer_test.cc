#include "train/trainer.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "../kernels/simulated_device.h"
#include "base/error.h"
#include "base/threads.h"
#include "kernels/hardware.h"
#include "model/causal_lm.h"
#include "model/generator.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/parallel.h"
#include "train/train_config.h"
#include "train_test_util.h"

namespace hyperion {
namespace {

namespace fs = std::filesystem;

std::string temp_root() {
  return testing_util::process_temp_root("hyperion_trainer_test");
}

// A small model on the bundled corpus (vocab 512, prepared once and shared by the tests).
std::vector<std::string> small_run(const std::string& run_name, const std::string& dtype,
                                   int64_t steps) {
  return testing_util::small_run_overrides(temp_root(), run_name, dtype, steps);
}

std::vector<nlohmann::json> read_metrics(const std::string& run_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

class Trainer : public testing::Test {
  testing_util::ScopedSingleThread single_thread_;  // see train_test_util.h
};

TrainResult train(const std::vector<std::string>& overrides, TrainOptions opts = {}) {
  opts.quiet = true;
  return run_training(load_train_config("tiny", overrides), "test", opts);
}

TEST_F(Trainer, LossFallsOnBundledCorpusAndArtifactsAreWritten) {
  // 300 steps of 512 tokens: the loss starts at ln(512) = 6.24 and must end below 4.6
  // (observed ~4.2; a unigram model of this tokenizer sits near 5.5).
  TrainResult r = train(small_run("loss", "bfloat16", 300));
  ASSERT_EQ(r.steps, 300);
  ASSERT_EQ(r.history.size(), 300u);
  EXPECT_GT(r.history.front().loss, 5.8);
  double tail = 0;
  for (size_t i = r.history.size() - 20; i < r.history.size(); ++i) tail += r.history[i].loss;
  tail /= 20;
  EXPECT_LT(tail, 4.6);
  EXPECT_GT(r.eval_tokens, 0);
  EXPECT_LT(r.eval_loss, 4.8);
  EXPECT_NEAR(r.eval_perplexity, std::exp(r.eval_loss), 1e-9 * r.eval_perplexity);
  ASSERT_EQ(r.samples.size(), 1u);

  // metrics.jsonl: one line per step with the stable keys.
  auto m = read_metrics(r.run_dir);
  ASSERT_EQ(m.size(), 300u);
  for (const char* key : {"step", "loss", "grad_norm", "lr", "step_s", "tokens_per_s", "tflops",
                          "mfu", "data_wait_s"})
    EXPECT_TRUE(m.back().contains(key)) << key;
  EXPECT_EQ(m.back()["step"].get<int64_t>(), 300);

  // The checkpoint holds every file, HF names, and loads back.
  const std::string ck = r.run_dir + "/checkpoints/300";
  EXPECT_EQ(r.checkpoint, ck);
  for (const char* f : {"model.safetensors", "config.json", "tokenizer.model",
                        "optimizer.safetensors", "trainer_state.json"})
    EXPECT_TRUE(fs::exists(ck + "/" + f)) << f;
  DecoderConfig c = read_checkpoint_config(ck);
  EXPECT_EQ(c.dim, 64);
  ParamStore ps(c, false);
  load_model_weights(ck, ps);
  EXPECT_NE(ps.find("model.layers.1.mlp.down_proj.weight"), nullptr);
  // Evaluating the loaded checkpoint on the held-out shard agrees with the trainer's
  // own final eval (the trainer ran bf16; this runs f32, so loosely).
  std::vector<int32_t> val =
      read_shard_tokens(testing_util::prepared_dataset(temp_root()) + "/val.bin", c.vocab_size);
  EvalReport e = evaluate_stream(ps, val, 64, 8);
  EXPECT_NEAR(e.loss, r.eval_loss, 0.05);
}

TEST_F(Trainer, ResumeReproducesLossesBitForBitInF32) {
  TrainResult full = train(small_run("full", "float32", 8));
  TrainOptions stop;
  stop.stop_at = 4;
  TrainResult first = train(small_run("split", "float32", 8), stop);
  EXPECT_EQ(first.steps, 4);
  EXPECT_TRUE(fs::exists(first.run_dir + "/checkpoints/4"));
  // Resume by run name (the run directory has checkpoints: it continues).
  TrainResult second = train(small_run("split", "float32", 8));
  EXPECT_EQ(second.start_step, 4);
  EXPECT_EQ(second.steps, 8);
  auto a = read_metrics(full.run_dir), b = read_metrics(second.run_dir);
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_EQ(a[i]["step"], b[i]["step"]);
    EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << "step " << i + 1;
    EXPECT_EQ(a[i]["grad_norm"].get<double>(), b[i]["grad_norm"].get<double>());
  }
  // And the final weights are identical.
  std::ifstream fa(full.checkpoint + "/model.safetensors", std::ios::binary);
  std::ifstream fb(second.checkpoint + "/model.safetensors", std::ios::binary);
  std::string sa((std::istreambuf_iterator<char>(fa)), {}),
      sb((std::istreambuf_iterator<char>(fb)), {});
  EXPECT_TRUE(sa == sb);
}

// Quantised training resumes bit for bit too: the stochastic-rounding pass counter (int8)
// and the amax histories (fp8) come back from the checkpoint. With 2 micro-batches per
// step and fp8 histories of 4, the histories wrap before the split.
TEST_F(Trainer, QuantizedResumeIsBitExactInEveryMode) {
  for (const std::string mode : {"int8", "fp8"}) {
    auto run = [&](const std::string& name) {
      std::vector<std::string> o = small_run(name + "-" + mode, "bfloat16", 6);
      o.push_back("quantization=" + mode);
      o.push_back("fp8_amax_history_len=4");
      o.push_back("gradient_accumulation_steps=2");
      o.push_back("per_device_batch_size=4");
      return o;
    };
    TrainResult full = train(run("qfull"));
    TrainOptions stop;
    stop.stop_at = 3;
    train(run("qsplit"), stop);
    if (mode == "fp8") {
      EXPECT_TRUE(fs::exists(temp_root() + "/qsplit-fp8/checkpoints/3/quantization.safetensors"));
    }
    TrainResult second = train(run("qsplit"));
    EXPECT_EQ(second.start_step, 3);
    auto a = read_metrics(full.run_dir), b = read_metrics(second.run_dir);
    ASSERT_EQ(a.size(), 6u);
    ASSERT_EQ(b.size(), 6u);
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(a[i]["loss"].get<double>(), b[i]["loss"].get<double>()) << mode << " step " << i;
      EXPECT_GT(a[i]["emfu"].get<double>(), 0.0);
    }
    std::ifstream fa(full.checkpoint + "/model.safetensors", std::ios::binary);
    std::ifstream fb(second.checkpoint + "/model.safetensors", std::ios::binary);
    std::string sa((std::istreambuf_iterator<char>(fa)), {}),
        sb((std::istreambuf_iterator<char>(fb)), {});
    EXPECT_TRUE(sa == sb) << mode;
  }
}

TEST_F(Trainer, GradientAccumulationEqualsTheLargerBatch) {
  // 2 micro-batches of 4 sequences take the same 8 sequences as one batch of 8, and the
  // mean loss over equal-sized micro-batches is the mean of their means: the runs agree
  // up to f32 summation order.
  auto big = small_run("acc1", "float32", 4);
  big.push_back("sample_count=0");
  auto acc = small_run("acc2", "float32", 4);
  acc.push_back("sample_count=0");
  acc.push_back("per_device_batch_size=4");
  acc.push_back("gradient_accumulation_steps=2");
  TrainResult a = train(big), b = train(acc);
  ASSERT_EQ(a.history.size(), 4u);
  ASSERT_EQ(b.history.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(a.history[i].loss, b.history[i].loss, 1e-5 * a.history[i].loss) << i;
    EXPECT_NEAR(a.history[i].grad_norm, b.history[i].grad_norm, 1e-4 * a.history[i].grad_norm);
  }
}

// Past checkpoint_max_shard_bytes one process writes Hugging Face's sharded layout: the
// same weights as one model.safetensors, read back through the index, and a run resumes
// from it.
TEST_F(Trainer, LargeWeightsAreWrittenInTheShardedLayout) {
  auto sharded = small_run("sharded", "float32", 4);
  sharded.push_back("checkpoint_max_shard_bytes=200000");
  TrainOptions stop;
  stop.stop_at = 2;
  const TrainResult a = train(sharded, stop);
  const TrainResult one = train(small_run("one_file", "float32", 4), stop);  // same schedule
  const std::string ck = a.run_dir + "/checkpoints/2";
  EXPECT_FALSE(fs::exists(ck + "/model.safetensors"));
  ASSERT_TRUE(fs::exists(ck + "/model.safetensors.index.json"));
  const nlohmann::json index =
      nlohmann::json::parse(std::ifstream(ck + "/model.safetensors.index.json"));
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  EXPECT_GE(files.size(), 2u);
  for (const std::string& f : files) {
    EXPECT_TRUE(fs::exists(ck + "/" + f)) << f;
    EXPECT_LE(fs::file_size(ck + "/" + f), 200000u + 4096u) << f;  // + the header
  }
  const DecoderConfig c = read_checkpoint_config(ck);
  ParamStore from_shards(c, false), from_one(c, false);
  load_model_weights(ck, from_shards);
  load_model_weights(one.checkpoint, from_one);
  EXPECT_TRUE(std::equal(from_shards.params(), from_shards.params() + from_shards.size(),
                         from_one.params()));
  // Resuming reads the sharded checkpoint and goes on; rotation removes its files.
  const TrainResult b = train(sharded);
  EXPECT_EQ(b.start_step, 2);
  EXPECT_EQ(b.steps, 4);
}

TEST_F(Trainer, KeepsOnlyTheLastCheckpoints) {
  auto o = small_run("keep", "bfloat16", 6);
  o.push_back("checkpoint_period=2");
  o.push_back("max_num_checkpoints_to_keep=2");
  o.push_back("sample_count=0");
  TrainResult r = train(o);
  EXPECT_FALSE(fs::exists(r.run_dir + "/checkpoints/2"));
  EXPECT_TRUE(fs::exists(r.run_dir + "/checkpoints/4"));
  EXPECT_TRUE(fs::exists(r.run_dir + "/checkpoints/6"));
}

TEST_F(Trainer, KilledSaveLeavesThePreviousCheckpointIntact) {
  // A child process trains with checkpoints every 2 steps and is SIGKILLed in the middle
  // of writing checkpoint 4 (after model.safetensors, before the rest).
  const std::string run = temp_root() + "/killed";
  std::string cmd = std::string("HYPERION_TEST_KILL_DURING_SAVE=4 ") + HYPERION_CLI_PATH +
                    " --threads 1 train --quiet";
  auto o = small_run("killed", "float32", 6);
  o.push_back("checkpoint_period=2");
  o.push_back("sample_count=0");
  for (const auto& s : o) cmd += " '" + s + "'";
  cmd += " > /dev/null 2>&1";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 128 + 9))
      << "status " << status;
  EXPECT_TRUE(fs::exists(run + "/checkpoints/2/trainer_state.json"));
  EXPECT_FALSE(fs::exists(run + "/checkpoints/4"));
  auto latest = latest_checkpoint(run);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(fs::path(*latest).filename(), "2");
  // The next run resumes from 2, finishes, and cleans the torn temp directory.
  TrainResult r = train(o);
  EXPECT_EQ(r.start_step, 2);
  EXPECT_EQ(r.steps, 6);
  for (const auto& e : fs::directory_iterator(run + "/checkpoints"))
    EXPECT_NE(e.path().filename().string().rfind(".tmp", 0), 0u) << e.path();
  EXPECT_EQ(read_metrics(run).size(), 6u);
}

TEST_F(Trainer, BadConfigErrorsNameTheKey) {
  try {
    train({"steps=abc"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("steps"), std::string::npos) << e.what();
  }
  try {
    train({"remat_policy=sometimes"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("remat_policy"), std::string::npos) << e.what();
  }
  try {
    train({"dataset_path=/nonexistent/x.txt", "base_output_directory=" + temp_root()});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/x.txt"), std::string::npos) << e.what();
  }
}

TEST(TrainConfig, EmbeddedTinyPresetEqualsConfigsFile) {
  std::ifstream in(std::string(HYPERION_SOURCE_DIR) + "/configs/tiny.yml");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(text, std::string(kTinyPresetYaml));
}

TEST(TrainConfig, EveryPresetParses) {
  for (const char* name :
       {"tiny", "llama-25m", "llama-110m", "llama2-7b", "llama2-70b", "llama3-8b", "mixtral-tiny",
        "mixtral-8x7b", "moe-e4", "moe-e8", "moe-e16", "moe-e32", "llama3-tiny", "qwen2-tiny",
        "qwen3-tiny", "mistral-tiny", "llama3.2-1b", "llama3.2-3b", "llama3.1-8b", "qwen3-0.6b",
        "qwen3-1.7b", "qwen3-8b", "mistral-7b", "gemma2-tiny", "gemma3-tiny", "gemma2-2b",
        "gemma2-9b", "gemma3-1b", "llama3-8b-l4"}) {
    Config c =
        load_train_config(std::string(HYPERION_SOURCE_DIR) + "/configs/" + name + ".yml", {});
    TrainConfig t = parse_train_config(c, name);
    EXPECT_EQ(t.name, name);
  }
  TrainConfig t7 = parse_train_config(
      load_train_config(std::string(HYPERION_SOURCE_DIR) + "/configs/llama2-7b.yml", {}), "x");
  EXPECT_EQ(t7.model.total_params(), 6738415616);
  TrainConfig t70 = parse_train_config(
      load_train_config(std::string(HYPERION_SOURCE_DIR) + "/configs/llama2-70b.yml", {}), "x");
  EXPECT_EQ(t70.model.total_params(), 68976648192);
  TrainConfig t8 = parse_train_config(
      load_train_config(std::string(HYPERION_SOURCE_DIR) + "/configs/llama3-8b.yml", {}), "x");
  EXPECT_EQ(t8.model.total_params(), 8030261248);
  // The Hugging Face families' real shapes, as published (config.json arithmetic).
  for (const auto& [name, params] : std::vector<std::pair<std::string, int64_t>>{
           {"llama3.2-1b", 1235814400},
           {"llama3.2-3b", 3212749824},
           {"llama3.1-8b", 8030261248},
           {"llama3-8b-l4", 1923125248},  // 4 of llama3.1-8b's 32 layers
           {"qwen3-0.6b", 596049920},
           {"qwen3-1.7b", 1720574976},
           {"qwen3-8b", 8190735360},
           {"mistral-7b", 7248023552},
           {"gemma2-2b", 2614341888},
           {"gemma2-9b", 9241705984},
           {"gemma3-1b", 999885952}}) {
    const TrainConfig t = parse_train_config(
        load_train_config(std::string(HYPERION_SOURCE_DIR) + "/configs/" + name + ".yml", {}),
        name);
    EXPECT_EQ(t.model.total_params(), params) << name;
  }
  // Mixtral-8x7B: 46.7B parameters, 12.9B active per token (as published).
  TrainConfig mx = parse_train_config(
      load_train_config(std::string(HYPERION_SOURCE_DIR) + "/configs/mixtral-8x7b.yml", {}), "x");
  EXPECT_EQ(mx.model.total_params(), 46702792704);
  EXPECT_EQ(mx.model.active_non_embedding_params() + mx.model.embedding_params(), 12879925248);
  EXPECT_EQ(mx.model.n_moe_layers(), 32);
  // The weak-scaling family: FLOPs per token equal (but for the router), parameters
  // growing with the experts.
  double flops = 0;
  int64_t params = 0;
  for (const char* name : {"moe-e4", "moe-e8", "moe-e16", "moe-e32"}) {
    TrainConfig t = parse_train_config(
        load_train_config(std::string(HYPERION_SOURCE_DIR) + "/configs/" + name + ".yml", {}),
        name);
    const double f = t.model.train_flops_per_token(t.max_target_length);
    if (flops > 0) {
      EXPECT_NEAR(f, flops, 0.01 * flops) << name;  // only the router grows with E
    }
    EXPECT_GT(t.model.total_params(), params) << name;
    flops = f;
    params = t.model.total_params();
  }
}

// Parsing the tiny preset with `overrides` fails with an error containing `needle`.
void expect_config_error(const std::vector<std::string>& overrides, const std::string& needle) {
  try {
    parse_train_config(load_train_config("tiny", overrides), "x");
    ADD_FAILURE() << "no error for " << overrides.back();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TrainConfig, MoeKeysAreValidated) {
  const auto& expect_error = expect_config_error;
  expect_error({"num_experts=4", "num_experts_per_tok=5"}, "num_experts_per_tok");
  expect_error({"num_experts=4", "capacity_factor=0"}, "capacity_factor");
  expect_error({"num_experts=4", "sparse_matmul=false"}, "sparse_matmul");
  expect_error({"num_experts=4", "first_num_dense_layers=4"}, "first_num_dense_layers");
  expect_error({"num_experts=4", "load_balance_loss_weight=-1"}, "load_balance_loss_weight");
  // Capped experts need no sparse matmul flag.
  TrainConfig t = parse_train_config(
      load_train_config("tiny", {"num_experts=4", "capacity_factor=1.25", "sparse_matmul=false"}),
      "x");
  EXPECT_DOUBLE_EQ(t.moe.capacity_factor, 1.25);
}

TEST(TrainConfig, QuantizationKeysAreValidated) {
  const auto& expect_error = expect_config_error;
  expect_error({"quantization=int4"}, "quantization");
  expect_error({"quantization=int8", "dtype=float32"}, "dtype");
  expect_error({"quantization=fp8", "fp8_amax_history_len=0"}, "fp8_amax_history_len");
  expect_error({"quantization=int8", "num_experts=4"}, "MoE");
  const TrainConfig t = parse_train_config(
      load_train_config("tiny", {"quantization=fp8", "quantize_logits=true"}), "x");
  EXPECT_EQ(t.quant.mode, QuantMode::kFp8);
  EXPECT_TRUE(t.quant.quantize_logits);
  EXPECT_EQ(t.quant.amax_history_len, 1024);
}

// hardware: cpu (the default) or gpu; gpu is accepted where a backend for it is built
// (the tests' simulated device, or a real GPU). The refusal without one is
// CudaBackend.UnavailableBackendIsRefusedWithTheReason's.
TEST(TrainConfig, HardwareKey) {
  expect_config_error({"hardware=tpu"}, "hardware");
  EXPECT_EQ(parse_train_config(load_train_config("tiny", {}), "x").hardware, Device::kHost);
  const TrainConfig t = parse_train_config(load_train_config("tiny", {"hardware=gpu"}), "x");
  EXPECT_EQ(t.hardware, Device::kCuda);
  testing_util::simulated_device();  // registers where no GPU is usable
  EXPECT_NO_THROW(require_hardware(Device::kCuda, "config key hardware"));
  EXPECT_NO_THROW(require_hardware(Device::kHost, "config key hardware"));
}

TEST(TrainConfig, SizeErrorsNameTheTrainingKeys) {
  auto error_of = [](std::vector<std::string> overrides) {
    try {
      parse_train_config(load_train_config("tiny", overrides), "x");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of({"base_num_decoder_layers=5000"})
                .find("config: base_num_decoder_layers = 5000 is out of range (at most 4096)"),
            std::string::npos);
  EXPECT_NE(error_of({"base_mlp_dim=2000000"}).find("base_mlp_dim = 2000000 is out of range"),
            std::string::npos);
  EXPECT_NE(error_of({"base_num_kv_heads=3"})
                .find("base_num_kv_heads (3) must divide base_num_query_heads (8)"),
            std::string::npos);
  EXPECT_NE(error_of({"num_experts=5000"}).find("num_experts = 5000 is out of range"),
            std::string::npos);
  EXPECT_NE(error_of({"max_position_embeddings=100000000"})
                .find("max_position_embeddings = 100000000 is out of range"),
            std::string::npos);
  EXPECT_NE(error_of({"max_target_length=100000000"})
                .find("max_target_length (command line) = 100000000 is out of range"),
            std::string::npos);
  EXPECT_NE(error_of({"per_device_batch_size=1000000000000"})
                .find("per_device_batch_size (command line) = 1000000000000 is out of range"),
            std::string::npos);
  EXPECT_NE(error_of({"gradient_accumulation_steps=1000000000000"})
                .find("gradient_accumulation_steps (command line) = 1000000000000 is out of range"),
            std::string::npos);
  EXPECT_EQ(error_of({"per_device_batch_size=65536"}), "no error");
}

TEST(TrainConfig, RankMemoryPlanShardsWhatEachModeShards) {
  const TrainConfig t = parse_train_config(load_train_config("tiny", {}), "x");
  const MemoryPlan full = memory_plan(t.model, 16, 256, true, RematPolicy::kNone);
  const int64_t n = full.params;
  auto same_activations = [&](const MemoryPlan& p) {
    EXPECT_EQ(p.activation_bytes, full.activation_bytes);
    EXPECT_EQ(p.scratch_bytes, full.scratch_bytes);
  };
  const MemoryPlan data = rank_memory_plan(full, t.model, ParallelMode::kData, 4);
  EXPECT_EQ(data.total(), full.total());
  const MemoryPlan zero1 = rank_memory_plan(full, t.model, ParallelMode::kZero1, 4);
  EXPECT_EQ(zero1.optimizer_bytes, 8 * n / 4);
  EXPECT_EQ(zero1.weight_bytes, 4 * n);
  EXPECT_EQ(zero1.grad_bytes, 4 * n);
  same_activations(zero1);
  const MemoryPlan fsdp = rank_memory_plan(full, t.model, ParallelMode::kFsdp, 4);
  EXPECT_EQ(fsdp.weight_bytes, 4 * n / 4);
  EXPECT_EQ(fsdp.compute_weight_bytes, 2 * n / 4);
  EXPECT_EQ(fsdp.grad_bytes, 4 * n / 4);
  EXPECT_EQ(fsdp.optimizer_bytes, 8 * n / 4);
  same_activations(fsdp);
  // Expert parallelism shards the experts only: 4 MoE layers of 4 experts of 3 x 256 x 704.
  const TrainConfig m = parse_train_config(load_train_config("tiny", {"num_experts=4"}), "x");
  const MemoryPlan mfull = memory_plan(m.model, 16, 256, true, RematPolicy::kNone);
  const MemoryPlan ep = rank_memory_plan(mfull, m.model, ParallelMode::kExpert, 2);
  const int64_t experts = 4 * 4 * 3 * 256 * 704;
  EXPECT_EQ(ep.weight_bytes, mfull.weight_bytes - 4 * experts / 2);
  EXPECT_EQ(ep.optimizer_bytes, mfull.optimizer_bytes - 8 * experts / 2);
  // One rank: nothing to shard.
  EXPECT_EQ(rank_memory_plan(full, t.model, ParallelMode::kFsdp, 1).total(), full.total());
}

TEST(TrainConfig, UnknownKeyInFileNamesKeyAndFile) {
  const std::string path = temp_root() + "/bad.yml";
  std::ofstream(path) << "steps: 10\nlearning_rat: 0.1\n";
  try {
    load_train_config(path, {});
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("learning_rat"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bad.yml"), std::string::npos) << msg;
  }
}

// ---- Generation with a KV cache equals the training forward. ----
TEST(Generator, PrefillAndDecodeMatchFullForward) {
  DecoderConfig c;
  c.vocab_size = 41;
  c.dim = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.ffn_dim = 48;
  c.max_seq_len = 32;
  ParamStore ps(c, false);
  ps.init(3, 0.2);
  const int64_t t = 12;
  std::vector<int32_t> tok(t);
  for (int64_t i = 0; i < t; ++i) tok[i] = static_cast<int32_t>((i * 7 + 3) % c.vocab_size);
  CausalLM m(ps, {1, t, false, RematPolicy::kNone});
  std::vector<float> full(static_cast<size_t>(t * c.vocab_size));
  m.forward_logits(tok.data(), full.data());
  Generator gen(ps, t);
  // Prefill 5 tokens, then decode one at a time.
  const float* l = gen.feed(tok.data(), 5);
  for (int64_t v = 0; v < c.vocab_size; ++v)
    ASSERT_NEAR(l[v], full[4 * c.vocab_size + v],
                1e-4 * (1 + std::fabs(full[4 * c.vocab_size + v])));
  for (int64_t i = 5; i < t; ++i) {
    l = gen.feed(&tok[i], 1);
    for (int64_t v = 0; v < c.vocab_size; ++v)
      ASSERT_NEAR(l[v], full[i * c.vocab_size + v],
                  1e-4 * (1 + std::fabs(full[i * c.vocab_size + v])))
          << "position " << i;
  }
  EXPECT_THROW(gen.feed(tok.data(), 1), Error);  // cache full
  // Greedy generation is deterministic and stops at max_tokens.
  GenerateOptions go;
  go.sampling.temperature = 0;
  go.max_tokens = 6;
  go.stop_at_eos = false;
  Generator g1(ps, 20), g2(ps, 20);
  auto a = generate_tokens(g1, {1, 2, 3}, go), b = generate_tokens(g2, {1, 2, 3}, go);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 6u);
}

}  // namespace
}  // namespace hyperion
