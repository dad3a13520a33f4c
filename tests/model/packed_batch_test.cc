// Packed rows (Batch::positions): documents packed into one sequence, each with its own
// positions and attending to itself only, give the loss and the gradients of the same
// documents each in its own padded row; on the device (the simulated one where no GPU is
// usable) as on the host. Also with Gemma 3's sliding window and local RoPE base.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "../kernels/simulated_device.h"
#include "base/error.h"
#include "kernels/cross_entropy.h"
#include "model/causal_lm.h"
#include "model/param_store.h"
#include "model_test_util.h"

namespace hyperion {
namespace {

std::vector<float> host_copy(const ParamStore& ps, const float* data) {
  std::vector<float> v(static_cast<size_t>(ps.size()));
  backend_for(ps.device()).download(data, v.data(), v.size() * sizeof(float));
  return v;
}

struct Docs {
  std::vector<std::vector<int32_t>> tokens, targets;  // per document; targets end in ignore
};

Docs random_docs(const std::vector<int64_t>& lengths, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  Docs d;
  for (int64_t len : lengths) {
    std::vector<int32_t> tok, tg;
    for (int64_t j = 0; j < len; ++j) {
      tok.push_back(static_cast<int32_t>(rng() % vocab));
      // Some targets ignored (an SFT prompt), the document's last always (no continuation).
      tg.push_back(j + 1 == len || rng() % 4 == 0 ? kIgnoreIndex : static_cast<int32_t>(rng() % vocab));
    }
    d.tokens.push_back(tok);
    d.targets.push_back(tg);
  }
  return d;
}

Batch unpacked(const Docs& d, int64_t t) {
  Batch b = Batch::tokens(static_cast<int64_t>(d.tokens.size()), t);
  std::fill(b.targets.begin(), b.targets.end(), kIgnoreIndex);
  for (size_t r = 0; r < d.tokens.size(); ++r)
    for (size_t j = 0; j < d.tokens[r].size(); ++j) {
      b.inputs[r * static_cast<size_t>(t) + j] = d.tokens[r][j];
      b.targets[r * static_cast<size_t>(t) + j] = d.targets[r][j];
    }
  return b;
}

Batch packed(const Docs& d, int64_t t) {
  Batch b = Batch::tokens(1, t);
  std::fill(b.targets.begin(), b.targets.end(), kIgnoreIndex);
  b.positions.assign(static_cast<size_t>(t), 0);
  size_t at = 0;
  for (size_t r = 0; r < d.tokens.size(); ++r)
    for (size_t j = 0; j < d.tokens[r].size(); ++j, ++at) {
      b.inputs[at] = d.tokens[r][j];
      b.targets[at] = d.targets[r][j];
      b.positions[at] = static_cast<int32_t>(j);
    }
  for (size_t j = at; j < static_cast<size_t>(t); ++j) b.positions[j] = static_cast<int32_t>(j - at);  // padding
  return b;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 1e-6;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], rel * scale) << what << " " << i;
}

class PackedBatch : public testing::TestWithParam<std::string> {};

TEST_P(PackedBatch, EqualsEachDocumentInItsOwnRow) {
  DecoderConfig cfg = testing_util::tiny_test_config();
  if (GetParam() == "gemma3") testing_util::use_gemma3_features(cfg, 3);
  const int64_t t = 16;
  const Docs docs = random_docs({5, 7, 3}, cfg.vocab_size, 11);  // 15 tokens and one of padding
  ParamStore ps_rows(cfg, false, true), ps_packed(cfg, false, true);
  ps_rows.init(5, 0.2);
  ps_packed.init(5, 0.2);
  CausalLM rows_model(ps_rows, ModelOptions(3, t, false)), packed_model(ps_packed, ModelOptions(1, t, false));
  const StepLoss a = rows_model.forward_backward(unpacked(docs, t), 1.0f);
  const StepLoss b = packed_model.forward_backward(packed(docs, t), 1.0f);
  EXPECT_EQ(a.count, b.count);
  EXPECT_NEAR(b.loss, a.loss, 1e-5 * a.loss);
  expect_close(host_copy(ps_packed, ps_packed.grads()), host_copy(ps_rows, ps_rows.grads()), 1e-5, "gradient");

  // The same packed step on the device.
  KernelBackend* dev = testing_util::simulated_device();
  if (dev == nullptr) dev = &backend_for(Device::kCuda);
  ParamStore ps_dev(cfg, false, true, dev->allocator());
  ps_dev.init(5, 0.2);
  CausalLM dev_model(ps_dev, ModelOptions(1, t, false));
  const StepLoss d = dev_model.forward_backward(packed(docs, t), 1.0f);
  const bool exact = std::string(dev->name()) == "simulated";
  EXPECT_NEAR(d.loss, b.loss, exact ? 0.0 : 1e-4 * b.loss);
  expect_close(host_copy(ps_dev, ps_dev.grads()), host_copy(ps_packed, ps_packed.grads()), exact ? 0.0 : 1e-4,
               "device gradient");
}

INSTANTIATE_TEST_SUITE_P(Archs, PackedBatch, testing::Values("llama", "gemma3"));

TEST(PackedBatchErrors, PositionsMustCountUpWithinADocument) {
  const DecoderConfig cfg = testing_util::tiny_test_config();
  ParamStore ps(cfg, false, true);
  ps.init(5, 0.2);
  CausalLM model(ps, ModelOptions(1, 8, false));
  Batch b = Batch::tokens(1, 8);
  b.positions = {0, 1, 2, 4, 5, 6, 7, 8};
  try {
    model.forward_backward(b, 1.0f);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("count up by one"), std::string::npos) << e.what();
  }
  b.positions = {1, 2, 3, 4, 5, 6, 7, 8};
  try {
    model.forward_backward(b, 1.0f);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("start at 0"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hyperion
