// Training on a device, checked where there is no GPU: the simulated device of
// tests/kernels/simulated_device.h (host kernels behind memory the host cannot touch
// between ops; a real GPU replaces it when present). Optimizer steps on the device equal
// the host's, and checkpoints do not care where they were made: saved from the device
// and resumed on the host, and the other way round, the runs continue identically.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "../kernels/simulated_device.h"
#include "../model/model_test_util.h"
#include "model/causal_lm.h"
#include "model/param_store.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"
#include "train/train_config.h"
#include "train/trainer.h"
#include "train_test_util.h"

namespace hyperion {
namespace {

namespace fs = std::filesystem;

Batch batch_for_step(int64_t step, int64_t vocab) {
  std::mt19937 rng(static_cast<uint32_t>(100 + step));
  Batch b;
  b.rows = 2;
  b.seq_len = 8;
  for (int i = 0; i < 16; ++i) {
    b.inputs.push_back(static_cast<int32_t>(rng() % vocab));
    b.targets.push_back(static_cast<int32_t>(rng() % vocab));
  }
  return b;
}

// One model, its store and optimizer on one backend.
struct TrainRun {
  TrainRun(KernelBackend& k, const DecoderConfig& cfg)
      : params(cfg, true, true, k.allocator()),
        model(params, ModelOptions(2, 8, true)),
        opt(params, OptimizerOptions{}) {}
  double step(int64_t s) {
    params.zero_grads();
    const StepLoss l = model.forward_backward(batch_for_step(s, params.config().vocab_size), 1.0f);
    opt.step(1e-2);
    return l.loss;
  }
  std::vector<float> weights() const {
    params.params_to_host();
    return std::vector<float>(params.host_params(), params.host_params() + params.size());
  }
  ParamStore params;
  CausalLM model;
  AdamW opt;
};

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

KernelBackend& device() {
  KernelBackend* sim = testing_util::simulated_device();
  return sim != nullptr ? *sim : backend_for(Device::kCuda);
}
bool exact() {
  return std::string(device().name()) == "simulated";
}

void expect_same(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (exact())
      ASSERT_EQ(a[i], b[i]) << what << " " << i;
    else
      ASSERT_NEAR(a[i], b[i], 1e-3 + 1e-2 * std::fabs(b[i])) << what << " " << i;
  }
}

TEST(DeviceTraining, OptimizerStepsEqualTheHost) {
  const DecoderConfig cfg = testing_util::tiny_test_config();
  TrainRun host(host_backend(), cfg), dev(device(), cfg);
  host.params.init(5, 0.05);
  dev.params.init(5, 0.05);
  for (int64_t s = 0; s < 3; ++s) {
    const double h = host.step(s), d = dev.step(s);
    if (exact()) {
      EXPECT_EQ(d, h) << "step " << s;
    } else {
      EXPECT_NEAR(d, h, 1e-2 * h) << "step " << s;
    }
  }
  expect_same(dev.weights(), host.weights(), "weights after 3 steps");
}

// Saved on one device, resumed on the other: the next steps equal an unbroken run.
TEST(DeviceTraining, CheckpointsMoveBetweenHostAndDevice) {
  const DecoderConfig cfg = testing_util::tiny_test_config();
  const std::string dir = (fs::temp_directory_path() / "hyperion_device_ckpt").string();
  for (bool from_device : {true, false}) {
    fs::remove_all(dir);
    KernelBackend& saver = from_device ? device() : host_backend();
    KernelBackend& loader = from_device ? host_backend() : device();
    TrainRun unbroken(host_backend(), cfg), first(saver, cfg), second(loader, cfg);
    unbroken.params.init(5, 0.05);
    first.params.init(5, 0.05);
    for (int64_t s = 0; s < 2; ++s) {
      unbroken.step(s);
      first.step(s);
    }
    {
      CheckpointManager ckpt(dir, 2, false);
      TrainerState st;
      st.step = 2;
      ckpt.save(first.params, first.opt, st, {{"tokenizer.model", ""}}, {});
    }
    const std::string at = *latest_checkpoint(dir);
    const TrainerState st = load_training_state(at, second.params, second.opt);
    second.opt.set_steps_taken(st.step);
    EXPECT_EQ(st.step, 2);
    expect_same(second.weights(), first.weights(), "restored weights");
    for (int64_t s = 2; s < 4; ++s) {
      unbroken.step(s);
      second.step(s);
    }
    expect_same(second.weights(), unbroken.weights(),
                from_device ? "device -> host resume" : "host -> device resume");
  }
  fs::remove_all(dir);
}

// The whole trainer with hardware=gpu: data, steps, eval and samples on the device, then a
// resume of that run on the CPU. The losses follow the CPU run's (bit for bit on the
// simulated device).
TEST(DeviceTraining, TrainerOnTheDeviceMatchesTheCpuAndResumesThere) {
  testing_util::ScopedSingleThread one;
  device();  // registers the simulated device where there is no GPU
  const std::string root = testing_util::process_temp_root("device_trainer");
  auto run = [&](const std::string& name, const std::string& hardware, int64_t steps,
                 int64_t stop_at) {
    std::vector<std::string> o = testing_util::small_run_overrides(root, name, "float32", steps);
    o.push_back("hardware=" + hardware);
    TrainOptions opts;
    opts.quiet = true;
    opts.stop_at = stop_at;
    return run_training(load_train_config("tiny", o), "test", opts);
  };
  const TrainResult cpu = run("cpu", "cpu", 6, 0);
  const TrainResult gpu = run("gpu", "gpu", 6, 4);  // stops after a checkpoint at step 4
  ASSERT_EQ(gpu.history.size(), 4u);
  // The device's peak memory: at least the weights, their gradients and AdamW's two
  // moments (f32), in the result, in every step's metrics and in metrics.jsonl; none on
  // the host.
  const double state_mib = 4.0 * 4 * 158016 / (1 << 20);  // the small run's 158,016 params
  EXPECT_GE(gpu.device_peak_mib, state_mib);
  EXPECT_EQ(cpu.device_peak_mib, -1);
  for (const StepMetrics& m : gpu.history) EXPECT_GE(m.device_peak_mib, state_mib);
  EXPECT_EQ(cpu.history.back().device_peak_mib, -1);
  const std::string gpu_metrics = text_of(gpu.run_dir + "/metrics.jsonl");
  EXPECT_NE(gpu_metrics.find("\"device_peak_mib\":"), std::string::npos) << gpu_metrics;
  EXPECT_EQ(text_of(cpu.run_dir + "/metrics.jsonl").find("device_peak_mib"), std::string::npos);
  for (size_t i = 0; i < gpu.history.size(); ++i) {
    if (exact())
      EXPECT_EQ(gpu.history[i].loss, cpu.history[i].loss) << "step " << i + 1;
    else
      EXPECT_NEAR(gpu.history[i].loss, cpu.history[i].loss, 1e-3 * cpu.history[i].loss);
  }
  // The device's checkpoint resumes on the CPU and finishes as the CPU run did.
  const TrainResult resumed = run("gpu", "cpu", 6, 0);
  EXPECT_EQ(resumed.start_step, 4);
  ASSERT_EQ(resumed.history.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    if (exact())
      EXPECT_EQ(resumed.history[i].loss, cpu.history[4 + i].loss) << "step " << 5 + i;
    else
      EXPECT_NEAR(resumed.history[i].loss, cpu.history[4 + i].loss, 1e-2 * cpu.history[i].loss);
  }
  if (exact()) {
    EXPECT_EQ(resumed.eval_loss, cpu.eval_loss);
  }
  // And a device run's eval and samples ran on the device (a finite loss, text out).
  const TrainResult full_gpu = run("gpu_full", "gpu", 2, 0);
  EXPECT_GT(full_gpu.eval_loss, 0);
  EXPECT_FALSE(full_gpu.samples.empty());
}

}  // namespace
}  // namespace hyperion
