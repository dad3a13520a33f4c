// Image files: PNG (libpng) and JPEG (libjpeg-turbo's TurboJPEG) read into 8-bit pixels,
// PNG written. What a diffusion dataset's `file_name` points at and what `generate`
// writes. Decoding goes through the libraries' error-returning APIs (png_image,
// tjDecompress2), so a corrupt file is an error naming it, never a crash.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hyperion::io {

// Row-major pixels, `channels` bytes each (1 gray, 3 RGB, 4 RGBA).
struct Image {
  int64_t width = 0, height = 0, channels = 0;
  std::vector<uint8_t> pixels;
  size_t bytes() const { return size_t(width * height * channels); }
};

// The largest image decoded: 8192 x 8192 pixels (a bigger header is refused before any
// allocation).
constexpr int64_t kMaxImagePixels = int64_t(8192) * 8192;

// Decodes PNG or JPEG bytes (recognised by their signature) to RGB (3 channels; gray and
// palette images are expanded, alpha dropped, 16-bit PNG reduced to 8). origin names the
// file in errors.
Image decode_image(std::string_view bytes, const std::string& origin);
Image read_image(const std::string& path);

// PNG bytes of an image with 1, 3 or 4 channels.
std::string encode_png(const Image& image);
// Written atomically (temp file + rename).
void write_png(const std::string& path, const Image& image);

}  // namespace hyperion::io
