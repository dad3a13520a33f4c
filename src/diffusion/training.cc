#include "diffusion/training.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "kernels/adamw.h"

namespace hyperion::diffusion {

VaeLoss vae_loss_backward(Vae& vae, const Act& images, const float* noise, double kl_weight) {
  std::shared_ptr<Vae::Tape> enc, dec;
  const Act moments = vae.encode(images, &enc);
  const int64_t L = vae.config().latent_channels, rows = moments.rows();
  Act z(moments.n, moments.h, moments.w, L);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < L; ++c) {
      const float mean = moments.data()[r * 2 * L + c];
      const float logvar = std::clamp(moments.data()[r * 2 * L + L + c], -30.0f, 20.0f);
      z.data()[r * L + c] = mean + std::exp(0.5f * logvar) * noise[r * L + c];
    }
  const Act rec = vae.decode(z, &dec);
  VaeLoss loss;
  const double n_pix = double(rec.numel()), n_lat = double(z.numel());
  Act drec(rec.n, rec.h, rec.w, rec.c);
  for (int64_t i = 0; i < rec.numel(); ++i) {
    const double d = double(rec.data()[i]) - images.data()[i];
    loss.reconstruction += d * d;
    drec.data()[i] = float(2.0 * d / n_pix);
  }
  loss.reconstruction /= n_pix;
  const Act dz = vae.decode_backward(*dec, drec);
  Act dmom(moments.n, moments.h, moments.w, 2 * L);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < L; ++c) {
      const double mean = moments.data()[r * 2 * L + c];
      const double raw = moments.data()[r * 2 * L + L + c];
      const double logvar = std::clamp(raw, -30.0, 20.0);
      const double var = std::exp(logvar);
      loss.kl += 0.5 * (mean * mean + var - 1.0 - logvar);
      const double g = dz.data()[r * L + c];
      dmom.data()[r * 2 * L + c] = float(g + kl_weight * mean / n_lat);
      // dz/dlogvar = 0.5 exp(logvar / 2) eps; the clamp passes no gradient outside it.
      const double inside = raw > -30.0 && raw < 20.0 ? 1.0 : 0.0;
      dmom.data()[r * 2 * L + L + c] =
          float(inside * (g * 0.5 * std::exp(0.5 * logvar) * noise[r * L + c] + kl_weight * 0.5 * (var - 1.0) / n_lat));
    }
  loss.kl /= n_lat;
  vae.encode_backward(*enc, dmom);
  loss.total = loss.reconstruction + kl_weight * loss.kl;
  return loss;
}

double denoising_loss(UNet& unet, const NoiseSchedule& schedule, const Act& latents,
                      const std::vector<int64_t>& timesteps, const float* noise, const float* context, int64_t tokens,
                      double snr_gamma, bool backward, const float* text_embeds, const float* time_ids) {
  HYP_CHECK(!unet.config().text_time || (text_embeds && time_ids),
            "denoising loss: an SDXL UNet (text_time) needs text_embeds and time_ids");
  const int64_t n = latents.n, per = latents.h * latents.w * latents.c;
  HYP_CHECK(int64_t(timesteps.size()) == n, "denoising loss: {} timesteps for {} latents", timesteps.size(), n);
  Act xt(latents.n, latents.h, latents.w, latents.c);
  FloatBuffer target(size_t(n * per));
  std::vector<float> t(static_cast<size_t>(n));
  std::vector<double> w(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    schedule.add_noise(latents.data() + i * per, noise + i * per, timesteps[size_t(i)], per, xt.data() + i * per);
    schedule.target(latents.data() + i * per, noise + i * per, timesteps[size_t(i)], per, target.data() + i * per);
    t[size_t(i)] = float(timesteps[size_t(i)]);
    w[size_t(i)] = schedule.min_snr_weight(timesteps[size_t(i)], snr_gamma);
  }
  std::shared_ptr<UNet::Tape> tape;
  const Act pred = unet.forward(xt, t.data(), context, tokens, text_embeds, time_ids, backward ? &tape : nullptr);
  double loss = 0;
  Act dpred;
  if (backward) dpred = Act(pred.n, pred.h, pred.w, pred.c);
  for (int64_t i = 0; i < n; ++i) {
    double s = 0;
    for (int64_t j = 0; j < per; ++j) {
      const double d = double(pred.data()[i * per + j]) - target[size_t(i * per + j)];
      s += d * d;
      if (backward) dpred.data()[i * per + j] = float(2.0 * w[size_t(i)] * d / double(n * per));
    }
    loss += w[size_t(i)] * s / double(per);
  }
  if (backward) unet.backward(*tape, dpred);
  return loss / double(n);
}

AdamWState::AdamWState(const ParamTable& params)
    : m_(size_t(params.size()), 0.0f), v_(size_t(params.size()), 0.0f) {}

double AdamWState::step(ParamTable& params, double lr, double beta1, double beta2, double eps, double weight_decay,
                        double clip) {
  double sq = 0;
  const float* g = params.all_grads();
  for (int64_t i = 0; i < params.size(); ++i) sq += double(g[i]) * g[i];
  const double norm = std::sqrt(sq);
  AdamWParams hp;
  hp.lr = float(lr);
  hp.beta1 = float(beta1);
  hp.beta2 = float(beta2);
  hp.eps = float(eps);
  hp.weight_decay = float(weight_decay);
  hp.step = ++t_;
  hp.grad_scale = clip > 0 && norm > clip ? float(clip / (norm + 1e-6)) : 1.0f;
  if (std::isfinite(norm)) {
    const int64_t n = params.size();
    adamw_step(TensorView(params.all(), DType::kF32, {n}), TensorView(params.all_grads(), DType::kF32, {n}),
               TensorView(m_.data(), DType::kF32, {n}), TensorView(v_.data(), DType::kF32, {n}), hp);
  }
  params.zero_grads();
  return norm;
}

ParamEma::ParamEma(const ParamTable& params) : shadow_(params.all(), params.all() + params.size()) {}

void ParamEma::update(const ParamTable& params, double decay) {
  ++updates_;
  const float d = float(std::min(decay, (1.0 + double(updates_)) / (10.0 + double(updates_))));
  const float* p = params.all();
  for (size_t i = 0; i < shadow_.size(); ++i) shadow_[i] = d * shadow_[i] + (1.0f - d) * p[i];
}

void ParamEma::copy_to(ParamTable& params) const {
  std::copy(shadow_.begin(), shadow_.end(), params.all());
}

}  // namespace hyperion::diffusion
