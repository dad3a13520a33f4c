// Multi-process training end to end: `hyperion train --nproc N` (mpirun on loopback, 2
// and 4 ranks) against one process with the same global batch, the parallel modes
// against each other, sharded checkpoints resumed at another rank count, and a rank
// that dies or stops ending the job with an error naming it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <fmt/format.h>
#include "../cli/cli_test_util.h"
#include "train_test_util.h"

#include "io/gguf.h"
#include "dist/communicator.h"
#include "io/safetensors.h"

namespace hyperion {
namespace {

namespace fs = std::filesystem;
using testing_util::run_cli;

// A small f32 model on one bundled text: fast, and f32 so equality is round-off only.
std::string common(const std::string& root, const std::string& run) {
  return fmt::format(
      "dataset_path={} base_emb_dim=64 base_num_decoder_layers=2 "
      "base_num_query_heads=4 base_num_kv_heads=2 "
      "base_mlp_dim=160 vocab_size=512 max_target_length=32 sample_count=0 dtype=float32 "
      "learning_rate=3e-3 eval_batches=1 peak_tflops=1 log_period=1000 "
      "base_output_directory={} run_name={}",
      testing_util::small_corpus(), root, run);
}

// Per test process (CTest runs tests in parallel processes).
std::string root_dir() {
  return testing_util::process_temp_root("hyperion_dist");
}

std::vector<double> losses(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::vector<double> out;
  std::string line;
  while (std::getline(in, line))
    out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  return out;
}

// Every tensor of a checkpoint, through the single-file converter (which reads both layouts).
// Every f32 tensor of one safetensors file, by name.
std::map<std::string, std::vector<float>> tensors_of(const std::string& path) {
  io::SafetensorsFile f = io::SafetensorsFile::open(path);
  std::map<std::string, std::vector<float>> w;
  for (const io::SafetensorsTensor& t : f.tensors()) {
    const float* p = static_cast<const float*>(t.data);
    w[t.name].assign(p, p + t.nbytes / 4);
  }
  return w;
}

std::map<std::string, std::vector<float>> weights(const std::string& run_dir) {
  const std::string out = run_dir + "/merged";
  const auto r =
      run_cli(fmt::format("convert --checkpoint {} --to safetensors --output {}", run_dir, out));
  EXPECT_EQ(r.code, 0) << r.out;
  return tensors_of(out + "/model.safetensors");
}

void expect_same_losses(const std::vector<double>& a, const std::vector<double>& b, size_t n) {
  ASSERT_EQ(a.size(), n);
  ASSERT_EQ(b.size(), n);
  for (size_t i = 0; i < n; ++i) EXPECT_NEAR(a[i], b[i], 2e-5 * std::abs(a[i])) << "step " << i + 1;
}

// The same tensor names and shapes, every element within 2e-5.
void expect_same_tensors(const std::map<std::string, std::vector<float>>& a,
                         const std::map<std::string, std::vector<float>>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double worst = 0;
  for (const auto& [name, va] : a) {
    ASSERT_EQ(b.count(name), 1u) << what << ": " << name;
    const auto& vb = b.at(name);
    ASSERT_EQ(va.size(), vb.size()) << name;
    for (size_t i = 0; i < va.size(); ++i) worst = std::max(worst, double(std::abs(va[i] - vb[i])));
  }
  EXPECT_LT(worst, 2e-5) << what;
}

void expect_same_weights(const std::string& run_a, const std::string& run_b) {
  expect_same_tensors(weights(run_a), weights(run_b), run_a + " vs " + run_b);
}

// Environment for multi-rank runs. Open MPI leaks at MPI_Finalize from components it has
// already unloaded (LeakSanitizer cannot name them), so sanitizer builds turn leak
// checking off for the ranks; address and UB checks stay on.
// (The longest multi-rank runs are labelled `long` in CMakeLists.txt: the release suite
// runs them, the sanitizer suites do not.)
#if defined(__SANITIZE_ADDRESS__)
constexpr const char* kRankEnv = "ASAN_OPTIONS=detect_leaks=0 ";
#else
constexpr const char* kRankEnv = "";
#endif

// `hyperion train --nproc N ARGS` (stderr joined).
testing_util::CliResult run_ranks(int nproc, const std::string& args, bool with_stderr = true) {
  return testing_util::run_shell(
      fmt::format("{}{} --threads 1 train --nproc {} --allow-run-as-root {}{}", kRankEnv,
                  HYPERION_CLI_PATH, nproc, args, with_stderr ? " 2>&1" : " 2>/dev/null"));
}

std::string train(const std::string& run, const std::string& extra, int nproc = 0) {
  const std::string args = fmt::format("{} {} --json", common(root_dir(), run), extra);
  const auto r = nproc > 0 ? run_ranks(nproc, args) : run_cli("train " + args);
  EXPECT_EQ(r.code, 0) << r.out;
  return root_dir() + "/" + run;
}

TEST(DistributedTrain, DataParallelTwoRanksEqualsOneProcess) {
  const std::string one = train("dp_one", "steps=20 per_device_batch_size=4");
  const std::string two = train("dp_two", "steps=20 per_device_batch_size=2", 2);
  expect_same_losses(losses(one), losses(two), 20);
  expect_same_weights(one, two);
  // Sharded checkpoint: one file per rank plus the index, loadable as one model.
  EXPECT_TRUE(fs::exists(two + "/checkpoints/20/model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(two + "/checkpoints/20/model-00002-of-00002.safetensors"));
  EXPECT_TRUE(fs::exists(two + "/checkpoints/20/optimizer-00001-of-00002.safetensors"));
  EXPECT_TRUE(fs::exists(two + "/logs/rank-1.log"));
  // GGUF export reads the sharded layout (the index) as it reads one file: the same
  // tensors and keys as the one-process run's export.
  const std::string gguf_two = two + "/two.gguf", gguf_one = one + "/one.gguf";
  const auto g2 = run_cli(fmt::format("convert --checkpoint {} --to gguf --type f32 --output {}",
                                      two, gguf_two));
  ASSERT_EQ(g2.code, 0) << g2.out;
  const auto g1 = run_cli(fmt::format("convert --checkpoint {} --to gguf --type f32 --output {}",
                                      one, gguf_one));
  ASSERT_EQ(g1.code, 0) << g1.out;
  const io::GgufFile a = io::GgufFile::open(gguf_one), b = io::GgufFile::open(gguf_two);
  EXPECT_EQ(a.keys(), b.keys());
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    EXPECT_EQ(a.tensors()[i].name, b.tensors()[i].name);
    EXPECT_EQ(a.tensors()[i].shape, b.tensors()[i].shape);
  }
}

// sd-tiny over 2 ranks of batch 4 trains as one process of batch 8 does: the same losses
// step by step and the same UNet at the end (the VAE trained the same way before it).
TEST(DistributedTrain, DiffusionDataParallelTwoRanksEqualsOneProcess) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist")) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  auto run = [](const std::string& name, int nproc, int batch) {
    const std::string args = fmt::format(
        "sd-tiny steps=6 diffusion.vae_steps=4 diffusion.max_images=128 per_device_batch_size={} eval_interval=6 "
        "diffusion.samples_per_class=0 log_period=100 base_output_directory={} run_name={} --json",
        batch, root_dir(), name);
    const auto r = nproc > 1 ? run_ranks(nproc, args, false) : run_cli("train " + args);
    EXPECT_EQ(r.code, 0) << r.out;
    return root_dir() + "/" + name;
  };
  const std::string one = run("sd_one", 1, 8), two = run("sd_two", 2, 4);
  const std::vector<double> a = losses(one), b = losses(two);
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  // Float sums over 8 rows against two sums of 4 averaged: rounding, grown by 6 Adam steps.
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-3 * std::abs(a[i])) << "step " << i + 1;
  const std::string unet = "/checkpoints/6/unet/diffusion_pytorch_model.safetensors";
  io::SafetensorsFile fa = io::SafetensorsFile::open(one + unet), fb = io::SafetensorsFile::open(two + unet);
  double worst = 0;
  for (const io::SafetensorsTensor& t : fa.tensors()) {
    const io::SafetensorsTensor& u = fb.get(t.name);
    ASSERT_EQ(t.nbytes, u.nbytes) << t.name;
    const float* p = static_cast<const float*>(t.data);
    const float* q = static_cast<const float*>(u.data);
    for (size_t i = 0; i < t.nbytes / 4; ++i) worst = std::max(worst, double(std::abs(p[i] - q[i])));
  }
  EXPECT_LT(worst, 1e-4);
  EXPECT_TRUE(fs::exists(two + "/logs/rank-1.log"));
}

TEST(DistributedTrain, FourRanksDataParallelZeroOneAndFsdpEqualOneProcess) {
  const std::string one =
      train("four_one", "steps=6 per_device_batch_size=4 gradient_accumulation_steps=2");
  const std::string base = "steps=6 per_device_batch_size=1 gradient_accumulation_steps=2";
  const std::string dp = train("four_dp", base, 4);
  const std::string z1 = train("four_z1", base + " shard_optimizer_over_data=true", 4);
  const std::string fsdp = train("four_fsdp", base + " fsdp_parallelism=-1 data_parallelism=1", 4);
  for (const std::string& run : {dp, z1, fsdp}) {
    expect_same_losses(losses(one), losses(run), 6);
    expect_same_weights(one, run);
  }
}

TEST(DistributedTrain, FsdpAndZeroOneEqualDataParallelOnTwoRanks) {
  const std::string base = "steps=8 per_device_batch_size=2 gradient_accumulation_steps=2";
  const std::string dp = train("two_dp", base + " overlap_communication=false", 2);
  const std::string z1 = train("two_z1", base + " shard_optimizer_over_data=true", 2);
  const std::string fsdp = train("two_fsdp", base + " fsdp_parallelism=2 data_parallelism=1", 2);
  for (const std::string& run : {z1, fsdp}) {
    expect_same_losses(losses(dp), losses(run), 8);
    expect_same_weights(dp, run);
  }
}

// LoRA over 2 ranks: the adapters replicated and averaged, the frozen base whole on each
// rank (data parallel) or sharded and gathered layer by layer (fsdp); both give one
// process's losses and adapters. A quantised base under fsdp is refused by name.
TEST(DistributedTrain, LoraDataParallelAndFsdpEqualOneProcess) {
  const std::string lora = " lora_rank=4 lora_alpha=8";
  const std::string one = train("lora_one", "steps=6 per_device_batch_size=4" + lora);
  const std::string dp = train("lora_dp", "steps=6 per_device_batch_size=2" + lora, 2);
  const std::string fsdp =
      train("lora_fsdp", "steps=6 per_device_batch_size=2 fsdp_parallelism=2 data_parallelism=1" + lora, 2);
  const std::string adapter = "/checkpoints/6/adapter_model.safetensors";
  const auto want = tensors_of(one + adapter);
  ASSERT_EQ(want.size(), 2u * 7 * 2);
  for (const std::string& run : {dp, fsdp}) {
    expect_same_losses(losses(one), losses(run), 6);
    expect_same_tensors(tensors_of(run + adapter), want, run);
  }
  const auto r = run_ranks(2, common(root_dir(), "lora_fsdp_int8") +
                                  " steps=1 per_device_batch_size=2 fsdp_parallelism=2 data_parallelism=1"
                                  " dtype=bfloat16 quantization=int8" + lora);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("quantization=int8"), std::string::npos) << r.out;
}

TEST(DistributedTrain, ShardedCheckpointsResumeAtAnotherRankCount) {
  // The uninterrupted reference: one process, 6 steps.
  const std::string ref = train("re_ref", "steps=6 per_device_batch_size=4");
  // 2 ranks (FSDP: sharded moments) stop at 3; one process resumes to 6.
  const std::string two = root_dir() + "/re_two";
  {
    const auto r =
        run_ranks(2, fmt::format("{} steps=6 per_device_batch_size=2 "
                                 "fsdp_parallelism=2 data_parallelism=1 --stop-at 3 --json",
                                 common(root_dir(), "re_two")));
    ASSERT_EQ(r.code, 0) << r.out;
  }
  {
    const auto r = run_cli(fmt::format("train {} steps=6 per_device_batch_size=4 --json",
                                       common(root_dir(), "re_two")));
    ASSERT_EQ(r.code, 0) << r.out;
  }
  expect_same_losses(losses(ref), losses(two), 6);
  // 1 -> 4: one process stops at 3, four ranks (ZeRO-1) resume.
  const std::string four = root_dir() + "/re_four";
  {
    const auto r =
        run_cli(fmt::format("train {} steps=6 per_device_batch_size=4 --stop-at 3 --json",
                            common(root_dir(), "re_four")));
    ASSERT_EQ(r.code, 0) << r.out;
    const auto s = run_ranks(4, fmt::format("{} steps=6 per_device_batch_size=1 "
                                            "shard_optimizer_over_data=true --json",
                                            common(root_dir(), "re_four")));
    ASSERT_EQ(s.code, 0) << s.out;
  }
  expect_same_losses(losses(ref), losses(four), 6);
  expect_same_weights(ref, four);
}

TEST(DistributedTrain, ExpertParallelEqualsOneProcessMoe) {
  const std::string moe =
      "num_experts=4 num_experts_per_tok=2 base_moe_mlp_dim=64 load_balance_loss_weight=0.01 "
      "router_z_loss_weight=0.001 steps=8";
  const std::string one = train("ep_one", moe + " per_device_batch_size=4");
  const std::string two =
      train("ep_two", moe + " per_device_batch_size=2 expert_parallelism=2 data_parallelism=1", 2);
  const std::string four = train(
      "ep_four", moe + " per_device_batch_size=1 expert_parallelism=-1 data_parallelism=1", 4);
  for (const std::string& run : {two, four}) {
    expect_same_losses(losses(one), losses(run), 8);
    expect_same_weights(one, run);
  }
  // Rank 0 samples after gathering every rank's experts: the same greedy text.
  auto sample = [&](const std::string& run, const std::string& extra, int nproc) {
    const std::string args =
        fmt::format("{} {} {} sample_count=1 sample_max_tokens=12 sample_temperature=0 --json",
                    common(root_dir(), run), moe, extra);
    const auto r = nproc > 0 ? run_ranks(nproc, args, false) : run_cli("train " + args, false);
    EXPECT_EQ(r.code, 0) << r.out;
    return nlohmann::json::parse(r.out).at("samples").dump();
  };
  EXPECT_EQ(
      sample("eps_one", "per_device_batch_size=4", 0),
      sample("eps_two", "per_device_batch_size=2 expert_parallelism=2 data_parallelism=1", 2));
}

TEST(DistributedTrain, MeshErrorsNameTheKeys) {
  auto r = run_cli(fmt::format("train {} steps=1 data_parallelism=2", common(root_dir(), "mesh")));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("data_parallelism=2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("this job has 1 ranks"), std::string::npos) << r.out;
  r = run_cli(fmt::format("train {} steps=1 fsdp_parallelism=-1 data_parallelism=-1",
                          common(root_dir(), "mesh")));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("at most one axis may be -1"), std::string::npos) << r.out;
  r = run_cli(fmt::format("train {} steps=1 expert_parallelism=0", common(root_dir(), "mesh")));
  EXPECT_NE(r.out.find("expert_parallelism"), std::string::npos) << r.out;
  r = run_cli(fmt::format("train --nproc 2 {} steps=1", common(root_dir(), "mesh")));
  if (::geteuid() == 0) {
    EXPECT_NE(r.out.find("--allow-run-as-root"), std::string::npos) << r.out;
  }
}

TEST(DistributedTrain, ShardedModesAreCheckedAgainstMemory) {
  // Every mode checks its per-rank plan before allocating (not only data parallelism).
  for (const std::string mode : {"fsdp_parallelism=2 data_parallelism=1",
                                 "shard_optimizer_over_data=true"}) {
    const auto r = testing_util::run_shell(fmt::format(
        "HYPERION_MEMORY_LIMIT=64K {}{} --threads 1 train --nproc 2 --allow-run-as-root {} "
        "steps=1 {} 2>&1",
        kRankEnv, HYPERION_CLI_PATH, common(root_dir(), "memory"), mode));
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("needs"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("this machine has 64.0 KiB"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(mode[0] == 'f' ? "its fsdp share of 2 ranks" : "its zero1 share of 2 ranks"),
              std::string::npos)
        << r.out;
  }
}

// Starts a long 2-rank job, waits for rank 1's log to show its pid, sends it `signal`,
// and returns the job's exit code and output (the CTest timeout bounds the whole test).
testing_util::CliResult disrupt_rank_1(const std::string& run, const std::string& signal,
                                       const std::string& extra) {
  // Prepare the dataset first, so the job is in its training steps within a second.
  EXPECT_EQ(run_cli(fmt::format("train {} steps=1", common(root_dir(), run + "_prep"))).code, 0);
  const std::string dir = root_dir() + "/" + run;
  const std::string script = fmt::format(
      "bash -c '{env}{cli} train --nproc 2 --allow-run-as-root {common} steps=100000 {extra} "
      "> {dir}.out 2>&1 & job=$!; "
      "for i in $(seq 600); do pid=$(grep -o \"pid [0-9]*\" {dir}/logs/rank-1.log 2>/dev/null "
      "| head -1 | cut -d\" \" -f2); "
      "[ -n \"$pid\" ] && grep -q \"step\" {dir}/logs/rank-0.log 2>/dev/null && break; sleep 0.1; "
      "done; "
      "sleep 1; kill -{sig} $pid; wait $job; code=$?; kill -KILL $pid 2>/dev/null; "
      "cat {dir}.out; exit $code'",
      fmt::arg("env", kRankEnv), fmt::arg("cli", HYPERION_CLI_PATH),
      fmt::arg("common", common(root_dir(), run)), fmt::arg("extra", extra), fmt::arg("dir", dir),
      fmt::arg("sig", signal));
  return testing_util::run_shell(script);
}

TEST(DistributedTrain, KilledRankEndsTheJobNamingIt) {
  const auto r = disrupt_rank_1("killed", "KILL", "per_device_batch_size=2");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("rank 1"), std::string::npos) << r.out;
}

TEST(DistributedTrain, StoppedRankTimesOutNamingIt) {
  const auto r =
      disrupt_rank_1("stopped", "STOP", "per_device_batch_size=2 collective_timeout_s=5");
  EXPECT_NE(r.code, 0) << r.out;
  // The report names the rank's host (every rank's, gathered at start).
  EXPECT_NE(r.out.find("rank 1 (host " + dist::this_host_name() + ") not responding"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("collective_timeout_s"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace hyperion
