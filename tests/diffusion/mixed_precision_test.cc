// Mixed precision of the diffusion models (ParamTable::set_bf16_compute): the linear
// layers and convolutions read bf16, everything else stays f32. Each component's output,
// the training loss and the gradients stay within bf16's rounding of the f32 ones, and
// the bf16 copy of the weights follows every write of the f32 master.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "diffusion/sd_tiny.h"
#include "diffusion/training.h"

namespace hyperion::diffusion {
namespace {

// max |a - b| over max |b|.
double rel_error(const float* a, const float* b, int64_t n) {
  double scale = 1e-12, err = 0;
  for (int64_t i = 0; i < n; ++i) {
    scale = std::max(scale, double(std::fabs(b[i])));
    err = std::max(err, double(std::fabs(a[i] - b[i])));
  }
  return err / scale;
}

// ||a - b|| / ||b|| (gradients: a few near-zero entries make the max-norm form noisy).
double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

struct UNetInputs {
  Act x;
  std::vector<float> t, ctx;
  int64_t tokens = 77;
};

UNetInputs unet_inputs(const UNet& unet, int64_t n, int64_t side) {
  UNetInputs in;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  in.x = Act(n, side, side, unet.config().in_channels);
  for (int64_t i = 0; i < in.x.numel(); ++i) in.x.data()[i] = normal(rng);
  in.t = {50.0f, 700.0f};
  in.t.resize(size_t(n), 400.0f);
  in.ctx.resize(size_t(n * in.tokens * unet.config().cross_attention_dim));
  for (float& v : in.ctx) v = normal(rng);
  return in;
}

TEST(MixedPrecision, UNetForwardWithinBf16RoundingOfF32) {
  const auto pipe = make_sd_tiny(3);
  auto& unet = const_cast<UNet&>(pipe->unet());
  const UNetInputs in = unet_inputs(unet, 2, 8);
  const Act f32 = unet.forward(in.x, in.t.data(), in.ctx.data(), in.tokens);
  unet.params().set_bf16_compute(true);
  const Act mixed = unet.forward(in.x, in.t.data(), in.ctx.data(), in.tokens);
  unet.params().set_bf16_compute(false);
  const double err = rel_error(mixed.data(), f32.data(), f32.numel());
  EXPECT_GT(err, 0.0) << "the bf16 path was not taken";
  EXPECT_LT(err, 3e-2);
  // Off again: f32 bit for bit.
  const Act again = unet.forward(in.x, in.t.data(), in.ctx.data(), in.tokens);
  EXPECT_TRUE(std::equal(again.v.begin(), again.v.end(), f32.v.begin()));
}

TEST(MixedPrecision, VaeAndTextEncoderWithinBf16RoundingOfF32) {
  const auto pipe = make_sd_tiny(4);
  auto& vae = const_cast<Vae&>(pipe->vae());
  auto& clip = const_cast<ClipTextModel&>(pipe->text_encoder());
  std::mt19937 rng(8);
  std::normal_distribution<float> normal;
  Act z(1, 8, 8, vae.config().latent_channels);
  for (int64_t i = 0; i < z.numel(); ++i) z.data()[i] = normal(rng);
  std::vector<int32_t> ids(size_t(clip.config().max_positions));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 37 + 5) % clip.config().vocab_size);
  const Act img32 = vae.decode(z);
  const ClipTextOutput txt32 = clip.forward(ids, 1);
  // The pipeline's switch sets every component.
  const_cast<DiffusionPipeline&>(*pipe).set_compute_dtype(DType::kBF16);
  EXPECT_EQ(pipe->compute_dtype(), DType::kBF16);
  const Act img16 = vae.decode(z);
  const ClipTextOutput txt16 = clip.forward(ids, 1);
  const double e_img = rel_error(img16.data(), img32.data(), img32.numel());
  const double e_txt = rel_error(txt16.last.data(), txt32.last.data(), int64_t(txt32.last.size()));
  EXPECT_GT(e_img, 0.0);
  EXPECT_LT(e_img, 3e-2);
  EXPECT_GT(e_txt, 0.0);
  EXPECT_LT(e_txt, 3e-2);
}

TEST(MixedPrecision, TrainingLossAndGradientsWithinBf16RoundingOfF32) {
  const auto pipe = make_sd_tiny(5);
  auto& unet = const_cast<UNet&>(pipe->unet());
  unet.params().set_grads(true);
  const UNetInputs in = unet_inputs(unet, 2, 8);
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  std::vector<float> noise(size_t(in.x.numel()));
  for (float& v : noise) v = normal(rng);
  const std::vector<int64_t> ts = {50, 700};
  auto step = [&](bool mixed) {
    unet.params().set_bf16_compute(mixed);
    unet.params().zero_grads();
    const double loss =
        denoising_loss(unet, pipe->schedule(), in.x, ts, noise.data(), in.ctx.data(), in.tokens, 5.0, true);
    return std::pair{loss, std::vector<float>(unet.params().all_grads(),
                                              unet.params().all_grads() + unet.params().size())};
  };
  const auto [loss32, grads32] = step(false);
  const auto [loss16, grads16] = step(true);
  unet.params().set_bf16_compute(false);
  EXPECT_NE(loss16, loss32);
  EXPECT_NEAR(loss16, loss32, 1e-2 * std::fabs(loss32));
  EXPECT_LT(rel_l2(grads16, grads32), 3e-2);
}

TEST(MixedPrecision, Bf16CopyFollowsEveryWriteOfTheWeights) {
  const auto a = make_sd_tiny(3), b = make_sd_tiny(11);
  auto& unet = const_cast<UNet&>(a->unet());
  const ParamTable& other = b->unet().params();
  const UNetInputs in = unet_inputs(unet, 2, 8);
  unet.params().set_bf16_compute(true);
  const Act before = unet.forward(in.x, in.t.data(), in.ctx.data(), in.tokens);
  // A write through all() (the optimizer's, the EMA's, a checkpoint's restore).
  std::copy(other.all(), other.all() + other.size(), unet.params().all());
  const Act after = unet.forward(in.x, in.t.data(), in.ctx.data(), in.tokens);
  const Act want = const_cast<UNet&>(b->unet()).forward(in.x, in.t.data(), in.ctx.data(), in.tokens);
  EXPECT_GT(rel_error(after.data(), before.data(), before.numel()), 0.1) << "the stale bf16 copy was used";
  EXPECT_LT(rel_error(after.data(), want.data(), want.numel()), 3e-2);
  // A write of one tensor through data(i), announced with mark_written().
  const int i = unet.params().find("time_embedding.linear_1.weight");
  ASSERT_GE(i, 0);
  ASSERT_GE(unet.params().entries()[size_t(i)].bf16_offset, 0) << "a linear layer's weight has a bf16 copy";
  const int64_t n = unet.params().entries()[size_t(i)].numel;
  std::fill(unet.params().data(i), unet.params().data(i) + n, 0.0f);
  unet.params().mark_written();
  EXPECT_NE(rel_error(unet.forward(in.x, in.t.data(), in.ctx.data(), in.tokens).data(), after.data(), after.numel()),
            0.0);
}

}  // namespace
}  // namespace hyperion::diffusion
