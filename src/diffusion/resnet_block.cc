#include "diffusion/resnet_block.h"

#include <vector>

#include "base/error.h"
#include "kernels/backend.h"
#include "kernels/dense_ops.h"

namespace hyperion::diffusion {

ResnetBlock ResnetBlock::declare(ParamTable& p, const std::string& name, int64_t in, int64_t out,
                                 int64_t groups, float eps, int64_t time_dim) {
  ResnetBlock r;
  r.norm1 = GroupNorm::declare(p, name + ".norm1", in, groups, eps);
  r.conv1 = Conv::declare(p, name + ".conv1", in, out, 3);
  r.has_time = time_dim > 0;
  if (r.has_time) r.time_proj = Linear::declare(p, name + ".time_emb_proj", time_dim, out);
  r.norm2 = GroupNorm::declare(p, name + ".norm2", out, groups, eps);
  r.conv2 = Conv::declare(p, name + ".conv2", out, out, 3);
  r.has_shortcut = in != out;
  if (r.has_shortcut) r.shortcut = Conv::declare(p, name + ".conv_shortcut", in, out, 1);
  return r;
}

Act ResnetBlock::forward(const ParamTable& p, const Act& x, const float* temb_silu,
                         Tape* tape) const {
  Act a1 = norm1.forward(p, x, /*silu=*/true, tape ? &tape->n1 : nullptr);
  Act h = conv1.forward(p, a1);
  if (has_time) {
    HYP_CHECK(temb_silu != nullptr, "resnet block: the time embedding is missing");
    // + time_emb_proj(silu(temb)) per image, broadcast over its pixels: a rank-1 product
    // ones[pixels] x t[image] added to each image's map (one batched GEMM on any device;
    // 1 * t is exact, so the sum is the plain addition's).
    DeviceScope scope(p.device());
    FloatBuffer t(static_cast<size_t>(x.n * h.c));
    time_proj.forward(p, temb_silu, x.n, t.data());
    const int64_t pixels = h.h * h.w;
    const std::vector<float> ones_host(static_cast<size_t>(pixels), 1.0f);
    const FloatBuffer ones = to_device(ones_host.data(), pixels, p.device());
    GemmArgs g = contiguous_gemm_args(Trans::kN, Trans::kN, pixels, h.c, 1, ones.data(), DType::kF32, t.data(),
                                      DType::kF32, h.data(), DType::kF32, 1.0f);
    g.batch = x.n;
    g.stride_a = 0;
    g.stride_b = h.c;
    g.stride_c = pixels * h.c;
    backend_for(p.device()).gemm(g);
  }
  Act a2 = norm2.forward(p, h, /*silu=*/true, tape ? &tape->n2 : nullptr);
  Act y = conv2.forward(p, a2);
  if (has_shortcut)
    add_inplace(y, shortcut.forward(p, x));
  else
    add_inplace(y, x);
  if (tape) {
    tape->x = x;
    tape->a1 = std::move(a1);
    tape->h1 = std::move(h);
    tape->a2 = std::move(a2);
  }
  return y;
}

Act ResnetBlock::backward(ParamTable& p, const Tape& saved, const Act& dout,
                          const float* temb_silu, float* dtemb_silu) const {
  // Under remat the forward kept only the block's input: its activations again, now.
  Tape recomputed;
  if (saved.dropped()) forward(p, saved.x, temb_silu, &recomputed);
  const Tape& t = saved.dropped() ? recomputed : saved;
  Act da2, da1;
  conv2.backward(p, t.a2, dout, &da2);
  Act dh1 = norm2.backward(p, t.h1, t.n2, /*silu=*/true, da2);
  if (has_time) {
    // The time projection was broadcast over the pixels: its gradient sums them.
    const int64_t n = dh1.n, pixels = dh1.h * dh1.w, c = dh1.c;
    FloatBuffer dtp(static_cast<size_t>(n * c));
    for (int64_t i = 0; i < n; ++i)
      column_sums(dh1.data() + i * pixels * c, pixels, c, dtp.data() + i * c, false);
    time_proj.backward(p, temb_silu, dtp.data(), n, dtemb_silu, /*accumulate_dx=*/true);
  }
  conv1.backward(p, t.a1, dh1, &da1);
  Act dx = norm1.backward(p, t.x, t.n1, /*silu=*/true, da1);
  if (has_shortcut) {
    Act ds;
    shortcut.backward(p, t.x, dout, &ds);
    add_inplace(dx, ds);
  } else {
    add_inplace(dx, dout);
  }
  return dx;
}

}  // namespace hyperion::diffusion
