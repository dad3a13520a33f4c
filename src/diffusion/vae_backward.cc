// The VAE's backward passes: encoder and decoder in reverse, from their tapes.
#include "base/error.h"
#include "diffusion/vae.h"
#include "diffusion/vae_tape.h"

namespace hyperion::diffusion {

Act Vae::mid_backward(const Mid& m, const MidTape& t, const Act& dout) {
  Act dh = m.second.backward(params_, t.second, dout, nullptr, nullptr);
  if (m.has_attention) {
    // h_out = h + attn(norm(h)): dh flows through both.
    const int64_t seq = dh.h * dh.w;
    Act dnormed(dh.n, dh.h, dh.w, dh.c);
    std::fill(dnormed.v.begin(), dnormed.v.end(), 0.0f);
    m.attention.attn.backward(params_, t.normed.data(), dh.n, seq, t.normed.data(), seq, t.attn, dh.data(),
                              dnormed.data(), nullptr);
    add_inplace(dh, m.attention.norm.backward(params_, t.h, t.gn, false, dnormed));
  }
  return m.first.backward(params_, t.first, dh, nullptr, nullptr);
}

void Vae::encode_backward(const Tape& t, const Act& dmoments) {
  HYP_CHECK(params_.has_grads(), "vae: backward needs a parameter table allocated with gradients");
  const VaeConfig& c = config_;
  Act dy = dmoments;
  if (c.use_quant_conv) {
    Act d;
    quant_conv.backward(params_, t.quant_in, dy, &d);
    dy = std::move(d);
  }
  Act da;
  enc_conv_out.backward(params_, t.a_out, dy, &da);
  Act dh = enc_norm_out.backward(params_, t.h_out, t.norm_out, true, da);
  dh = mid_backward(enc_mid_, t.mid, dh);
  size_t ri = t.resnets.size(), si = t.sampler_inputs.size();
  for (size_t bi = enc_blocks_.size(); bi-- > 0;) {
    const Block& b = enc_blocks_[bi];
    if (b.has_sampler) {
      const Act& padded = t.sampler_inputs[--si];
      Act dp;
      b.sampler.backward(params_, padded, dh, &dp);
      // Drop the padding's gradient.
      Act d(dp.n, dp.h - 1, dp.w - 1, dp.c);
      for (int64_t n = 0; n < d.n; ++n)
        for (int64_t y = 0; y < d.h; ++y)
          std::copy(dp.data() + ((n * dp.h + y) * dp.w) * dp.c, dp.data() + ((n * dp.h + y) * dp.w + d.w) * dp.c,
                    d.data() + ((n * d.h + y) * d.w) * d.c);
      dh = std::move(d);
    }
    for (size_t j = b.resnets.size(); j-- > 0;) dh = b.resnets[j].backward(params_, t.resnets[--ri], dh, nullptr, nullptr);
  }
  HYP_CHECK(ri == 0 && si == 0, "vae backward: the tape does not match the encoder");
  enc_conv_in.backward(params_, *t.input, dh, nullptr);
}

Act Vae::decode_backward(const Tape& t, const Act& dimages) {
  HYP_CHECK(params_.has_grads(), "vae: backward needs a parameter table allocated with gradients");
  Act da;
  dec_conv_out.backward(params_, t.a_out, dimages, &da);
  Act dh = dec_norm_out.backward(params_, t.h_out, t.norm_out, true, da);
  size_t ri = t.resnets.size(), si = t.sampler_inputs.size();
  for (size_t bi = dec_blocks_.size(); bi-- > 0;) {
    const Block& b = dec_blocks_[bi];
    if (b.has_sampler) {
      const Act& up = t.sampler_inputs[--si];
      Act dup;
      b.sampler.backward(params_, up, dh, &dup);
      dh = upsample2x_backward(dup);
    }
    for (size_t j = b.resnets.size(); j-- > 0;) dh = b.resnets[j].backward(params_, t.resnets[--ri], dh, nullptr, nullptr);
  }
  HYP_CHECK(ri == 0 && si == 0, "vae backward: the tape does not match the decoder");
  dh = mid_backward(dec_mid_, t.mid, dh);
  Act din;
  dec_conv_in.backward(params_, t.conv_in_input, dh, &din);
  if (!config_.use_post_quant_conv) return din;
  Act dz;
  post_quant_conv.backward(params_, *t.input, din, &dz);
  return dz;
}

}  // namespace hyperion::diffusion
