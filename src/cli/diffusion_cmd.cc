// `hyperion diffusion forward`: one component of a diffusers directory (a UNet, a VAE or
// a CLIP text encoder) run on inputs from a safetensors file, its outputs written to
// another: how a reference implementation (tests/diffusion/torch_reference.py) or a user
// porting a model checks hyperion's numbers tensor by tensor. Image-like tensors are in
// PyTorch's NCHW layout in both files (hyperion computes channels-last inside).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "base/timer.h"
#include "cli/commands.h"
#include "cli/diffusion_cmd.h"
#include "cli/flags.h"
#include "diffusion/components.h"
#include "diffusion/image_dataset.h"
#include "diffusion/pipeline.h"
#include "diffusion/single_file.h"
#include "io/image_file.h"
#include "io/safetensors.h"
#include "kernels/hardware.h"

namespace hyperion::cli {

const CommandSpec kDiffusionForwardSpec = {
    "diffusion forward",
    "",
    "run one diffusion component (unet, vae, text_encoder) on tensors from a safetensors file",
    {{"component", "KIND", "unet, vae or text_encoder"},
     {"dir", "DIR", "the component's folder (config.json and its weights)"},
     {"inputs", "FILE", "safetensors with the inputs (see below)"},
     {"output", "FILE", "safetensors to write the outputs to"},
     {"json", "", "print the output tensors' names and shapes as JSON"}},
    "Inputs and outputs by component (f32; images NCHW as in PyTorch):\n"
    "  unet          sample [n, c, h, w], timesteps [n], encoder_hidden_states [n, t, d]\n"
    "                (SDXL: text_embeds [n, p], time_ids [n, 6])  ->  sample; with grad_sample (the\n"
    "                output's shape) also grad.NAME, the gradient of sum(grad_sample * sample) per parameter\n"
    "  vae           images [n, 3, H, W] -> moments [n, 2L, H/f, W/f]; latents [n, L, h, w] ->\n"
    "                decoded [n, 3, h f, w f] (either or both); with grad_moments / grad_decoded also\n"
    "                grad.NAME per parameter and grad_latents\n"
    "  text_encoder  input_ids [n, t] (i32) -> last_hidden_state, penultimate_hidden_state,\n"
    "                pooled_output (and text_embeds with a projection)",
    "diffusion forward --component unet --dir sd/unet --inputs in.safetensors --output out.safetensors"};

namespace {

struct Tensor4 {
  std::vector<float> v;
  Shape shape;
};

Tensor4 read_f32(const io::SafetensorsFile& f, const std::string& name) {
  const io::SafetensorsTensor& t = f.get(name);
  Tensor4 out;
  out.shape = t.shape;
  out.v.resize(size_t(t.shape.numel()));
  f.read_into(name, TensorView(out.v.data(), DType::kF32, t.shape));
  return out;
}

// NCHW -> channels-last activation.
diffusion::Act to_nhwc(const Tensor4& t, const std::string& name) {
  HYP_USAGE_CHECK(t.shape.rank() == 4, "diffusion forward: {} must be [n, c, h, w], got {}", name, t.shape.str());
  const int64_t n = t.shape[0], c = t.shape[1], h = t.shape[2], w = t.shape[3];
  diffusion::Act a(n, h, w, c);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < h * w; ++p) a.v[size_t((i * h * w + p) * c + ch)] = t.v[size_t((i * c + ch) * h * w + p)];
  return a;
}

std::vector<float> to_nchw(const diffusion::Act& a) {
  std::vector<float> out(a.v.size());
  const int64_t hw = a.h * a.w;
  for (int64_t i = 0; i < a.n; ++i)
    for (int64_t ch = 0; ch < a.c; ++ch)
      for (int64_t p = 0; p < hw; ++p) out[size_t((i * a.c + ch) * hw + p)] = a.v[size_t((i * hw + p) * a.c + ch)];
  return out;
}

void add_param_grads(diffusion::ParamTable& p, std::map<std::string, std::pair<std::vector<float>, Shape>>& outputs) {
  for (size_t i = 0; i < p.entries().size(); ++i) {
    const diffusion::ParamEntry& e = p.entries()[i];
    const float* g = p.grad(int(i));
    outputs["grad." + e.name] = {std::vector<float>(g, g + e.numel), e.shape};
  }
}

}  // namespace

int cmd_diffusion_forward(const Args& args) {
  const Flags flags(kDiffusionForwardSpec, args);
  HYP_USAGE_CHECK(flags.positional().empty(), "diffusion forward: unexpected argument '{}'", flags.positional()[0]);
  const std::string kind = flags.require("component"), dir = flags.require("dir");
  const io::SafetensorsFile in = io::SafetensorsFile::open(flags.require("inputs"));
  const std::string output = flags.require("output");
  std::map<std::string, std::pair<std::vector<float>, Shape>> outputs;
  if (kind == "unet") {
    // With grad_sample, also the backward pass: the gradient of sum(grad_sample * sample)
    // for every parameter, as "grad.NAME".
    const bool grads = in.find("grad_sample") != nullptr;
    const auto unet = diffusion::load_unet(dir, grads);
    const diffusion::Act sample = to_nhwc(read_f32(in, "sample"), "sample");
    const Tensor4 t = read_f32(in, "timesteps"), ctx = read_f32(in, "encoder_hidden_states");
    HYP_USAGE_CHECK(t.shape.numel() == sample.n, "diffusion forward: timesteps {} for {} samples", t.shape.str(), sample.n);
    HYP_USAGE_CHECK(ctx.shape.rank() == 3 && ctx.shape[0] == sample.n &&
                        ctx.shape[2] == unet->config().cross_attention_dim,
                    "diffusion forward: encoder_hidden_states {} must be [{}, tokens, {}]", ctx.shape.str(), sample.n,
                    unet->config().cross_attention_dim);
    Tensor4 text, ids;
    if (unet->config().text_time) {
      text = read_f32(in, "text_embeds");
      ids = read_f32(in, "time_ids");
    }
    std::shared_ptr<diffusion::UNet::Tape> tape;
    const diffusion::Act y = unet->forward(sample, t.v.data(), ctx.v.data(), ctx.shape[1],
                                           text.v.empty() ? nullptr : text.v.data(),
                                           ids.v.empty() ? nullptr : ids.v.data(), grads ? &tape : nullptr);
    outputs["sample"] = {to_nchw(y), Shape{y.n, y.c, y.h, y.w}};
    if (grads) {
      const diffusion::Act dy = to_nhwc(read_f32(in, "grad_sample"), "grad_sample");
      HYP_USAGE_CHECK(dy.numel() == y.numel(), "diffusion forward: grad_sample must have the output's shape");
      unet->backward(*tape, dy);
      add_param_grads(unet->params(), outputs);
    }
  } else if (kind == "vae") {
    // With grad_moments / grad_decoded, also the backward passes: grad.NAME per parameter
    // and grad_latents, the gradients of sum(grad_moments * moments) + sum(grad_decoded * decoded).
    const bool grads = in.find("grad_moments") || in.find("grad_decoded");
    const auto vae = diffusion::load_vae(dir, grads);
    HYP_USAGE_CHECK(in.find("images") || in.find("latents"), "diffusion forward: {} holds neither images nor latents",
                    in.path());
    if (in.find("images")) {
      const diffusion::Act images = to_nhwc(read_f32(in, "images"), "images");
      std::shared_ptr<diffusion::Vae::Tape> tape;
      const diffusion::Act m = vae->encode(images, in.find("grad_moments") ? &tape : nullptr);
      outputs["moments"] = {to_nchw(m), Shape{m.n, m.c, m.h, m.w}};
      if (tape) vae->encode_backward(*tape, to_nhwc(read_f32(in, "grad_moments"), "grad_moments"));
    }
    if (in.find("latents")) {
      const diffusion::Act z = to_nhwc(read_f32(in, "latents"), "latents");
      std::shared_ptr<diffusion::Vae::Tape> tape;
      const diffusion::Act d = vae->decode(z, in.find("grad_decoded") ? &tape : nullptr);
      outputs["decoded"] = {to_nchw(d), Shape{d.n, d.c, d.h, d.w}};
      if (tape) {
        const diffusion::Act dz = vae->decode_backward(*tape, to_nhwc(read_f32(in, "grad_decoded"), "grad_decoded"));
        outputs["grad_latents"] = {to_nchw(dz), Shape{dz.n, dz.c, dz.h, dz.w}};
      }
    }
    if (grads) add_param_grads(vae->params(), outputs);
  } else if (kind == "text_encoder") {
    const auto clip = diffusion::load_clip_text(dir);
    const io::SafetensorsTensor& t = in.get("input_ids");
    HYP_USAGE_CHECK(t.shape.rank() == 2, "diffusion forward: input_ids must be [n, tokens], got {}", t.shape.str());
    HYP_USAGE_CHECK(t.dtype == DType::kI32, "diffusion forward: input_ids must be I32, got {}", dtype_name(t.dtype));
    std::vector<int32_t> ids(size_t(t.shape.numel()));
    std::memcpy(ids.data(), t.data, ids.size() * sizeof(int32_t));
    const diffusion::ClipTextOutput o = clip->forward(ids, t.shape[0]);
    outputs["last_hidden_state"] = {o.last, Shape{o.n, o.tokens, o.hidden}};
    outputs["penultimate_hidden_state"] = {o.penultimate, Shape{o.n, o.tokens, o.hidden}};
    outputs["pooled_output"] = {o.pooled, Shape{o.n, o.hidden}};
    if (!o.text_embeds.empty())
      outputs["text_embeds"] = {o.text_embeds, Shape{o.n, int64_t(o.text_embeds.size()) / o.n}};
  } else {
    throw UsageError(fmt::format("diffusion forward: --component {} (unet, vae or text_encoder)", kind));
  }
  io::SafetensorsWriter w;
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, t] : outputs) {
    w.add(name, DType::kF32, t.second, t.first.data());
    j[name] = std::vector<int64_t>(t.second.begin(), t.second.end());
  }
  w.write(output);
  if (flags.has("json")) std::printf("%s\n", j.dump().c_str());
  return 0;
}

int generate_image(const Flags& f) {
  for (const char* flag : {"max-tokens", "temperature", "top-k", "top-p", "ignore-eos"})
    HYP_USAGE_CHECK(!f.has(flag), "generate: --{} does not apply to a diffusion model", flag);
  diffusion::ImageRequest r;
  r.prompt = f.get("prompt");
  r.negative_prompt = f.get("negative-prompt");
  r.width = f.integer("width", 0);
  r.height = f.integer("height", 0);
  r.steps = f.integer("steps", 30);
  r.guidance = f.number("guidance", 7.5);
  r.sampler = f.get("scheduler");
  r.karras = f.has("karras");
  const int64_t seed = f.integer("seed", 0);
  HYP_USAGE_CHECK(seed >= 0, "generate: --seed must be >= 0, got {}", seed);
  r.seed = uint64_t(seed);
  r.count = f.integer("batch", 1);
  const std::string dtype = f.get("dtype", "float32");
  HYP_USAGE_CHECK(dtype == "float32" || dtype == "bfloat16", "generate: --dtype must be float32 or bfloat16, got '{}'",
                  dtype);
  const std::string hw = f.get("hardware", "cpu");
  HYP_USAGE_CHECK(hw == "cpu" || hw == "gpu", "generate: --hardware must be cpu or gpu, got '{}'", hw);
  const Device device = parse_hardware(hw, "generate: --hardware");
  require_hardware(device, "generate: --hardware");
  const std::string output = f.require("output");
  HYP_USAGE_CHECK(output.size() > 4 && output.substr(output.size() - 4) == ".png",
                  "generate: --output {} must name a .png file", output);
  HYP_USAGE_CHECK(r.width >= 0 && r.height >= 0, "generate: --width and --height must be positive");
  const Timer load_timer;
  const std::string checkpoint = f.require("checkpoint");
  HYP_USAGE_CHECK(!diffusion::DiffusionPipeline::is_pipeline_dir(checkpoint) || !f.has("config"),
                  "generate: --config applies to single-file checkpoints; {} is a diffusers directory", checkpoint);
  const auto pipe = diffusion::DiffusionPipeline::is_pipeline_dir(checkpoint)
                        ? diffusion::DiffusionPipeline::load(checkpoint)
                        : diffusion::load_single_file(checkpoint, f.require("config"));
  pipe->to_device(device);
  pipe->set_compute_dtype(dtype == "bfloat16" ? DType::kBF16 : DType::kF32);
  const double load_seconds = load_timer.seconds();
  try {
    r = pipe->resolve(r);
  } catch (const UsageError& e) {
    usage_fail("generate: {}", e.what());
  }
  const diffusion::GeneratedImages images = pipe->generate(r);
  std::vector<std::string> files;
  const int64_t per = images.height * images.width * images.channels;
  for (int64_t i = 0; i < images.count; ++i) {
    const std::string path = i == 0 ? output : output.substr(0, output.size() - 4) + "-" + std::to_string(i) + ".png";
    io::write_png(path, diffusion::to_image(images.pixels.data() + i * per, images.height, images.width,
                                            images.channels));
    files.push_back(path);
  }
  if (f.has("json")) {
    nlohmann::ordered_json j;
    j["files"] = files;
    j["width"] = images.width;
    j["height"] = images.height;
    j["steps"] = r.steps;
    j["scheduler"] = r.sampler;
    j["guidance"] = r.guidance;
    j["seed"] = r.seed;
    j["dtype"] = dtype;
    j["hardware"] = hw;
    j["truncated_tokens"] = images.truncated_tokens;
    j["load_seconds"] = load_seconds;
    j["encode_seconds"] = images.encode_seconds;
    j["denoise_seconds"] = images.denoise_seconds;
    j["decode_seconds"] = images.decode_seconds;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    for (const std::string& p : files) std::printf("%s\n", p.c_str());
    std::fprintf(stderr, "%lldx%lld, %lld steps (%s): %.2f s denoising, %.2f s decoding\n", (long long)images.width,
                 (long long)images.height, (long long)r.steps, r.sampler.c_str(), images.denoise_seconds,
                 images.decode_seconds);
  }
  return 0;
}

}  // namespace hyperion::cli
