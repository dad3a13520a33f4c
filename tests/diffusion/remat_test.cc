// Remat of the UNet (remat_policy: full): the training forward keeps each block's input
// only and the backward pass recomputes the rest. The gradients are the same bit for bit,
// and the activations' high-water mark is lower.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "diffusion/buffer_pool.h"
#include "diffusion/sd_tiny.h"
#include "diffusion/training.h"

namespace hyperion::diffusion {
namespace {

TEST(UNetRemat, SameGradientsWithLessActivationMemory) {
  const auto pipe = make_sd_tiny(3);
  auto& unet = const_cast<UNet&>(pipe->unet());
  unet.params().set_grads(true);
  const int64_t n = 4, h = 8, c = unet.config().in_channels, tokens = 77, d = unet.config().cross_attention_dim;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  Act x(n, h, h, c);
  for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = normal(rng);
  std::vector<float> noise(size_t(x.numel())), ctx(size_t(n * tokens * d));
  for (float& v : noise) v = normal(rng);
  for (float& v : ctx) v = normal(rng);
  const std::vector<int64_t> ts = {10, 300, 650, 999};
  auto step = [&](bool remat, size_t* peak) {
    unet.set_remat(remat);
    unet.params().zero_grads();
    reset_peak_live_bytes();
    const double loss = denoising_loss(unet, pipe->schedule(), x, ts, noise.data(), ctx.data(), tokens, 5.0, true);
    *peak = peak_live_bytes();
    std::vector<float> g(unet.params().all_grads(), unet.params().all_grads() + unet.params().size());
    return std::pair{loss, g};
  };
  size_t kept = 0, remat = 0;
  const auto [loss_kept, grads_kept] = step(false, &kept);
  const auto [loss_remat, grads_remat] = step(true, &remat);
  EXPECT_EQ(loss_kept, loss_remat);
  ASSERT_EQ(grads_kept.size(), grads_remat.size());
  EXPECT_TRUE(grads_kept == grads_remat) << "remat changed the gradients";
  EXPECT_LT(remat, kept) << "remat did not lower the activations' high-water mark";
  unet.set_remat(false);
}

}  // namespace
}  // namespace hyperion::diffusion
