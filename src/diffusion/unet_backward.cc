// The UNet's backward pass: the forward (unet.cc) in reverse, from the tape it kept.
#include "base/error.h"
#include "diffusion/unet.h"
#include "diffusion/unet_tape.h"
#include "kernels/activation.h"
#include "kernels/dense_ops.h"

namespace hyperion::diffusion {

void UNet::transformer_backward(const Transformer& tr, const TransformerTape& saved, Act& dx, const float* context,
                                int64_t tokens) {
  TransformerTape recomputed;
  if (saved.blocks.empty() && !tr.blocks.empty()) {
    Act x = saved.x;
    run_transformer(tr, x, context, tokens, &recomputed);
  }
  const TransformerTape& t = saved.blocks.empty() && !tr.blocks.empty() ? recomputed : saved;
  // Forward: x_out = x + proj_out(h), h from the blocks over proj_in(GroupNorm(x)).
  const int64_t rows = dx.rows(), c = dx.c, seq = dx.h * dx.w, n = dx.n;
  FloatBuffer dh(size_t(rows * c)), dn(size_t(rows * c)), dff(size_t(rows * c * 8)), dgeglu(size_t(rows * c * 4));
  tr.proj_out.backward(params_, t.h.data(), dx.data(), rows, dh.data());
  for (size_t i = tr.blocks.size(); i-- > 0;) {
    const TransformerBlock& b = tr.blocks[i];
    const BlockTape& bt = t.blocks[i];
    // Feed-forward: h += ff_out(geglu(ff_in(norm3(h2)))).
    b.ff_out.backward(params_, bt.geglu.data(), dh.data(), rows, dgeglu.data());
    geglu_rows_backward(dgeglu.data(), bt.ff.data(), rows, c * 4, dff.data());
    b.ff_in.backward(params_, bt.n3.data(), dff.data(), rows, dn.data());
    b.norm3.backward(params_, bt.h2.data(), rows, bt.m3.data(), bt.r3.data(), dn.data(), dn.data());
    add_to(dh.data(), dn.data(), rows * c);
    // Cross-attention: h += attn2(norm2(h1), context); the context is frozen.
    std::fill(dn.begin(), dn.end(), 0.0f);
    b.cross_attn.backward(params_, bt.n2.data(), n, seq, context, tokens, bt.a2, dh.data(), dn.data(), nullptr);
    b.norm2.backward(params_, bt.h1.data(), rows, bt.m2.data(), bt.r2.data(), dn.data(), dn.data());
    add_to(dh.data(), dn.data(), rows * c);
    // Self-attention: h += attn1(norm1(h0)).
    std::fill(dn.begin(), dn.end(), 0.0f);
    b.self_attn.backward(params_, bt.n1.data(), n, seq, bt.n1.data(), seq, bt.a1, dh.data(), dn.data(), nullptr);
    b.norm1.backward(params_, bt.h0.data(), rows, bt.m1.data(), bt.r1.data(), dn.data(), dn.data());
    add_to(dh.data(), dn.data(), rows * c);
  }
  Act dnormed(dx.n, dx.h, dx.w, c);
  tr.proj_in.backward(params_, t.normed.data(), dh.data(), rows, dnormed.data());
  const Act dgn = tr.norm.backward(params_, t.x, t.gn, /*silu=*/false, dnormed);
  add_inplace(dx, dgn);  // the residual path: dx (= dout) + the GroupNorm branch
}

void UNet::backward(const Tape& t, const Act& dout) {
  HYP_CHECK(params_.has_grads(), "unet: backward needs a parameter table allocated with gradients");
  const UNetConfig& c = config_;
  FloatBuffer dtemb_silu(t.temb_silu.size(), 0.0f);
  // Output: conv_out(silu(norm_out(h))).
  Act da;
  conv_out.backward(params_, t.a_out, dout, &da);
  Act dh = norm_out.backward(params_, t.h_out, t.norm_out, /*silu=*/true, da);

  // Walk the tape from its end.
  size_t ri = t.resnets.size(), ti = t.transformers.size(), si = t.sampler_inputs.size(),
         ki = t.skip_channels.size(), ui = t.upsampled_from.size();
  // Gradients of the skip connections, by the index the forward pushed them at.
  const size_t skips = 1 + [&] {
    size_t k = 0;
    for (const Block& b : down_) k += b.resnets.size() + (b.has_sampler ? 1 : 0);
    return k;
  }();
  std::vector<Act> dskip(skips);
  size_t pop = skips;  // the up pass popped skips[skips - 1] first
  std::vector<size_t> popped;
  for (const Block& b : up_)
    for (size_t j = 0; j < b.resnets.size(); ++j) popped.push_back(--pop);

  for (size_t bi = up_.size(); bi-- > 0;) {
    const Block& b = up_[bi];
    if (b.has_sampler) {
      const Act& up = t.sampler_inputs[--si];
      Act dup;
      b.sampler.backward(params_, up, dh, &dup);
      const auto [from_h, from_w] = t.upsampled_from[--ui];
      dh = upsample_to_backward(dup, from_h, from_w);
    }
    for (size_t j = b.resnets.size(); j-- > 0;) {
      if (!b.attentions.empty()) transformer_backward(b.attentions[j], t.transformers[--ti], dh, t.context, t.tokens);
      const Act dcat = b.resnets[j].backward(params_, t.resnets[--ri], dh, t.temb_silu.data(), dtemb_silu.data());
      const int64_t skip_c = t.skip_channels[--ki], main_c = dcat.c - skip_c;
      Act dmain(dcat.n, dcat.h, dcat.w, main_c), ds(dcat.n, dcat.h, dcat.w, skip_c);
      for (int64_t r = 0; r < dcat.rows(); ++r) {
        std::copy(dcat.data() + r * dcat.c, dcat.data() + r * dcat.c + main_c, dmain.data() + r * main_c);
        std::copy(dcat.data() + r * dcat.c + main_c, dcat.data() + (r + 1) * dcat.c, ds.data() + r * skip_c);
      }
      dskip[popped[ki]] = std::move(ds);
      dh = std::move(dmain);
    }
  }
  if (has_mid_) {
    dh = mid_.resnets[1].backward(params_, t.resnets[--ri], dh, t.temb_silu.data(), dtemb_silu.data());
    transformer_backward(mid_.attentions[0], t.transformers[--ti], dh, t.context, t.tokens);
    dh = mid_.resnets[0].backward(params_, t.resnets[--ri], dh, t.temb_silu.data(), dtemb_silu.data());
  }
  size_t k = skips;
  for (size_t bi = down_.size(); bi-- > 0;) {
    const Block& b = down_[bi];
    if (b.has_sampler) {
      add_inplace(dh, dskip[--k]);
      Act d;
      b.sampler.backward(params_, t.sampler_inputs[--si], dh, &d);
      dh = std::move(d);
    }
    for (size_t j = b.resnets.size(); j-- > 0;) {
      add_inplace(dh, dskip[--k]);
      if (!b.attentions.empty()) transformer_backward(b.attentions[j], t.transformers[--ti], dh, t.context, t.tokens);
      dh = b.resnets[j].backward(params_, t.resnets[--ri], dh, t.temb_silu.data(), dtemb_silu.data());
    }
  }
  add_inplace(dh, dskip[--k]);
  HYP_CHECK(k == 0 && ri == 0 && ti == 0 && si == 0 && ki == 0, "unet backward: the tape does not match the model");
  conv_in.backward(params_, *t.sample, dh, nullptr);

  // Time embedding: temb_silu = silu(temb), temb = linear_2(silu(linear_1(tproj))) (+ add).
  const int64_t n = dout.n, temb_dim = c.time_embed_dim();
  FloatBuffer dtemb(size_t(n * temb_dim)), dhid(size_t(n * temb_dim));
  activation_backward(Activation::kSilu, dtemb_silu.data(), t.temb.data(), dtemb.data(), n * temb_dim);
  if (c.text_time) {
    add_linear2.backward(params_, t.add_hidden_silu.data(), dtemb.data(), n, dhid.data());
    activation_backward(Activation::kSilu, dhid.data(), t.add_hidden.data(), dhid.data(), n * temb_dim);
    add_linear1.backward(params_, t.add_in.data(), dhid.data(), n, nullptr);
  }
  time_linear2.backward(params_, t.hidden_silu.data(), dtemb.data(), n, dhid.data());
  activation_backward(Activation::kSilu, dhid.data(), t.hidden.data(), dhid.data(), n * temb_dim);
  time_linear1.backward(params_, t.tproj.data(), dhid.data(), n, nullptr);
}

}  // namespace hyperion::diffusion
