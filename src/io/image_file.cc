#include "io/image_file.h"

#include <png.h>
#include <turbojpeg.h>

#include <cstring>

#include "base/error.h"
#include "io/atomic_file.h"

namespace hyperion::io {
namespace {

bool is_png(std::string_view b) {
  return b.size() >= 8 && std::memcmp(b.data(), "\x89PNG\r\n\x1a\n", 8) == 0;
}
bool is_jpeg(std::string_view b) {
  return b.size() >= 3 && uint8_t(b[0]) == 0xFF && uint8_t(b[1]) == 0xD8 && uint8_t(b[2]) == 0xFF;
}

void check_size(int64_t w, int64_t h, const std::string& origin) {
  HYP_CHECK(w > 0 && h > 0, "{}: image has no pixels ({}x{})", origin, w, h);
  HYP_CHECK(w * h <= kMaxImagePixels, "{}: image of {}x{} pixels is larger than the {} allowed",
            origin, w, h, kMaxImagePixels);
}

Image decode_png(std::string_view bytes, const std::string& origin) {
  png_image img;
  std::memset(&img, 0, sizeof(img));
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&img, bytes.data(), bytes.size()))
    fail("{}: not a readable PNG ({})", origin, img.message);
  if (int64_t(img.width) <= 0 || int64_t(img.height) <= 0 ||
      int64_t(img.width) * int64_t(img.height) > kMaxImagePixels) {
    const int64_t w = img.width, h = img.height;
    png_image_free(&img);
    check_size(w, h, origin);
  }
  // Read as RGBA (gray and palette expanded by libpng), then the alpha dropped, not
  // composited: what PIL's convert("RGB") gives the training scripts.
  img.format = PNG_FORMAT_RGBA;
  std::vector<uint8_t> rgba(size_t(img.width) * img.height * 4);
  if (!png_image_finish_read(&img, nullptr, rgba.data(), 0, nullptr))
    fail("{}: corrupt PNG ({})", origin, img.message);
  Image out;
  out.width = img.width;
  out.height = img.height;
  out.channels = 3;
  out.pixels.resize(out.bytes());
  for (size_t i = 0, n = size_t(out.width * out.height); i < n; ++i)
    for (size_t c = 0; c < 3; ++c) out.pixels[i * 3 + c] = rgba[i * 4 + c];
  return out;
}

Image decode_jpeg(std::string_view bytes, const std::string& origin) {
  tjhandle tj = tjInitDecompress();
  HYP_CHECK(tj != nullptr, "{}: cannot start the JPEG decoder", origin);
  struct Closer {
    tjhandle h;
    ~Closer() { tjDestroy(h); }
  } closer{tj};
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  if (tjDecompressHeader3(tj, data, static_cast<unsigned long>(bytes.size()), &w, &h, &subsamp,
                          &colorspace) != 0)
    fail("{}: not a readable JPEG ({})", origin, tjGetErrorStr2(tj));
  check_size(w, h, origin);
  Image out;
  out.width = w;
  out.height = h;
  out.channels = 3;
  out.pixels.resize(out.bytes());
  if (tjDecompress2(tj, data, static_cast<unsigned long>(bytes.size()), out.pixels.data(), w, 0, h,
                    TJPF_RGB, TJFLAG_ACCURATEDCT) != 0 &&
      tjGetErrorCode(tj) == TJERR_FATAL)
    fail("{}: corrupt JPEG ({})", origin, tjGetErrorStr2(tj));
  return out;
}

}  // namespace

Image decode_image(std::string_view bytes, const std::string& origin) {
  if (is_png(bytes)) return decode_png(bytes, origin);
  if (is_jpeg(bytes)) return decode_jpeg(bytes, origin);
  fail("{}: not a PNG or JPEG file (unknown signature)", origin);
}

Image read_image(const std::string& path) {
  // Compressed images are smaller than their pixels; 256 MiB bounds the read.
  return decode_image(read_file(path, int64_t(256) << 20), path);
}

std::string encode_png(const Image& image) {
  HYP_CHECK(image.channels == 1 || image.channels == 3 || image.channels == 4,
            "encode_png: {} channels (1, 3 or 4 are written)", image.channels);
  HYP_CHECK(image.width > 0 && image.height > 0 && image.pixels.size() == image.bytes(),
            "encode_png: {}x{}x{} image holds {} bytes", image.width, image.height, image.channels,
            image.pixels.size());
  png_image img;
  std::memset(&img, 0, sizeof(img));
  img.version = PNG_IMAGE_VERSION;
  img.width = png_uint_32(image.width);
  img.height = png_uint_32(image.height);
  img.format = image.channels == 1 ? PNG_FORMAT_GRAY
                                   : image.channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_RGBA;
  png_alloc_size_t size = 0;
  if (!png_image_write_to_memory(&img, nullptr, &size, 0, image.pixels.data(), 0, nullptr))
    fail("encode_png: {}", img.message);
  std::string out(size, '\0');
  if (!png_image_write_to_memory(&img, out.data(), &size, 0, image.pixels.data(), 0, nullptr))
    fail("encode_png: {}", img.message);
  out.resize(size);
  return out;
}

void write_png(const std::string& path, const Image& image) {
  write_file_atomic(path, encode_png(image));
}

}  // namespace hyperion::io
