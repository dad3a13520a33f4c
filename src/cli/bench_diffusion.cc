// `hyperion bench diffusion`: one UNet call (a denoising step) of a Stable Diffusion-shaped
// model with random weights, timed, as achieved FLOP/s and a ratio to the machine's f32 peak.
#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <functional>

#include "base/cpu.h"
#include "base/error.h"
#include "base/threads.h"
#include "base/timer.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "diffusion/architectures.h"
#include "diffusion/buffer_pool.h"
#include "diffusion/noise_schedule.h"
#include "diffusion/training.h"
#include "diffusion/single_file.h"
#include "kernels/backend.h"
#include "kernels/fill.h"
#include "kernels/hardware.h"
#include "kernels/peak.h"

namespace hyperion::cli {

const CommandSpec kBenchDiffusionSpec = {
    "bench diffusion",
    "",
    "time one UNet denoising step of a Stable Diffusion-shaped model (random weights) against the machine's peak",
    {{"model", "NAME", "sd15 (default), sd21, sdxl or sd-tiny"},
     {"size", "PX", "image side in pixels (default: the model's; latents are 1/8 of it, sd-tiny 1/4)"},
     {"batch", "N", "UNet batch (default 2: one image with classifier-free guidance)"},
     {"iterations", "N", "timed calls after one warm-up (default 3)"},
     {"image", "", "time a whole image instead (sd15, sd21): text encoding, --steps UNet steps with guidance, VAE decoding; with peak memory against the weights and the activations' high-water mark"},
     {"steps", "N", "--image: denoising steps (default 20)"},
     {"train", "", "time a training step instead: the denoising loss, the UNet's forward and backward, with the activations' high-water mark"},
     {"remat", "", "--train: with remat_policy=full (each block recomputed in the backward pass)"},
     {"save", "DIR", "write the random-weight pipeline (sd15, sd21) as a diffusers directory and stop (to serve it, or time it with bench images)"},
     {"save-single-file", "FILE", "write it (sd15) as one SD 1.x original-layout safetensors file and stop (to time a peer on the same weights)"},
     {"dtype", "T",
      "float32 (default) or bfloat16: mixed precision, the convolutions and linear layers in bf16 with f32 "
      "accumulation"},
     {"hardware", "H",
      "cpu (default) or gpu: where the models run (a UNet step, or --image); on a GPU the ratio is to its "
      "measured cuBLASLt matmul rate"},
     {"json", "", "print the figures as one JSON object"}},
    "FLOP/s count the multiply-adds of the convolutions, linear layers and attention products "
    "(2 FLOPs each); the ratio is to `hyperion bench peak`'s f32 figure (and, with --dtype "
    "bfloat16, to its bf16 figure as well).",
    "bench diffusion --model sd15 --iterations 2 --json"};

int cmd_bench_diffusion(const Args& args) {
  const Flags f(kBenchDiffusionSpec, args);
  HYP_USAGE_CHECK(f.positional().empty(), "bench diffusion: unexpected argument '{}'", f.positional()[0]);
  const std::string model = f.get("model", "sd15");
  const diffusion::UNetConfig config = diffusion::unet_preset(model);
  const int64_t factor = model == "sd-tiny" ? 4 : 8;
  const int64_t size = f.integer("size", config.sample_size * factor);
  const int64_t batch = f.integer("batch", 2), iterations = f.integer("iterations", 3);
  const int64_t multiple = factor;
  HYP_USAGE_CHECK(size >= multiple && size <= 2048 && size % multiple == 0,
                  "bench diffusion: --size {} must be a multiple of {} in [{}, 2048]", size, multiple, multiple);
  HYP_USAGE_CHECK(batch >= 1 && batch <= 64, "bench diffusion: --batch must be in [1, 64]");
  HYP_USAGE_CHECK(iterations >= 1 && iterations <= 1000, "bench diffusion: --iterations must be in [1, 1000]");
  const bool json = f.has("json");
  const std::string dtype = f.get("dtype", "float32");
  HYP_USAGE_CHECK(dtype == "float32" || dtype == "bfloat16",
                  "bench diffusion: --dtype must be float32 or bfloat16, got '{}'", dtype);
  const bool mixed = dtype == "bfloat16";
  const std::string hw = f.get("hardware", "cpu");
  HYP_USAGE_CHECK(hw == "cpu" || hw == "gpu", "bench diffusion: --hardware must be cpu or gpu, got '{}'", hw);
  const Device device = parse_hardware(hw, "bench diffusion: --hardware");
  HYP_USAGE_CHECK(device == Device::kHost || !f.has("train"),
                  "bench diffusion: --train runs on the CPU (diffusion training is not on the GPU yet)");
  require_hardware(device, "bench diffusion: --hardware");
  HYP_USAGE_CHECK(!mixed || (!f.has("save") && !f.has("save-single-file")),
                  "bench diffusion: --dtype applies to timings; --save writes the f32 weights");
  if (f.has("save") || f.has("save-single-file")) {
    const auto pipe = diffusion::random_pipeline(model, 1);
    if (f.has("save")) {
      pipe->save(f.get("save"));
      std::printf("%s\n", f.get("save").c_str());
    }
    if (f.has("save-single-file")) {
      diffusion::save_single_file(*pipe, f.get("save-single-file"));
      std::printf("%s\n", f.get("save-single-file").c_str());
    }
    return 0;
  }
  if (f.has("image")) {
    const int64_t steps = f.integer("steps", 20);
    HYP_USAGE_CHECK(steps >= 1 && steps <= 1000, "bench diffusion: --steps must be in [1, 1000]");
    const auto pipe = diffusion::random_pipeline(model, 1);
    pipe->to_device(device);
    pipe->set_compute_dtype(mixed ? DType::kBF16 : DType::kF32);
    // The f32 weights, and under mixed precision the bf16 copy of the matmul weights.
    double weights_gb = 0;
    for (const diffusion::ParamTable* p :
         {&pipe->unet().params(), &pipe->vae().params(), &pipe->text_encoder().params()})
      weights_gb += (double(p->size()) * 4 + (mixed ? double(p->bf16_size()) * 2 : 0.0)) / 1e9;
    diffusion::ImageRequest r;
    r.prompt = "a photo of an astronaut riding a horse";
    r.width = r.height = size;
    r.steps = steps;
    r.sampler = "dpm++2m";
    r.guidance = 7.5;
    diffusion::reset_peak_live_bytes();
    const Timer timer;
    const diffusion::GeneratedImages g = pipe->generate(r);
    const double seconds = timer.seconds();
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    const double rss_gb = double(ru.ru_maxrss) / (1 << 20) * 1.073741824;  // GiB -> GB
    const double act_gb = double(diffusion::peak_live_bytes()) / 1e9;
    const double bound = 1.3 * (weights_gb + act_gb);
    if (json) {
      nlohmann::ordered_json j = {{"model", model}, {"size", size}, {"steps", steps}, {"dtype", dtype},
                                  {"hardware", hw}, {"threads", num_threads()},
                                  {"cpu", cpu_features().model_name}, {"seconds", seconds},
                                  {"encode_seconds", g.encode_seconds}, {"denoise_seconds", g.denoise_seconds},
                                  {"decode_seconds", g.decode_seconds}, {"weights_gb", weights_gb},
                                  {"activations_peak_gb", act_gb}, {"max_rss_gb", rss_gb},
                                  {"rss_bound_gb", bound}, {"within_bound", rss_gb <= bound}};
      print_json(j, 2);
      return 0;
    }
    std::printf("%s, one %lldx%lld image, %lld dpm++2m steps with guidance (UNet batch 2), %s, %s, %d threads (%s)\n",
                model.c_str(), (long long)size, (long long)size, (long long)steps, dtype.c_str(), hw.c_str(),
                num_threads(), cpu_summary().c_str());
    std::printf("%.1f s: text %.2f s, denoising %.1f s (%.2f s/step), VAE decode %.1f s\n", seconds, g.encode_seconds,
                g.denoise_seconds, g.denoise_seconds / double(steps), g.decode_seconds);
    std::printf("memory: weights %.2f GB + activations' high-water %.2f GB; peak resident %.2f GB (bound 1.3x: %.2f GB, %s)\n",
                weights_gb, act_gb, rss_gb, bound, rss_gb <= bound ? "within" : "OVER");
    return 0;
  }

  diffusion::UNet unet(config);
  unet.params().allocate(f.has("train"));
  unet.params().init(1);
  unet.params().set_bf16_compute(mixed);
  const int64_t latent = size / factor;
  const double weights_gb =
      (double(unet.params().size()) * 4 + (mixed ? double(unet.params().bf16_size()) * 2 : 0.0)) / 1e9;
  // The figures every UNet timing reports beside its own (the peak measured after the
  // timing, as the f32 one is: measured first, on a cold thread pool, it reads low).
  auto precision_json = [&](nlohmann::ordered_json& j, double gflops) {
    j["dtype"] = dtype;
    if (mixed) {
      j["bf16_peak_gflops"] = cached_peak().bf16_gflops;
      j["fraction_of_bf16_peak"] = gflops / cached_peak().bf16_gflops;
    }
  };
  auto precision_text = [&](double gflops) {
    if (mixed)
      std::printf("bf16 mixed precision: %.2f of the bf16 peak (%.1f)\n", gflops / cached_peak().bf16_gflops,
                  cached_peak().bf16_gflops);
  };
  if (f.has("train")) {
    unet.set_remat(f.has("remat"));
    diffusion::Act x0(batch, latent, latent, config.in_channels);
    fill_normal(TensorView(x0.data(), DType::kF32, {x0.numel()}), 2, 0.0f, 1.0f);
    std::vector<float> noise(size_t(x0.numel())), ctx(size_t(batch * 77 * config.cross_attention_dim));
    fill_normal(TensorView(noise.data(), DType::kF32, {int64_t(noise.size())}), 4, 0.0f, 1.0f);
    fill_normal(TensorView(ctx.data(), DType::kF32, {int64_t(ctx.size())}), 3, 0.0f, 1.0f);
    std::vector<int64_t> ts(static_cast<size_t>(batch));
    for (int64_t i = 0; i < batch; ++i) ts[size_t(i)] = 100 + 800 * i / std::max<int64_t>(1, batch);
    const diffusion::NoiseSchedule schedule = diffusion::NoiseSchedule::stable_diffusion();
    std::vector<float> pooled, time_ids;  // SDXL's text_time inputs
    if (config.text_time) {
      pooled.assign(size_t(batch * (config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim)),
                    0.1f);
      for (int64_t i = 0; i < batch; ++i)
        for (float v : {float(size), float(size), 0.0f, 0.0f, float(size), float(size)}) time_ids.push_back(v);
    }
    auto train_step = [&] {
      return diffusion::denoising_loss(unet, schedule, x0, ts, noise.data(), ctx.data(), 77, 5.0, true,
                                       pooled.empty() ? nullptr : pooled.data(),
                                       time_ids.empty() ? nullptr : time_ids.data());
    };
    train_step();  // warm-up
    diffusion::reset_layer_macs();
    diffusion::reset_peak_live_bytes();
    std::vector<double> times;
    for (int64_t i = 0; i < iterations; ++i) {
      const Timer timer;
      train_step();
      times.push_back(timer.seconds());
    }
    const double macs = double(diffusion::layer_macs()) / double(iterations);
    const double act_gb = double(diffusion::peak_live_bytes()) / 1e9;
    std::sort(times.begin(), times.end());
    const double gflops = 2.0 * macs / times.front() / 1e9, peak = cached_peak().f32_gflops;
    const double grads_gb = double(unet.params().size()) * 4 / 1e9;
    if (json) {
      nlohmann::ordered_json j = {{"model", model}, {"size", size}, {"latent", latent}, {"batch", batch},
                                  {"remat", f.has("remat")}, {"threads", num_threads()},
                                  {"cpu", cpu_features().model_name}, {"gflop_per_step", 2 * macs / 1e9},
                                  {"best_seconds", times.front()}, {"gflops", gflops}, {"f32_peak_gflops", peak},
                                  {"fraction_of_peak", gflops / peak}, {"activations_peak_gb", act_gb},
                                  {"weights_gb", weights_gb}, {"grads_gb", grads_gb}};
      precision_json(j, gflops);
      print_json(j, 2);
      return 0;
    }
    std::printf("%s UNet training step, %lldx%lld latents, batch %lld, remat %s, %d threads (%s)\n", model.c_str(),
                (long long)latent, (long long)latent, (long long)batch, f.has("remat") ? "full" : "none", num_threads(),
                cpu_summary().c_str());
    std::printf("%.1f GFLOP per step (forward, backward%s): best %.3f s; %.1f GFLOP/s = %.2f of the f32 peak\n",
                2 * macs / 1e9, f.has("remat") ? ", recomputation" : "", times.front(), gflops, gflops / peak);
    precision_text(gflops);
    std::printf("activations' high-water %.2f GB beside %.2f GB of weights and %.2f GB of gradients\n", act_gb,
                weights_gb, grads_gb);
    return 0;
  }
  diffusion::Act x(batch, latent, latent, config.in_channels);
  fill_normal(TensorView(x.data(), DType::kF32, {x.numel()}), 2, 0.0f, 1.0f);
  const int64_t tokens = 77;
  std::vector<float> ctx(size_t(batch * tokens * config.cross_attention_dim)), t(size_t(batch), 500.0f);
  fill_normal(TensorView(ctx.data(), DType::kF32, {int64_t(ctx.size())}), 3, 0.0f, 1.0f);
  std::vector<float> pooled, time_ids;
  if (config.text_time) {
    pooled.assign(size_t(batch * (config.projection_class_embeddings_input_dim - 6 * config.addition_time_embed_dim)), 0.1f);
    for (int64_t i = 0; i < batch; ++i)
      for (float v : {float(size), float(size), 0.0f, 0.0f, float(size), float(size)}) time_ids.push_back(v);
  }
  auto call = [&] {
    return unet.forward(x, t.data(), ctx.data(), tokens, pooled.empty() ? nullptr : pooled.data(),
                        time_ids.empty() ? nullptr : time_ids.data());
  };
  std::function<diffusion::Act()> run = call;
  // On a GPU: the weights and inputs in its memory, each call waited for.
  diffusion::Act x_dev;
  diffusion::FloatBuffer t_dev, ctx_dev, pooled_dev, time_ids_dev;
  if (device != Device::kHost) {
    unet.params().to_device(device);
    x_dev = diffusion::to_device(x, device);
    t_dev = diffusion::to_device(t.data(), int64_t(t.size()), device);
    ctx_dev = diffusion::to_device(ctx.data(), int64_t(ctx.size()), device);
    pooled_dev = diffusion::to_device(pooled.data(), int64_t(pooled.size()), device);
    time_ids_dev = diffusion::to_device(time_ids.data(), int64_t(time_ids.size()), device);
    run = [&] {
      diffusion::Act y = unet.forward(x_dev, t_dev.data(), ctx_dev.data(), tokens,
                                      pooled.empty() ? nullptr : pooled_dev.data(),
                                      time_ids.empty() ? nullptr : time_ids_dev.data());
      backend_for(device).synchronize();
      return y;
    };
  }
  run();  // warm-up: primitives created, buffers touched
  diffusion::reset_layer_macs();
  std::vector<double> times;
  for (int64_t i = 0; i < iterations; ++i) {
    const Timer timer;
    run();
    times.push_back(timer.seconds());
  }
  const double macs = double(diffusion::layer_macs()) / double(iterations);
  std::sort(times.begin(), times.end());
  const double best = times.front(), median = times[times.size() / 2];
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);  // before the peak measurement's own buffers
  const double rss_gb = double(ru.ru_maxrss) / (1 << 20);
  const double gflops = 2.0 * macs / best / 1e9;
  if (device != Device::kHost) {
    // Against the GPU's own matmul rate in this dtype (8192^3 GEMMs in its memory).
    const double device_peak =
        measure_backend_gemm_gflops(backend_for(device), mixed ? DType::kBF16 : DType::kF32, 8192);
    const double device_mib = double(backend_for(device).allocator().peak_bytes()) / (1 << 20);
    if (json) {
      nlohmann::ordered_json j = {{"model", model}, {"size", size}, {"latent", latent}, {"batch", batch},
                                  {"hardware", hw}, {"dtype", dtype}, {"params", unet.params().size()},
                                  {"gflop_per_call", 2 * macs / 1e9}, {"best_seconds", best},
                                  {"median_seconds", median}, {"gflops", gflops},
                                  {"device_peak_gflops", device_peak}, {"fraction_of_device_peak", gflops / device_peak},
                                  {"device_peak_mib", device_mib}, {"weights_gb", weights_gb}};
      print_json(j, 2);
      return 0;
    }
    std::printf("%s UNet on the GPU, %lldx%lld pixels, batch %lld, %s\n", model.c_str(), (long long)size,
                (long long)size, (long long)batch, dtype.c_str());
    std::printf("%.1f GFLOP per call: best %.4f s, median %.4f s; %.1f GFLOP/s = %.2f of the GPU's %s matmul rate "
                "(%.1f); %.0f MiB of device memory at most\n",
                2 * macs / 1e9, best, median, gflops, gflops / device_peak, dtype.c_str(), device_peak, device_mib);
    return 0;
  }
  const double peak = cached_peak().f32_gflops;
  if (json) {
    nlohmann::ordered_json j = {{"model", model},       {"size", size},
                                {"latent", latent},     {"batch", batch}, {"hardware", hw},
                                {"threads", num_threads()}, {"cpu", cpu_features().model_name},
                                {"params", unet.params().size()}, {"gflop_per_call", 2 * macs / 1e9},
                                {"best_seconds", best}, {"median_seconds", median},
                                {"gflops", gflops},     {"f32_peak_gflops", peak},
                                {"fraction_of_peak", gflops / peak}, {"max_rss_gb", rss_gb},
                                {"weights_gb", weights_gb}};
    precision_json(j, gflops);
    print_json(j, 2);
    return 0;
  }
  std::printf("%s UNet, %lldx%lld pixels (%lldx%lld latents), batch %lld, %d threads (%s)\n", model.c_str(),
              (long long)size, (long long)size, (long long)latent, (long long)latent, (long long)batch, num_threads(),
              cpu_summary().c_str());
  std::printf("%.1f GFLOP per call: best %.3f s, median %.3f s; %.1f GFLOP/s = %.2f of the f32 peak (%.1f)\n",
              2 * macs / 1e9, best, median, gflops, gflops / peak, peak);
  precision_text(gflops);
  std::printf("weights %.2f GB, peak resident memory %.2f GB\n", weights_gb, rss_gb);
  return 0;
}

}  // namespace hyperion::cli
