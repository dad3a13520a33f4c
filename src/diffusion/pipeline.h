// Text-to-image generation from a diffusers directory: StableDiffusionPipeline (SD 1.x,
// 2.x: one CLIP text encoder) and StableDiffusionXLPipeline (two, with SDXL's pooled
// embedding and size/crop time ids), as model_index.json names them.
//
// A request's prompt and negative prompt are encoded once (77 tokens, truncated with a
// warning as diffusers does), its latents drawn from its seed, then each denoising step
// runs the UNet on [negative | positive] (classifier-free guidance; the positive alone at
// guidance <= 1) and the request's sampler steps its latents. Jobs of one latent size
// step together: one UNet call for all of them, each at its own timestep (the server
// batches concurrent requests this way, a request joining at its next step). The noise
// of image i of a request depends only on (seed, i, step), so an image is the same
// whether it was made alone or in a batch.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "diffusion/clip_text.h"
#include "diffusion/noise_schedule.h"
#include "diffusion/sampler.h"
#include "diffusion/unet.h"
#include "diffusion/vae.h"
#include "text/clip_tokenizer.h"

namespace hyperion::diffusion {

struct ImageRequest {
  std::string prompt, negative_prompt;
  int64_t width = 0, height = 0;  // 0: the model's default (sample_size x VAE factor)
  int64_t steps = 30;
  double guidance = 7.5;
  std::string sampler;  // "" : the scheduler config's class (else dpm++2m)
  bool karras = false;
  uint64_t seed = 0;
  int64_t count = 1;  // images for this prompt
};

struct GeneratedImages {
  int64_t count = 0, height = 0, width = 0, channels = 3;
  std::vector<float> pixels;      // [count, height, width, channels] in [-1, 1]
  int64_t truncated_tokens = 0;   // prompt tokens past the 77 the encoder reads
  double encode_seconds = 0, denoise_seconds = 0, decode_seconds = 0;
};

// A request refused by DiffusionPipeline::resolve: a usage error naming the ImageRequest
// field at fault ("width", "height", "steps", "guidance", "count", "sampler", "karras",
// "prompt", "negative_prompt").
class ImageRequestError : public UsageError {
 public:
  ImageRequestError(std::string field_, const std::string& message) : UsageError(message), field(std::move(field_)) {}
  std::string field;
};

// The largest image side generated.
constexpr int64_t kMaxImageSide = 2048;

class DiffusionPipeline {
 public:
  // True when dir holds model_index.json.
  static bool is_pipeline_dir(const std::string& dir);
  // Reads model_index.json and every component it names; errors name the folder, file and
  // key (a missing component, an unsupported pipeline class).
  static std::unique_ptr<DiffusionPipeline> load(const std::string& dir);
  // Assembled from components in memory (training, tests).
  DiffusionPipeline(std::string class_name, std::unique_ptr<ClipTextModel> text_encoder,
                    std::unique_ptr<text::ClipTokenizer> tokenizer, std::unique_ptr<UNet> unet,
                    std::unique_ptr<Vae> vae, NoiseSchedule schedule);
  ~DiffusionPipeline();
  // Makes it an SDXL pipeline (StableDiffusionXLPipeline): the second text encoder (with
  // projection: its pooled embedding feeds the UNet's text_time embedding) and its
  // tokenizer. The UNet must be text_time and attend to both encoders' widths.
  void add_second_text_encoder(std::unique_ptr<ClipTextModel> text_encoder_2,
                               std::unique_ptr<text::ClipTokenizer> tokenizer_2, bool force_zeros_for_empty_prompt);

  // Checks a request (sizes, steps, guidance, sampler) and fills its defaults; throws
  // ImageRequestError naming the field.
  ImageRequest resolve(ImageRequest r) const;
  GeneratedImages generate(const ImageRequest& request) const;

  // Step by step (the server's batching).
  struct Job;
  std::shared_ptr<Job> start(const ImageRequest& request) const;
  // One denoising step of every job (all of one latent size, none finished).
  void step(const std::vector<Job*>& jobs) const;
  static bool finished(const Job& job);
  static int64_t latent_pixels(const Job& job);  // jobs with equal values can step together
  GeneratedImages finish(Job& job) const;

  // Writes the pipeline as a diffusers directory (model_index.json, each component's
  // config.json and safetensors, the tokenizers' vocab.json and merges.txt, the
  // scheduler's config; SDXL's text_encoder_2 and tokenizer_2 too), atomically per file.
  void save(const std::string& dir) const;

  // Moves every model (UNet, VAE, text encoders) to `device`'s memory, or back to the host:
  // generation then runs there, the samplers and the tokenizers on the host. Inference
  // only (training keeps its models on the host).
  void to_device(Device device);
  Device device() const;

  // Mixed precision for every component (bf16 matmuls and convolutions with f32
  // accumulation, nn.h) or f32 throughout: DType::kBF16 or DType::kF32.
  void set_compute_dtype(DType dtype);
  DType compute_dtype() const;

  const UNet& unet() const { return *unet_; }
  const Vae& vae() const { return *vae_; }
  const ClipTextModel& text_encoder() const { return *text_encoder_; }
  const ClipTextModel& text_encoder_2() const { return *text_encoder_2_; }  // SDXL only
  const text::ClipTokenizer& tokenizer() const { return *tokenizer_; }
  const NoiseSchedule& schedule() const { return schedule_; }
  bool xl() const { return text_encoder_2_ != nullptr; }
  int64_t default_size() const;

  // Text conditioning of one prompt: the UNet's context [77, D] and, for SDXL, the pooled
  // embedding.
  struct Conditioning {
    std::vector<float> context, pooled;
    int64_t tokens = 0, truncated = 0;
  };
  Conditioning encode_prompt(const std::string& prompt, bool zeros) const;

 private:
  DiffusionPipeline() = default;
  std::string class_name_;
  std::unique_ptr<ClipTextModel> text_encoder_, text_encoder_2_;
  std::unique_ptr<text::ClipTokenizer> tokenizer_, tokenizer_2_;
  std::unique_ptr<UNet> unet_;
  std::unique_ptr<Vae> vae_;
  NoiseSchedule schedule_;
  bool force_zeros_for_empty_prompt_ = false;
};

// The standard normals of (seed, image, step): step -1 is the starting latent.
void diffusion_noise(uint64_t seed, int64_t image, int64_t step, float* out, int64_t n);

}  // namespace hyperion::diffusion
