// Captioned images for training a diffusion model, as float pixels in [-1, 1] (what the
// VAE encodes), square `resolution` x `resolution`, channels-last:
//
//   - an image folder in Hugging Face's imagefolder convention: metadata.jsonl with one
//     {"file_name": ..., "text": ...} object per line (file_name relative to the folder),
//     PNG or JPEG files; each image resized so its shorter side is `resolution` (bilinear,
//     antialiased when shrinking, as PIL's resize that diffusers' training scripts call)
//     and center-cropped (or, center_crop false, resized to the square);
//   - Fashion-MNIST's idx files (Debian's dataset-fashion-mnist, /usr/share/datasets),
//     each image captioned "a photo of a NAME" with its class's name.
//
// A corrupt or unreadable image is skipped with a warning naming its file (strict: an
// error instead); a folder that yields no image is an error.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/image_file.h"

namespace hyperion::diffusion {

struct ImageDataset {
  int64_t resolution = 0, channels = 0;
  std::vector<float> pixels;          // [count, resolution, resolution, channels], [-1, 1]
  std::vector<std::string> captions;  // [count]
  std::vector<int32_t> labels;        // [count] class index (Fashion-MNIST), else -1
  std::vector<std::string> skipped;   // files skipped, with why
  int64_t count() const { return int64_t(captions.size()); }
  const float* image(int64_t i) const { return pixels.data() + i * resolution * resolution * channels; }
};

// Fashion-MNIST's class names, in label order ("t-shirt" ... "ankle boot").
const std::vector<std::string>& fashion_mnist_classes();
std::string fashion_mnist_caption(int32_t label);  // "a photo of a NAME"
// Where Debian's dataset-fashion-mnist puts the files.
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct ImageFolderOptions {
  int64_t resolution = 512;
  int64_t channels = 3;  // 3 (RGB) or 1 (gray: the channels' mean)
  bool center_crop = true;
  int64_t limit = 0;  // at most this many images (0: all)
  bool strict = false;
};
ImageDataset load_image_folder(const std::string& dir, const ImageFolderOptions& options);

// split "train" (60,000 images) or "test" (10,000); gray, 1 channel, resized from 28 x 28.
ImageDataset load_fashion_mnist(const std::string& dir, const std::string& split,
                                int64_t resolution, int64_t limit = 0);

// An 8-bit image resized (shorter side to `resolution`, or both sides with !center_crop)
// and center-cropped into out [resolution, resolution, channels] as (v / 127.5 - 1).
// channels 1 averages RGB; 3 repeats a gray image.
void resize_center_crop(const io::Image& image, int64_t resolution, int64_t channels,
                        bool center_crop, float* out);

// The inverse mapping for writing samples: [-1, 1] floats [h, w, c] to 8-bit pixels
// (clamped, rounded).
io::Image to_image(const float* pixels, int64_t height, int64_t width, int64_t channels);

}  // namespace hyperion::diffusion
