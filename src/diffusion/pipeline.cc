#include "diffusion/pipeline.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "base/error.h"
#include "base/log.h"
#include "base/utf8.h"
#include "diffusion/components.h"
#include "diffusion/json_fields.h"
#include "io/atomic_file.h"
#include "kernels/fill.h"

namespace hyperion::diffusion {

namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void diffusion_noise(uint64_t seed, int64_t image, int64_t step, float* out, int64_t n) {
  const uint64_t s = splitmix64(seed ^ splitmix64(uint64_t(image) * 1000003ull + uint64_t(step + 1)));
  fill_normal(TensorView(out, DType::kF32, {n}), s, 0.0f, 1.0f);
}

struct DiffusionPipeline::Job {
  ImageRequest request;
  std::unique_ptr<Sampler> sampler;
  std::vector<SamplerState> states;  // per image
  Act latents;                       // [count, h, w, L]
  Conditioning cond, uncond;
  std::vector<float> time_ids;  // SDXL: [6]
  bool guided = true;
  int64_t step = 0;
  GeneratedImages result;
};

bool DiffusionPipeline::is_pipeline_dir(const std::string& dir) {
  return fs::exists(fs::path(dir) / "model_index.json");
}

DiffusionPipeline::DiffusionPipeline(std::string class_name, std::unique_ptr<ClipTextModel> text_encoder,
                                     std::unique_ptr<text::ClipTokenizer> tokenizer, std::unique_ptr<UNet> unet,
                                     std::unique_ptr<Vae> vae, NoiseSchedule schedule)
    : class_name_(std::move(class_name)),
      text_encoder_(std::move(text_encoder)),
      tokenizer_(std::move(tokenizer)),
      unet_(std::move(unet)),
      vae_(std::move(vae)),
      schedule_(std::move(schedule)) {}

DiffusionPipeline::~DiffusionPipeline() = default;

void DiffusionPipeline::add_second_text_encoder(std::unique_ptr<ClipTextModel> text_encoder_2,
                                                std::unique_ptr<text::ClipTokenizer> tokenizer_2,
                                                bool force_zeros_for_empty_prompt) {
  HYP_CHECK(text_encoder_2->config().with_projection, "an SDXL pipeline's second text encoder has a projection");
  HYP_CHECK(unet_->config().text_time, "an SDXL pipeline needs a UNet with addition_embed_type text_time");
  const int64_t ctx = text_encoder_->config().hidden_size + text_encoder_2->config().hidden_size;
  HYP_CHECK(ctx == unet_->config().cross_attention_dim,
            "the text encoders give {} features, the UNet's cross_attention_dim is {}", ctx,
            unet_->config().cross_attention_dim);
  class_name_ = "StableDiffusionXLPipeline";
  text_encoder_2_ = std::move(text_encoder_2);
  tokenizer_2_ = std::move(tokenizer_2);
  force_zeros_for_empty_prompt_ = force_zeros_for_empty_prompt;
}

std::unique_ptr<DiffusionPipeline> DiffusionPipeline::load(const std::string& dir) {
  const std::string index_path = (fs::path(dir) / "model_index.json").string();
  HYP_CHECK(fs::exists(index_path), "{}: not a diffusers pipeline (no model_index.json)", dir);
  const JsonFields index(io::read_file(index_path, 1 << 20), index_path);
  const std::string cls = index.string("_class_name", "");
  const bool xl = cls == "StableDiffusionXLPipeline";
  if (cls != "StableDiffusionPipeline" && !xl)
    index.refuse("_class_name", "\"" + cls + "\" is not supported (StableDiffusionPipeline, StableDiffusionXLPipeline)");
  // Each component is ["library", "ClassName"]; the folder is the key.
  auto component = [&](const char* key, const std::vector<std::string>& classes) {
    if (!index.has(key)) index.refuse(key, "is missing (the pipeline needs this component)");
    const nlohmann::json& v = index.json()[key];
    if (!v.is_array() || v.size() != 2 || !v[1].is_string())
      index.refuse(key, "must be [library, class], got " + v.dump());
    const std::string c = v[1].get<std::string>();
    if (std::find(classes.begin(), classes.end(), c) == classes.end())
      index.refuse(key, "class \"" + c + "\" is not supported");
    const std::string folder = (fs::path(dir) / key).string();
    HYP_CHECK(fs::is_directory(folder), "{}: the {} folder model_index.json names is missing", dir, key);
    return folder;
  };
  auto p = std::unique_ptr<DiffusionPipeline>(new DiffusionPipeline());
  p->class_name_ = cls;
  p->unet_ = load_unet(component("unet", {"UNet2DConditionModel"}));
  p->vae_ = load_vae(component("vae", {"AutoencoderKL"}));
  p->text_encoder_ = load_clip_text(component("text_encoder", {"CLIPTextModel"}));
  p->tokenizer_ = std::make_unique<text::ClipTokenizer>(
      text::ClipTokenizer::load(component("tokenizer", {"CLIPTokenizer", "CLIPTokenizerFast"})));
  if (xl) {
    p->text_encoder_2_ = load_clip_text(component("text_encoder_2", {"CLIPTextModelWithProjection"}));
    p->tokenizer_2_ = std::make_unique<text::ClipTokenizer>(
        text::ClipTokenizer::load(component("tokenizer_2", {"CLIPTokenizer", "CLIPTokenizerFast"})));
    p->force_zeros_for_empty_prompt_ = index.boolean("force_zeros_for_empty_prompt", true);
    HYP_CHECK(p->unet_->config().text_time, "{}: an SDXL pipeline needs a UNet with addition_embed_type text_time", dir);
  }
  const std::string sched_dir = component("scheduler", {"PNDMScheduler", "DDIMScheduler", "EulerDiscreteScheduler",
                                                        "EulerAncestralDiscreteScheduler", "DPMSolverMultistepScheduler",
                                                        "LMSDiscreteScheduler", "DDPMScheduler"});
  const std::string sched_path = (fs::path(sched_dir) / "scheduler_config.json").string();
  HYP_CHECK(fs::exists(sched_path), "{}: scheduler_config.json is missing", sched_dir);
  p->schedule_ = NoiseSchedule::from_json(io::read_file(sched_path, 1 << 20), sched_path);
  // The context width the UNet attends to must be what the encoders give.
  const int64_t ctx = p->text_encoder_->config().hidden_size + (xl ? p->text_encoder_2_->config().hidden_size : 0);
  HYP_CHECK(ctx == p->unet_->config().cross_attention_dim,
            "{}: the text encoders give {} features, the UNet's cross_attention_dim is {}", dir, ctx,
            p->unet_->config().cross_attention_dim);
  HYP_CHECK(p->vae_->config().latent_channels == p->unet_->config().in_channels,
            "{}: the VAE has {} latent channels, the UNet takes {}", dir, p->vae_->config().latent_channels,
            p->unet_->config().in_channels);
  return p;
}

void DiffusionPipeline::set_compute_dtype(DType dtype) {
  HYP_CHECK(dtype == DType::kF32 || dtype == DType::kBF16, "diffusion: compute dtype {} (float32 or bfloat16)",
            dtype_name(dtype));
  const bool mixed = dtype == DType::kBF16;
  for (ClipTextModel* t : {text_encoder_.get(), text_encoder_2_.get()})
    if (t) t->params().set_bf16_compute(mixed);
  unet_->params().set_bf16_compute(mixed);
  vae_->params().set_bf16_compute(mixed);
}

DType DiffusionPipeline::compute_dtype() const {
  return unet_->params().bf16_compute() ? DType::kBF16 : DType::kF32;
}

int64_t DiffusionPipeline::default_size() const {
  return unet_->config().sample_size * vae_->config().downscale();
}

ImageRequest DiffusionPipeline::resolve(ImageRequest r) const {
  // Each refusal names the ImageRequest field at fault (a server maps it to its own).
  auto check = [](bool ok, const char* field, const std::string& message) {
    if (!ok) throw ImageRequestError(field, message);
  };
  if (r.width == 0) r.width = default_size();
  if (r.height == 0) r.height = default_size();
  // Any multiple of the VAE's factor: a latent side the UNet's downsampling does not
  // divide is upsampled back to its skip's size (diffusers' upsample_size).
  const int64_t multiple = vae_->config().downscale();
  for (auto [name, v] : {std::pair<const char*, int64_t>{"width", r.width}, {"height", r.height}})
    check(v >= multiple && v <= kMaxImageSide && v % multiple == 0, name,
          fmt::format("image {} {} must be a multiple of {} in [{}, {}]", name, v, multiple, multiple, kMaxImageSide));
  check(r.steps >= 1 && r.steps <= schedule_.train_timesteps, "steps",
        fmt::format("steps {} must be in [1, {}]", r.steps, schedule_.train_timesteps));
  check(std::isfinite(r.guidance) && r.guidance >= 0 && r.guidance <= 100, "guidance",
        fmt::format("guidance scale {} must be in [0, 100]", r.guidance));
  check(r.count >= 1 && r.count <= 16, "count", fmt::format("image count {} must be in [1, 16]", r.count));
  if (r.sampler.empty()) r.sampler = sampler_name(sampler_for_class(schedule_.class_name, SamplerKind::kDpmSolver2M));
  SamplerKind kind;
  check(parse_sampler(r.sampler, &kind), "sampler",
        fmt::format("scheduler '{}' is not one of ddim, euler, euler_a, dpm++2m", r.sampler));
  r.sampler = sampler_name(kind);
  check(!(r.karras && kind == SamplerKind::kDdim), "karras", "ddim has no Karras sigmas");
  check(utf8_invalid_at(r.prompt) == std::string::npos, "prompt", "prompt is not valid UTF-8");
  check(utf8_invalid_at(r.negative_prompt) == std::string::npos, "negative_prompt",
        "negative prompt is not valid UTF-8");
  return r;
}

DiffusionPipeline::Conditioning DiffusionPipeline::encode_prompt(const std::string& prompt, bool zeros) const {
  Conditioning c;
  auto run = [&](const text::ClipTokenizer& tok, const ClipTextModel& enc, int64_t* dropped) {
    const std::vector<int32_t> ids = tok.encode_for_model(prompt, dropped);
    return enc.forward(ids, 1);
  };
  int64_t dropped = 0;
  if (!xl()) {
    const ClipTextOutput o = run(*tokenizer_, *text_encoder_, &dropped);
    c.context = o.last;
    c.tokens = o.tokens;
  } else {
    int64_t dropped2 = 0;
    const ClipTextOutput a = run(*tokenizer_, *text_encoder_, &dropped);
    const ClipTextOutput b = run(*tokenizer_2_, *text_encoder_2_, &dropped2);
    HYP_CHECK(a.tokens == b.tokens, "the two tokenizers give {} and {} tokens", a.tokens, b.tokens);
    c.tokens = a.tokens;
    const int64_t d = a.hidden + b.hidden;
    c.context.resize(size_t(c.tokens * d));
    for (int64_t t = 0; t < c.tokens; ++t) {
      std::copy(a.penultimate.begin() + t * a.hidden, a.penultimate.begin() + (t + 1) * a.hidden,
                c.context.begin() + t * d);
      std::copy(b.penultimate.begin() + t * b.hidden, b.penultimate.begin() + (t + 1) * b.hidden,
                c.context.begin() + t * d + a.hidden);
    }
    c.pooled = b.text_embeds;
    dropped = std::max(dropped, dropped2);
  }
  c.truncated = dropped;
  if (zeros) {
    std::fill(c.context.begin(), c.context.end(), 0.0f);
    std::fill(c.pooled.begin(), c.pooled.end(), 0.0f);
  }
  return c;
}

std::shared_ptr<DiffusionPipeline::Job> DiffusionPipeline::start(const ImageRequest& request) const {
  auto job = std::make_shared<Job>();
  job->request = resolve(request);
  const ImageRequest& r = job->request;
  const auto t0 = std::chrono::steady_clock::now();
  SamplerKind kind;
  parse_sampler(r.sampler, &kind);
  job->sampler = std::make_unique<Sampler>(schedule_, kind, r.steps, r.karras);
  job->guided = r.guidance > 1.0;
  job->cond = encode_prompt(r.prompt, false);
  if (job->cond.truncated > 0)
    log_warn("the prompt is {} tokens longer than the {} the text encoder reads; the rest was dropped",
             job->cond.truncated, tokenizer_->max_length());
  if (job->guided) job->uncond = encode_prompt(r.negative_prompt, xl() && force_zeros_for_empty_prompt_ && r.negative_prompt.empty());
  if (xl()) job->time_ids = {float(r.height), float(r.width), 0.0f, 0.0f, float(r.height), float(r.width)};
  const int64_t f = vae_->config().downscale(), L = vae_->config().latent_channels;
  job->latents = Act(r.count, r.height / f, r.width / f, L);
  const int64_t per = job->latents.h * job->latents.w * L;
  for (int64_t i = 0; i < r.count; ++i) {
    diffusion_noise(r.seed, i, -1, job->latents.data() + i * per, per);
    for (int64_t k = 0; k < per; ++k) job->latents.data()[i * per + k] *= float(job->sampler->init_noise_sigma());
  }
  job->states.resize(size_t(r.count));
  job->result.truncated_tokens = job->cond.truncated;
  job->result.encode_seconds = seconds_since(t0);
  return job;
}

bool DiffusionPipeline::finished(const Job& job) {
  return job.step >= job.sampler->steps();
}

int64_t DiffusionPipeline::latent_pixels(const Job& job) {
  return job.latents.h * 100000 + job.latents.w;
}

void DiffusionPipeline::step(const std::vector<Job*>& jobs) const {
  if (jobs.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  const Act& first = jobs.front()->latents;
  const int64_t per = first.h * first.w * first.c, tokens = jobs.front()->cond.tokens;
  const int64_t ctx_dim = unet_->config().cross_attention_dim;
  int64_t rows = 0;
  for (const Job* j : jobs) {
    HYP_CHECK(!finished(*j), "diffusion: stepping a finished job");
    HYP_CHECK(j->latents.h == first.h && j->latents.w == first.w, "diffusion: jobs of different sizes in one step");
    rows += j->request.count * (j->guided ? 2 : 1);
  }
  // The UNet batch: per image, [uncond,] cond.
  Act x(rows, first.h, first.w, first.c);
  std::vector<float> t(static_cast<size_t>(rows)), ctx(size_t(rows * tokens * ctx_dim)), pooled, time_ids;
  const int64_t pooled_dim = xl() ? int64_t(jobs.front()->cond.pooled.size()) : 0;
  if (xl()) {
    pooled.resize(size_t(rows * pooled_dim));
    time_ids.resize(size_t(rows * 6));
  }
  int64_t row = 0;
  for (const Job* j : jobs) {
    const float scale = float(j->sampler->input_scale(j->step));
    const float ts = float(j->sampler->timestep(j->step));
    for (int64_t i = 0; i < j->request.count; ++i)
      for (int pass = j->guided ? 0 : 1; pass < 2; ++pass, ++row) {
        const Conditioning& c = pass == 0 ? j->uncond : j->cond;
        const float* src = j->latents.data() + i * per;
        for (int64_t k = 0; k < per; ++k) x.data()[row * per + k] = src[k] * scale;
        t[size_t(row)] = ts;
        std::copy(c.context.begin(), c.context.end(), ctx.begin() + row * tokens * ctx_dim);
        if (xl()) {
          std::copy(c.pooled.begin(), c.pooled.end(), pooled.begin() + row * pooled_dim);
          std::copy(j->time_ids.begin(), j->time_ids.end(), time_ids.begin() + row * 6);
        }
      }
  }
  const Device device = unet_->params().device();
  Act out;
  if (device == Device::kHost) {
    out = unet_->forward(x, t.data(), ctx.data(), tokens, xl() ? pooled.data() : nullptr,
                         xl() ? time_ids.data() : nullptr);
  } else {
    // The UNet's inputs up, its prediction down; the samplers step on the host (a few
    // elementwise passes over the latents).
    const FloatBuffer t_dev = diffusion::to_device(t.data(), rows, device), ctx_dev = diffusion::to_device(ctx.data(), int64_t(ctx.size()), device);
    const FloatBuffer pooled_dev = diffusion::to_device(pooled.data(), int64_t(pooled.size()), device),
                      time_ids_dev = diffusion::to_device(time_ids.data(), int64_t(time_ids.size()), device);
    out = diffusion::to_device(unet_->forward(diffusion::to_device(x, device), t_dev.data(), ctx_dev.data(), tokens,
                                   xl() ? pooled_dev.data() : nullptr, xl() ? time_ids_dev.data() : nullptr),
                    Device::kHost);
  }
  std::vector<float> guided(static_cast<size_t>(per)), noise(static_cast<size_t>(per));
  row = 0;
  for (Job* j : jobs) {
    const bool ancestral = j->sampler->kind() == SamplerKind::kEulerAncestral;
    for (int64_t i = 0; i < j->request.count; ++i) {
      const float* pred;
      if (j->guided) {
        classifier_free_guidance(out.data() + row * per, out.data() + (row + 1) * per, j->request.guidance, per,
                                 guided.data());
        pred = guided.data();
        row += 2;
      } else {
        pred = out.data() + row * per;
        row += 1;
      }
      if (ancestral) diffusion_noise(j->request.seed, i, j->step, noise.data(), per);
      j->sampler->step(j->step, pred, j->latents.data() + i * per, per, ancestral ? noise.data() : nullptr,
                       &j->states[size_t(i)]);
    }
    ++j->step;
  }
  const double dt = seconds_since(t0);
  for (Job* j : jobs) j->result.denoise_seconds += dt;
}

GeneratedImages DiffusionPipeline::finish(Job& job) const {
  HYP_CHECK(finished(job), "diffusion: finishing a job at step {} of {}", job.step, job.sampler->steps());
  const auto t0 = std::chrono::steady_clock::now();
  const Act images = vae_->decode_latents(job.latents);
  GeneratedImages r = std::move(job.result);
  r.count = images.n;
  r.height = images.h;
  r.width = images.w;
  r.channels = images.c;
  r.pixels.assign(images.v.begin(), images.v.end());
  r.decode_seconds = seconds_since(t0);
  return r;
}

GeneratedImages DiffusionPipeline::generate(const ImageRequest& request) const {
  std::shared_ptr<Job> job = start(request);
  while (!finished(*job)) step({job.get()});
  return finish(*job);
}

void DiffusionPipeline::to_device(Device device) {
  for (ParamTable* p : {&unet_->params(), &vae_->params(), &text_encoder_->params()}) p->to_device(device);
  if (text_encoder_2_) text_encoder_2_->params().to_device(device);
}

Device DiffusionPipeline::device() const {
  return unet_->params().device();
}

void DiffusionPipeline::save(const std::string& dir) const {
  HYP_CHECK(device() == Device::kHost, "diffusion: saving a pipeline whose models are on the {}",
            device_name(device()));
  fs::create_directories(dir);
  nlohmann::ordered_json index;
  index["_class_name"] = class_name_;
  index["_diffusers_version"] = "0.31.0";
  index["feature_extractor"] = {nullptr, nullptr};
  index["requires_safety_checker"] = false;
  index["safety_checker"] = {nullptr, nullptr};
  index["scheduler"] = {"diffusers", schedule_.class_name};
  index["text_encoder"] = {"transformers", "CLIPTextModel"};
  index["tokenizer"] = {"transformers", "CLIPTokenizer"};
  index["unet"] = {"diffusers", "UNet2DConditionModel"};
  index["vae"] = {"diffusers", "AutoencoderKL"};
  if (xl()) {
    index.erase("feature_extractor");
    index.erase("requires_safety_checker");
    index.erase("safety_checker");
    index["force_zeros_for_empty_prompt"] = force_zeros_for_empty_prompt_;
    index["text_encoder_2"] = {"transformers", "CLIPTextModelWithProjection"};
    index["tokenizer_2"] = {"transformers", "CLIPTokenizer"};
  }
  auto sub = [&](const char* name) {
    const std::string d = (fs::path(dir) / name).string();
    fs::create_directories(d);
    return d;
  };
  const std::string unet_dir = sub("unet"), vae_dir = sub("vae"), te_dir = sub("text_encoder"),
                    sched_dir = sub("scheduler");
  io::write_file_atomic((fs::path(unet_dir) / "config.json").string(), unet_->config().to_json());
  unet_->params().save((fs::path(unet_dir) / "diffusion_pytorch_model.safetensors").string());
  io::write_file_atomic((fs::path(vae_dir) / "config.json").string(), vae_->config().to_json());
  vae_->params().save((fs::path(vae_dir) / "diffusion_pytorch_model.safetensors").string());
  io::write_file_atomic((fs::path(te_dir) / "config.json").string(), text_encoder_->config().to_json());
  text_encoder_->params().save((fs::path(te_dir) / "model.safetensors").string());
  tokenizer_->save(sub("tokenizer"));
  if (xl()) {
    const std::string te2_dir = sub("text_encoder_2");
    io::write_file_atomic((fs::path(te2_dir) / "config.json").string(), text_encoder_2_->config().to_json());
    text_encoder_2_->params().save((fs::path(te2_dir) / "model.safetensors").string());
    tokenizer_2_->save(sub("tokenizer_2"));
  }
  io::write_file_atomic((fs::path(sched_dir) / "scheduler_config.json").string(), schedule_.to_json());
  // The index last: a directory with model_index.json is complete.
  io::write_file_atomic((fs::path(dir) / "model_index.json").string(), index.dump(2) + "\n");
}

}  // namespace hyperion::diffusion
