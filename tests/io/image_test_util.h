// Image fixtures shared by the image tests: a deterministic gradient image and its JPEG
// encoding (TurboJPEG, quality 100, no chroma subsampling).
#pragma once

#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <string>

#include "io/image_file.h"

namespace hyperion::testing_util {

inline io::Image gradient(int64_t w, int64_t h, int64_t c) {
  io::Image img;
  img.width = w;
  img.height = h;
  img.channels = c;
  img.pixels.resize(img.bytes());
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int64_t ch = 0; ch < c; ++ch) img.pixels[size_t((y * w + x) * c + ch)] = uint8_t((x * 7 + y * 3 + ch * 50) % 256);
  return img;
}

inline std::string jpeg_bytes(const io::Image& img) {
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(tj, img.pixels.data(), int(img.width), 0, int(img.height), TJPF_RGB, &buf, &size,
                        TJSAMP_444, 100, 0),
            0);
  std::string out(reinterpret_cast<char*>(buf), size);
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

}  // namespace hyperion::testing_util
