#include "io/image_file.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <string>

#include "base/error.h"
#include "image_test_util.h"

namespace hyperion::io {
namespace {

using testing_util::gradient;
using testing_util::jpeg_bytes;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ImageFile, PngRoundTripsGrayRgbAndRgba) {
  for (int64_t c : {1, 3, 4}) {
    const Image img = gradient(13, 7, c);
    const Image back = decode_image(encode_png(img), "mem.png");
    ASSERT_EQ(back.width, 13);
    ASSERT_EQ(back.height, 7);
    ASSERT_EQ(back.channels, 3);  // decoded to RGB
    for (int64_t i = 0; i < 13 * 7; ++i)
      for (int64_t ch = 0; ch < 3; ++ch)
        ASSERT_EQ(back.pixels[size_t(i * 3 + ch)], img.pixels[size_t(i * c + (c == 1 ? 0 : ch))]) << c << " " << i;
  }
}

TEST(ImageFile, JpegDecodesCloseToItsSource) {
  const Image img = gradient(16, 16, 3);
  const Image back = decode_image(jpeg_bytes(img), "mem.jpg");
  ASSERT_EQ(back.width, 16);
  double err = 0;
  for (size_t i = 0; i < img.pixels.size(); ++i) err += std::abs(int(back.pixels[i]) - int(img.pixels[i]));
  EXPECT_LT(err / double(img.pixels.size()), 4.0);  // quality 100: a few levels at most
}

TEST(ImageFile, CorruptAndUnknownFilesAreErrorsNamingThem) {
  std::string png = encode_png(gradient(8, 8, 3));
  EXPECT_NE(error_of([&] { decode_image(png.substr(0, 40), "cut.png"); }).find("cut.png"), std::string::npos);
  EXPECT_NE(error_of([&] { decode_image("GIF89a....", "x.gif"); }).find("x.gif: not a PNG or JPEG"),
            std::string::npos);
  std::string jpg = jpeg_bytes(gradient(8, 8, 3));
  EXPECT_NE(error_of([&] { decode_image(jpg.substr(0, 20), "cut.jpg"); }).find("cut.jpg"), std::string::npos);
  // A header claiming 100000 x 100000 pixels is refused before any allocation.
  std::string huge = png;
  huge[16] = 0, huge[17] = 1, huge[18] = char(0x86), huge[19] = char(0xA0);  // width 100000
  huge[20] = 0, huge[21] = 1, huge[22] = char(0x86), huge[23] = char(0xA0);  // height 100000
  const std::string e = error_of([&] { decode_image(huge, "huge.png"); });
  EXPECT_NE(e.find("huge.png"), std::string::npos) << e;
}

}  // namespace
}  // namespace hyperion::io
