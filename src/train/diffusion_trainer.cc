#include "train/diffusion_trainer.h"

#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <random>

#include "base/error.h"
#include "base/log.h"
#include "base/timer.h"
#include "diffusion/image_dataset.h"
#include "diffusion/pipeline.h"
#include "diffusion/sd_tiny.h"
#include "diffusion/training.h"
#include "io/atomic_file.h"
#include "io/directory_lock.h"
#include "io/image_file.h"
#include "io/safetensors.h"
#include "kernels/fill.h"
#include "kernels/peak.h"
#include "train/checkpoint.h"
#include "train/diffusion_checkpoint.h"
#include "train/metrics_writer.h"
#include "train/run_directory.h"
#include "train/stop_signal.h"

namespace hyperion {

namespace fs = std::filesystem;
using diffusion::Act;

namespace {

// A batch of images [count, S, S, C] picked by index.
Act image_batch(const diffusion::ImageDataset& ds, const std::vector<int64_t>& idx) {
  const int64_t per = ds.resolution * ds.resolution * ds.channels;
  Act a(int64_t(idx.size()), ds.resolution, ds.resolution, ds.channels);
  for (size_t i = 0; i < idx.size(); ++i) std::copy(ds.image(idx[i]), ds.image(idx[i]) + per, a.data() + i * per);
  return a;
}

std::vector<int64_t> random_indices(std::mt19937_64& rng, int64_t count, int64_t n) {
  std::uniform_int_distribution<int64_t> pick(0, count - 1);
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t& v : out) v = pick(rng);
  return out;
}

// A 64-bit digest of floats (the latent cache's key): word-wise multiply-xor, fast enough
// for a VAE's weights or a dataset's pixels (hundreds of MB) in a fraction of a second.
uint64_t digest(const float* p, size_t n, uint64_t h) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i, 4);
    h = (h ^ bits) * 0x100000001b3ull;
    h ^= h >> 29;
  }
  return h;
}

double peak_rss_mib() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / 1024.0;
}

}  // namespace

TrainResult run_diffusion_training(const Config& config, const TrainConfig& t, const TrainOptions& options,
                                   dist::Communicator& comm, double process_start) {
  const diffusion::DiffusionTrainConfig& d = t.diffusion;
  // Data parallel: every rank holds the whole model (the same initial weights, from the
  // same seed or directory) and draws the same global batch (world x per_device_batch_size
  // images, timesteps, caption drops and noise, from one seed), of which it computes its
  // own slice; the gradients are averaged over the ranks before each optimizer step. So
  // the weights stay identical across ranks, and N ranks train as one process with N
  // times the batch does. Rank 0 writes the run directory.
  // The language-model keys the diffusion models do not honour yet, refused when a config
  // or the command line sets them (their defaults are the language models'; a resumed
  // run's saved config repeats them and is accepted as it was).
  auto set_here = [&](const char* key) {
    const std::string& src = config.source_of(key);
    return src != "default" && src.find("trainer_state.json") == std::string::npos;
  };
  HYP_USAGE_CHECK(t.hardware == Device::kHost,
                  "config key hardware={} ({}): diffusion training runs on the CPU (hardware=cpu); generation "
                  "and serving run on a GPU (generate --hardware gpu, serve hardware=gpu)",
                  config.get_string("hardware"), config.source_of("hardware"));
  // dtype: float32 unless set here; bfloat16 is mixed precision (the UNet's convolutions and
  // linear layers in bf16 with f32 accumulation, f32 master weights, optimizer and
  // gradients; the frozen VAE and text encoder fill the cache in f32). The language
  // models' default (bfloat16) is not the diffusion models' one: a run asks for it.
  // remat_policy: none keeps every activation of a step; full keeps each UNet block's
  // input only and recomputes the rest in the backward pass. (The language models' default,
  // minimal, means none here; set explicitly it is refused.)
  HYP_USAGE_CHECK(!set_here("remat_policy") || t.remat != RematPolicy::kMinimal,
                  "config key remat_policy=minimal ({}): a diffusion UNet takes none (keep every activation) or "
                  "full (recompute each block in the backward pass)",
                  config.source_of("remat_policy"));
  HYP_USAGE_CHECK(!set_here("quantization") || config.get_string("quantization").empty(),
                  "config key quantization={} ({}): quantized training applies to language models",
                  config.get_string("quantization"), config.source_of("quantization"));
  const int rank = comm.rank(), world = comm.world_size();
  const Timer total;
  std::optional<io::DirectoryLock> lock;
  TrainResult result;
  result.run_dir = open_run_directory(t, options.resume, comm, lock);
  // Resume: --resume, or the run directory's latest checkpoint (a run started again).
  std::optional<std::string> from;
  if (!options.resume.empty())
    from = resolve_checkpoint_dir(options.resume);
  else if (t.enable_checkpointing)
    from = latest_checkpoint(result.run_dir);
  std::optional<MetricsWriter> metrics;
  StopSignalScope stop_signals;
  std::mt19937_64 rng(t.data_shuffle_seed ^ 0x5eedull);
  // Gradients averaged over the ranks; a stop signal on any rank stops them all at the
  // same step (a rank leaving alone would hang the others in the next all-reduce).
  auto average_grads = [&](diffusion::ParamTable& p) {
    if (world > 1) comm.all_reduce(p.all_grads(), size_t(p.size()), dist::ReduceOp::kAvg);
  };
  auto any_stop = [&] {
    float stop = stop_signal_received() ? 1.0f : 0.0f;
    if (world > 1) comm.all_reduce(&stop, 1, dist::ReduceOp::kMax);
    return stop > 0;
  };
  if (world > 1) log_info("data parallel over {} ranks: {} images per rank per step", world, t.per_device_batch_size);

  // Model: sd-tiny from scratch or a diffusers directory.
  // A resumed run takes everything from its checkpoint: the trained VAE (its
  // scaling_factor) and text encoder, and the UNet (its training weights below).
  std::unique_ptr<diffusion::DiffusionPipeline> pipe =
      from                   ? diffusion::DiffusionPipeline::load(*from)
      : d.pretrained.empty() ? diffusion::make_sd_tiny(t.init_weights_seed)
                             : diffusion::DiffusionPipeline::load(d.pretrained);
  auto& vae = const_cast<diffusion::Vae&>(pipe->vae());
  auto& unet = const_cast<diffusion::UNet&>(pipe->unet());
  const int64_t multiple = vae.config().downscale();
  HYP_CHECK(d.resolution % multiple == 0, "config key diffusion.resolution = {} must be a multiple of {} for this model",
            d.resolution, multiple);

  // Data.
  const bool fmnist = d.dataset == "fashion-mnist";
  diffusion::ImageDataset train, held_out;
  if (fmnist) {
    train = diffusion::load_fashion_mnist(diffusion::kFashionMnistDir, "train", d.resolution, d.max_images);
    held_out = diffusion::load_fashion_mnist(diffusion::kFashionMnistDir, "test", d.resolution, 256);
  } else {
    diffusion::ImageFolderOptions o;
    o.resolution = d.resolution;
    o.limit = d.max_images;
    // Gray or RGB, as the VAE takes them (sd-tiny's is gray).
    HYP_CHECK(vae.config().in_channels == 1 || vae.config().in_channels == 3,
              "the VAE takes {} channels; image folders give 1 (gray) or 3 (RGB)", vae.config().in_channels);
    o.channels = vae.config().in_channels;
    train = diffusion::load_image_folder(d.dataset, o);
    held_out = train;  // a small fine-tuning set has no separate split
  }
  HYP_CHECK(vae.config().in_channels == train.channels,
            "the VAE takes {} channels, the images have {} (Fashion-MNIST is gray: a pretrained RGB VAE needs an "
            "image folder)",
            vae.config().in_channels, train.channels);
  log_info("data: {} training images ({}x{}x{}), {} held out", train.count(), d.resolution, d.resolution,
           train.channels, held_out.count());

  const int64_t batch = t.per_device_batch_size;

  // 1. The VAE (done already in a resumed run).
  const bool train_vae = d.vae_steps > 0 && !from;
  if (train_vae) {
    vae.params().set_grads(true);
    diffusion::AdamWState opt(vae.params());
    const int64_t lat = d.resolution / vae.config().downscale() * (d.resolution / vae.config().downscale()) *
                        vae.config().latent_channels;
    std::vector<float> noise(size_t(batch * world * lat));
    for (int64_t s = 0; s < d.vae_steps && !any_stop(); ++s) {
      const Timer step_timer;
      const std::vector<int64_t> all = random_indices(rng, train.count(), batch * world);
      const Act images =
          image_batch(train, std::vector<int64_t>(all.begin() + rank * batch, all.begin() + (rank + 1) * batch));
      fill_normal(TensorView(noise.data(), DType::kF32, {int64_t(noise.size())}), rng(), 0.0f, 1.0f);
      const diffusion::VaeLoss l =
          diffusion::vae_loss_backward(vae, images, noise.data() + rank * batch * lat, d.kl_weight);
      average_grads(vae.params());
      const double lr = d.vae_learning_rate * std::min(1.0, double(s + 1) / 50.0);
      const double norm = opt.step(vae.params(), lr, t.adam_b1, t.adam_b2, t.adam_eps, 0.0, t.gradient_clipping_threshold);
      if (!options.quiet && ((s + 1) % t.log_period == 0 || s == 0))
        log_info("vae   step {:>5}/{}  reconstruction {:.5f}  kl {:.3f}  grad_norm {:.3f}  {:.3f} s", s + 1,
                 d.vae_steps, l.reconstruction, l.kl, norm, step_timer.seconds());
    }
  }
  // 2. Latents and text embeddings, computed once (the VAE and text encoder are frozen
  // from here on).
  const std::string cache_dir = d.dataset_save_location.empty() ? result.run_dir + "/dataset_cache" : d.dataset_save_location;
  fs::create_directories(cache_dir);
  auto encode_all = [&](const diffusion::ImageDataset& ds, uint64_t seed) {
    const int64_t f = vae.config().downscale(), L = vae.config().latent_channels;
    const int64_t h = ds.resolution / f, per = h * h * L;
    Act all(ds.count(), h, h, L);
    std::vector<float> noise(size_t(64 * per));
    for (int64_t b = 0; b < ds.count(); b += 64) {
      std::vector<int64_t> idx;
      for (int64_t i = b; i < std::min(ds.count(), b + 64); ++i) idx.push_back(i);
      fill_normal(TensorView(noise.data(), DType::kF32, {int64_t(noise.size())}), seed + uint64_t(b), 0.0f, 1.0f);
      const Act z = vae.encode_latents(image_batch(ds, idx), noise.data());
      std::copy(z.v.begin(), z.v.end(), all.data() + b * per);
    }
    return all;
  };
  if (train_vae) {
    // scaling_factor = 1 / std of the unscaled latents (as SD's 0.18215 was chosen).
    auto& cfg = const_cast<diffusion::VaeConfig&>(vae.config());
    cfg.scaling_factor = 1.0;
    cfg.shift_factor = 0.0;
    diffusion::ImageDataset probe = train;
    const int64_t n_probe = std::min<int64_t>(train.count(), 1024);
    probe.pixels.resize(size_t(n_probe * train.resolution * train.resolution * train.channels));
    probe.captions.resize(size_t(n_probe));
    probe.labels.resize(size_t(n_probe));
    const Act z = encode_all(probe, 1);
    double sum = 0, sq = 0;
    for (float v : z.v) {
      sum += v;
      sq += double(v) * v;
    }
    const double mean = sum / double(z.numel()), var = sq / double(z.numel()) - mean * mean;
    cfg.scaling_factor = 1.0 / std::sqrt(std::max(var, 1e-12));
    log_info("vae   latents std {:.4f}: scaling_factor {:.5f}", std::sqrt(var), cfg.scaling_factor);
  }
  vae.params().set_grads(false);
  const Timer encode_timer;
  // The latents are cached (MaxDiffusion's dataset_save_location) under a key of what
  // they are made from: the decoded pixels, the VAE's weights and scaling, the noise seed;
  // a later run (a resumed one, another fine-tune of the same VAE on the same images) reads
  // them back instead of encoding again.
  const uint64_t vae_key = digest(vae.params().all(), size_t(vae.params().size()),
                                  std::hash<std::string>{}(fmt::format("{}/{}", vae.config().scaling_factor,
                                                                       vae.config().shift_factor)));
  auto cached_latents = [&](const diffusion::ImageDataset& ds, uint64_t seed, const char* what) {
    const uint64_t key = digest(ds.pixels.data(), ds.pixels.size(), vae_key ^ (seed * 0x9e3779b97f4a7c15ull));
    const std::string path = fmt::format("{}/latents-{}-{:016x}.safetensors", cache_dir, what, key);
    const int64_t f = vae.config().downscale(), h = ds.resolution / f, L = vae.config().latent_channels;
    if (fs::exists(path)) {
      try {
        const io::SafetensorsFile file = io::SafetensorsFile::open(path);
        Act z(ds.count(), h, h, L);
        file.read_into("latents", TensorView(z.data(), DType::kF32, {z.n, z.h, z.w, z.c}));
        log_info("cache: {} latents read from {}", z.n, path);
        return z;
      } catch (const std::exception& e) {
        log_warn("cache: {} cannot be used ({}); encoding again", path, e.what());
      }
    }
    Act z = encode_all(ds, seed);
    if (rank == 0) {
      io::SafetensorsWriter w;
      w.add("latents", DType::kF32, {z.n, z.h, z.w, z.c}, z.data());
      w.write(path);
    }
    return z;
  };
  const Act latents = cached_latents(train, 2, "train"), held_latents = cached_latents(held_out, 3, "held-out");
  // caption -> context [tokens, d] (and SDXL's pooled embedding [pooled_dim])
  std::map<std::string, diffusion::DiffusionPipeline::Conditioning> text;
  int64_t tokens = 0;
  auto context_of = [&](const std::string& caption) -> const diffusion::DiffusionPipeline::Conditioning& {
    auto it = text.find(caption);
    if (it == text.end()) {
      auto c = pipe->encode_prompt(caption, false);
      tokens = c.tokens;
      it = text.emplace(caption, std::move(c)).first;
    }
    return it->second;
  };
  const int64_t pooled_dim = int64_t(context_of("").pooled.size());
  for (const std::string& cap : train.captions) context_of(cap);
  // SDXL's size and crop conditioning (original size, crop top-left, target size): the
  // images are resized and center-cropped to the resolution, and conditioned as generation
  // conditions them by default, uncropped at that size.
  const std::vector<float> image_time_ids = {float(d.resolution), float(d.resolution), 0.0f, 0.0f,
                                             float(d.resolution), float(d.resolution)};
  auto sdxl_rows = [&](const diffusion::DiffusionPipeline::Conditioning& c, int64_t row, std::vector<float>& pooled,
                       std::vector<float>& time_ids) {
    if (pooled_dim == 0) return;
    std::copy(c.pooled.begin(), c.pooled.end(), pooled.begin() + row * pooled_dim);
    std::copy(image_time_ids.begin(), image_time_ids.end(), time_ids.begin() + row * 6);
  };
  log_info("cache: {} latents and {} caption embeddings in {:.1f} s ({})", latents.n, text.size(),
           encode_timer.seconds(), cache_dir);

  // 3. The UNet.
  unet.params().set_grads(true);
  unet.set_remat(t.remat == RematPolicy::kFull);
  diffusion::AdamWState opt(unet.params());
  diffusion::ParamEma ema(unet.params());
  DiffusionTrainingState state{&opt, d.ema_decay > 0 ? &ema : nullptr, &rng, 0};
  state.bf16 = set_here("dtype") && t.bf16;
  if (from) {
    restore_diffusion_checkpoint(*from, *pipe, state);  // the run's own dtype, unless set here
    if (set_here("dtype")) state.bf16 = t.bf16;
    log_info("resume: from {} at step {}", *from, state.step);
  }
  unet.params().set_bf16_compute(state.bf16);
  if (state.bf16) log_info("dtype: bfloat16 mixed precision (f32 master weights, gradients and optimizer)");
  const int64_t start = state.step;
  bool stopped_early = false;
  result.start_step = start;
  result.steps = start;
  metrics.emplace(result.run_dir, rank == 0, start);
  int64_t saved_step = from ? start : -1;
  auto save = [&](int64_t step) {
    state.step = step;
    if (rank == 0) save_diffusion_checkpoint(result.run_dir, config, *pipe, state, t.checkpoints_to_keep);
    saved_step = step;
  };
  LrSchedule schedule = t.schedule;
  schedule.total_steps = t.steps;
  const int64_t per = latents.h * latents.w * latents.c, ctx_dim = unet.config().cross_attention_dim;
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int64_t> pick_t(0, pipe->schedule().train_timesteps - 1);
  // Held-out loss: fixed images, timesteps and noise, so the curve is comparable.
  const int64_t n_eval = std::min<int64_t>(held_latents.n, 128);
  std::vector<int64_t> eval_t(static_cast<size_t>(n_eval));
  std::vector<float> eval_noise(size_t(n_eval * per)), eval_ctx(size_t(n_eval * tokens * ctx_dim)),
      eval_pooled(size_t(n_eval * pooled_dim)), eval_time_ids(pooled_dim ? size_t(n_eval * 6) : 0);
  {
    std::mt19937_64 erng(7);
    for (int64_t& v : eval_t) v = std::uniform_int_distribution<int64_t>(0, pipe->schedule().train_timesteps - 1)(erng);
    fill_normal(TensorView(eval_noise.data(), DType::kF32, {int64_t(eval_noise.size())}), 8, 0.0f, 1.0f);
    for (int64_t i = 0; i < n_eval; ++i) {
      const auto& c = context_of(held_out.captions[size_t(i)]);
      std::copy(c.context.begin(), c.context.end(), eval_ctx.begin() + i * tokens * ctx_dim);
      sdxl_rows(c, i, eval_pooled, eval_time_ids);
    }
  }
  Act eval_x(n_eval, held_latents.h, held_latents.w, held_latents.c);
  std::copy(held_latents.data(), held_latents.data() + n_eval * per, eval_x.data());
  auto held_out_loss = [&] {
    double sum = 0;
    for (int64_t b = 0; b < n_eval; b += 32) {
      const int64_t m = std::min<int64_t>(32, n_eval - b);
      Act x(m, eval_x.h, eval_x.w, eval_x.c);
      std::copy(eval_x.data() + b * per, eval_x.data() + (b + m) * per, x.data());
      const std::vector<int64_t> ts(eval_t.begin() + b, eval_t.begin() + b + m);
      sum += double(m) * diffusion::denoising_loss(unet, pipe->schedule(), x, ts, eval_noise.data() + b * per,
                                                   eval_ctx.data() + b * tokens * ctx_dim, tokens, 0.0, false,
                                                   pooled_dim ? eval_pooled.data() + b * pooled_dim : nullptr,
                                                   pooled_dim ? eval_time_ids.data() + b * 6 : nullptr);
    }
    return sum / double(n_eval);
  };
  std::vector<float> noise(size_t(batch * world * per)), ctx(size_t(batch * tokens * ctx_dim)),
      pooled(size_t(batch * pooled_dim)), time_ids(pooled_dim ? size_t(batch * 6) : 0);
  double samples_per_s_sum = 0, mfu_sum = 0;
  int64_t timed = 0;
  const double peak = state.bf16 ? cached_peak().bf16_gflops : cached_peak().f32_gflops;
  result.peak_gflops = result.peak_bf16_gflops = peak;
  for (int64_t s = start; s < t.steps; ++s) {
    if (any_stop()) {
      result.stopped_by_signal = true;
      break;
    }
    const Timer step_timer;
    const int64_t macs_before = diffusion::layer_macs();
    // The global batch's draws, in one order on every rank; this rank's slice kept.
    const std::vector<int64_t> idx = random_indices(rng, latents.n, batch * world);
    Act x(batch, latents.h, latents.w, latents.c);
    std::vector<int64_t> ts(static_cast<size_t>(batch));
    for (int64_t g = 0; g < batch * world; ++g) {
      const int64_t timestep = pick_t(rng);
      const bool drop = unit(rng) < d.caption_dropout;
      const int64_t i = g - rank * batch;
      if (i < 0 || i >= batch) continue;
      const int64_t img = idx[size_t(g)];
      std::copy(latents.data() + img * per, latents.data() + (img + 1) * per, x.data() + i * per);
      ts[size_t(i)] = timestep;
      const auto& c = context_of(drop ? std::string() : train.captions[size_t(img)]);
      std::copy(c.context.begin(), c.context.end(), ctx.begin() + i * tokens * ctx_dim);
      sdxl_rows(c, i, pooled, time_ids);
    }
    fill_normal(TensorView(noise.data(), DType::kF32, {int64_t(noise.size())}), rng(), 0.0f, 1.0f);
    double loss = diffusion::denoising_loss(unet, pipe->schedule(), x, ts, noise.data() + rank * batch * per,
                                            ctx.data(), tokens, d.snr_gamma, true,
                                            pooled_dim ? pooled.data() : nullptr, pooled_dim ? time_ids.data() : nullptr);
    average_grads(unet.params());
    if (world > 1) {
      float l = float(loss);
      comm.all_reduce(&l, 1, dist::ReduceOp::kAvg);
      loss = l;
    }
    const double lr = schedule.lr(s);
    const double norm = opt.step(unet.params(), lr, t.adam_b1, t.adam_b2, t.adam_eps, t.weight_decay,
                                 t.gradient_clipping_threshold);
    if (d.ema_decay > 0) ema.update(unet.params(), d.ema_decay);
    StepMetrics m;
    m.step = s + 1;
    m.loss = m.lm_loss = loss;
    m.grad_norm = norm;
    m.lr = lr;
    m.step_s = step_timer.seconds();
    m.samples_per_s = m.tokens_per_s = double(batch * world) / m.step_s;
    // FLOPs of the step's convolutions, linear layers and attention (forward and backward).
    m.tflops = 2.0 * double(diffusion::layer_macs() - macs_before) / m.step_s / 1e12;
    m.mfu = m.emfu = m.tflops * 1e3 / peak;
    if (s > 0) {
      samples_per_s_sum += m.samples_per_s;
      mfu_sum += m.mfu;
      ++timed;
    }
    const bool eval = (t.eval_interval > 0 && (s + 1) % t.eval_interval == 0) || s + 1 == t.steps;
    if (eval) {
      m.eval_loss = held_out_loss();
      result.eval_loss = m.eval_loss;
      result.eval_tokens = n_eval;
    }
    metrics->write(m, (s + 1) * batch * world, false, false);
    result.history.push_back(m);
    if (!options.quiet && ((s + 1) % t.log_period == 0 || s == 0 || eval))
      log_info("unet  step {:>5}/{}  loss {:.4f}  grad_norm {:.3f}  lr {:.2e}  {:.0f} images/s{}", s + 1, t.steps,
               loss, norm, lr, m.samples_per_s, eval ? fmt::format("  held-out {:.4f}", m.eval_loss) : "");
    result.steps = s + 1;
    if (t.enable_checkpointing && t.checkpoint_period > 0 && (s + 1) % t.checkpoint_period == 0 && s + 1 < t.steps)
      save(s + 1);
    if (options.stop_at > 0 && s + 1 >= options.stop_at && s + 1 < t.steps) {
      log_info("stopping after step {} (--stop-at); resume with: hyperion train --resume {}", s + 1, result.run_dir);
      stopped_early = true;  // as if interrupted: no samples
      break;
    }
  }

  // 4. The checkpoint: a diffusers directory with the EMA UNet, and the state to resume.
  const std::string ckpt = result.run_dir + "/checkpoints/" + std::to_string(result.steps);
  result.checkpoint = ckpt;
  if (saved_step != result.steps) save(result.steps);
  if (rank == 0)
    log_info("saved {} (a diffusers directory: hyperion generate --checkpoint {} ...)", ckpt, ckpt);
  if (d.ema_decay > 0 && result.steps > 0) ema.copy_to(unet.params());  // the samples use the EMA
  pipe->set_compute_dtype(state.bf16 ? DType::kBF16 : DType::kF32);  // and the run's dtype
  if (rank == 0 && fmnist && d.samples_per_class > 0 && !result.stopped_by_signal && !stopped_early) {
    // One row per class, samples_per_class seeds each.
    const int64_t S = pipe->default_size(), k = d.samples_per_class;
    const auto& classes = diffusion::fashion_mnist_classes();
    io::Image grid;
    grid.width = k * S;
    grid.height = int64_t(classes.size()) * S;
    grid.channels = 1;
    grid.pixels.assign(grid.bytes(), 0);
    for (size_t c = 0; c < classes.size(); ++c) {
      diffusion::ImageRequest r;
      r.prompt = diffusion::fashion_mnist_caption(int32_t(c));
      r.steps = d.sample_steps;
      r.guidance = d.sample_guidance;
      r.sampler = "ddim";
      r.seed = 1000 + c;
      r.count = k;
      const diffusion::GeneratedImages g = pipe->generate(r);
      for (int64_t i = 0; i < k; ++i) {
        const io::Image img = diffusion::to_image(g.pixels.data() + i * S * S, S, S, 1);
        for (int64_t y = 0; y < S; ++y)
          std::copy(img.pixels.begin() + y * S, img.pixels.begin() + (y + 1) * S,
                    grid.pixels.begin() + (int64_t(c) * S + y) * grid.width + i * S);
      }
    }
    io::write_png(result.run_dir + "/samples.png", grid);
    log_info("samples: {} ({} classes x {} seeds, {} DDIM steps, guidance {})", result.run_dir + "/samples.png",
             classes.size(), k, d.sample_steps, d.sample_guidance);
  }
  result.seconds = total.seconds();
  result.mean_samples_per_s = timed > 0 ? samples_per_s_sum / double(timed) : 0;
  result.mean_mfu = result.mean_emfu = timed > 0 ? mfu_sum / double(timed) : 0;
  result.peak_rss_mib = peak_rss_mib();
  (void)process_start;
  return result;
}

}  // namespace hyperion
