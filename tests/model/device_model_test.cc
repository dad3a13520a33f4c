// The model on a device: the same training step with its parameters, gradients and
// activations in device memory (the simulated device of tests/kernels/simulated_device.h
// where there is no GPU: host kernels behind memory the host cannot touch between ops)
// gives the host's loss and gradients. On the simulated device they are bit-identical
// (the same kernels); a real GPU runs the CUDA backend's and the tolerance is its.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../kernels/simulated_device.h"
#include "model/causal_lm.h"
#include "model/generator.h"
#include "model/param_store.h"
#include "model_test_util.h"

namespace hyperion {
namespace {

Batch random_batch(int64_t rows, int64_t seq, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  Batch b;
  b.rows = rows;
  b.seq_len = seq;
  for (int64_t i = 0; i < rows * seq; ++i) {
    b.inputs.push_back(static_cast<int32_t>(rng() % vocab));
    b.targets.push_back(static_cast<int32_t>(rng() % vocab));
  }
  return b;
}

std::vector<float> to_host(const ParamStore& ps, const float* data) {
  std::vector<float> v(static_cast<size_t>(ps.size()));
  backend_for(ps.device()).download(data, v.data(), v.size() * sizeof(float));
  return v;
}

// The tiny model as a dense Llama, a MoE, and with Gemma 2's and Gemma 3's features:
// post-norms, capped scores and logits, a window narrower than the batch's 8 tokens,
// q/k norms and local layers with their own RoPE base (the CUDA backend's portable
// attention kernels and its capped cross-entropy).
DecoderConfig device_test_config(const std::string& name) {
  DecoderConfig c = testing_util::tiny_test_config(name == "moe" ? 4 : 0);
  if (name == "gemma2") testing_util::use_gemma2_features(c, 3);
  if (name == "gemma3") testing_util::use_gemma3_features(c, 3);
  return c;
}

class DeviceModel : public testing::TestWithParam<std::string> {};

TEST_P(DeviceModel, TrainingStepEqualsTheHost) {
  KernelBackend* dev = testing_util::simulated_device();
  if (dev == nullptr) dev = &backend_for(Device::kCuda);
  const DecoderConfig cfg = device_test_config(GetParam());
  for (bool bf16 : {false, true}) {
    ParamStore host_ps(cfg, bf16, true), dev_ps(cfg, bf16, true, dev->allocator());
    host_ps.init(7, 0.05);
    dev_ps.init(7, 0.05);
    EXPECT_EQ(to_host(dev_ps, dev_ps.params()), to_host(host_ps, host_ps.params()));
    const ModelOptions options(2, 8, bf16);
    CausalLM host_model(host_ps, options), dev_model(dev_ps, options);
    const Batch batch = random_batch(2, 8, cfg.vocab_size, 3);
    const StepLoss h = host_model.forward_backward(batch, 1.0f);
    const StepLoss d = dev_model.forward_backward(batch, 1.0f);
    // Bit-identical on the simulated device; a GPU's kernels sum in other orders.
    const bool exact = std::string(dev->name()) == "simulated";
    const double rel = exact ? 0 : (bf16 ? 2e-2 : 1e-4);
    EXPECT_NEAR(d.loss, h.loss, rel * h.loss) << "bf16 " << bf16;
    const std::vector<float> hg = to_host(host_ps, host_ps.grads()),
                             dg = to_host(dev_ps, dev_ps.grads());
    ASSERT_EQ(hg.size(), dg.size());
    double scale = 0;
    for (float g : hg) scale = std::max(scale, static_cast<double>(std::fabs(g)));
    for (size_t i = 0; i < hg.size(); ++i)
      ASSERT_NEAR(dg[i], hg[i], rel * scale) << "gradient " << i << ", bf16 " << bf16;
  }
}

// Greedy decoding with the KV cache on the device picks the host's tokens, and its
// logits match the host's at every step (f32: a GPU differs only in summation order).
TEST_P(DeviceModel, GreedyDecodingEqualsTheHost) {
  KernelBackend* dev = testing_util::simulated_device();
  if (dev == nullptr) dev = &backend_for(Device::kCuda);
  const DecoderConfig cfg = device_test_config(GetParam());
  ParamStore host_ps(cfg, false, true), dev_ps(cfg, false, true, dev->allocator());
  host_ps.init(11, 0.5);
  dev_ps.init(11, 0.5);
  Generator host_gen(host_ps, cfg.max_seq_len), dev_gen(dev_ps, cfg.max_seq_len);
  std::vector<int32_t> prompt = {1, 5, 9, 2, 7};
  const float* hl = host_gen.feed(prompt.data(), static_cast<int64_t>(prompt.size()));
  const float* dl = dev_gen.feed(prompt.data(), static_cast<int64_t>(prompt.size()));
  const bool exact = std::string(dev->name()) == "simulated";
  for (int64_t step = 0; step + static_cast<int64_t>(prompt.size()) < cfg.max_seq_len; ++step) {
    double scale = 0;
    for (int64_t v = 0; v < cfg.vocab_size; ++v)
      scale = std::max(scale, static_cast<double>(std::fabs(hl[v])));
    for (int64_t v = 0; v < cfg.vocab_size; ++v)
      ASSERT_NEAR(dl[v], hl[v], exact ? 0.0 : 1e-4 * scale) << "step " << step << " logit " << v;
    const auto host_next = static_cast<int32_t>(std::max_element(hl, hl + cfg.vocab_size) - hl);
    const auto dev_next = static_cast<int32_t>(std::max_element(dl, dl + cfg.vocab_size) - dl);
    ASSERT_EQ(dev_next, host_next) << "step " << step;
    hl = host_gen.feed(&host_next, 1);
    dl = dev_gen.feed(&dev_next, 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, DeviceModel,
                         testing::Values("dense", "moe", "gemma2", "gemma3"),
                         [](const testing::TestParamInfo<std::string>& i) { return i.param; });

}  // namespace
}  // namespace hyperion
