#include "diffusion/image_dataset.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "io/atomic_file.h"
#include "io/image_file.h"
#include "../io/image_test_util.h"

namespace hyperion::diffusion {
namespace {

namespace fs = std::filesystem;

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

TEST(ImageDataset, ResizeAndCenterCropMatchTheirDefinition) {
  // A 4x2 image whose left and right halves differ: the center crop to 2x2 of the
  // 4x2 -> (shorter side 2) keeps the middle columns.
  io::Image img;
  img.width = 4;
  img.height = 2;
  img.channels = 1;
  img.pixels = {0, 50, 100, 150, 0, 50, 100, 150};
  std::vector<float> out(4);
  resize_center_crop(img, 2, 1, true, out.data());
  EXPECT_NEAR(out[0], 50 / 127.5 - 1, 1e-6);
  EXPECT_NEAR(out[1], 100 / 127.5 - 1, 1e-6);
  // Shrinking by 2 averages pairs (the antialiased triangle filter over 2 pixels).
  io::Image wide = gradient(8, 8, 3);
  std::vector<float> half(4 * 4 * 3);
  resize_center_crop(wide, 4, 3, true, half.data());
  for (float v : half) EXPECT_TRUE(v >= -1.0f && v <= 1.0f);
  // Same size: identity.
  std::vector<float> same(8 * 8 * 3);
  resize_center_crop(wide, 8, 3, true, same.data());
  for (size_t i = 0; i < same.size(); ++i) ASSERT_NEAR(same[i], wide.pixels[i] / 127.5 - 1, 1e-5) << i;
  // And back to 8 bits.
  const io::Image back = to_image(same.data(), 8, 8, 3);
  EXPECT_EQ(back.pixels, wide.pixels);
}

TEST(ImageDataset, ImageFolderReadsMetadataAndSkipsCorruptFiles) {
  const std::string dir = testing::TempDir() + "/imagefolder_test";
  fs::remove_all(dir);
  fs::create_directories(dir + "/img");
  io::write_png(dir + "/img/a.png", gradient(20, 10, 3));
  io::write_file_atomic(dir + "/img/b.jpg", jpeg_bytes(gradient(10, 20, 3)));
  io::write_file_atomic(dir + "/img/broken.png", "\x89PNG\r\n\x1a\nnot really");
  io::write_file_atomic(dir + "/metadata.jsonl",
                        "{\"file_name\": \"img/a.png\", \"text\": \"a red thing\"}\n"
                        "{\"file_name\": \"img/broken.png\", \"text\": \"broken\"}\n\n"
                        "{\"file_name\": \"img/b.jpg\", \"text\": \"a tall thing\"}\n");
  ImageFolderOptions opt;
  opt.resolution = 8;
  const ImageDataset ds = load_image_folder(dir, opt);
  ASSERT_EQ(ds.count(), 2);
  EXPECT_EQ(ds.captions, (std::vector<std::string>{"a red thing", "a tall thing"}));
  ASSERT_EQ(ds.skipped.size(), 1u);
  EXPECT_NE(ds.skipped[0].find("broken.png"), std::string::npos);
  EXPECT_EQ(ds.pixels.size(), size_t(2 * 8 * 8 * 3));
  opt.strict = true;
  EXPECT_NE(error_of([&] { load_image_folder(dir, opt); }).find("broken.png"), std::string::npos);
  io::write_file_atomic(dir + "/metadata.jsonl", "{\"file_name\": \"../etc/passwd\"}\n");
  EXPECT_NE(error_of([&] { load_image_folder(dir, opt); }).find("must be a path inside the folder"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_image_folder(dir + "/img", opt); }).find("needs metadata.jsonl"), std::string::npos);
}

TEST(ImageDataset, FashionMnistLabelsAndCaptions) {
  if (!fs::exists(kFashionMnistDir)) GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const ImageDataset ds = load_fashion_mnist(kFashionMnistDir, "train", 32, 10);
  ASSERT_EQ(ds.count(), 10);
  // The well-known first labels of the training set.
  EXPECT_EQ(ds.labels, (std::vector<int32_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5}));
  EXPECT_EQ(ds.captions[0], "a photo of a ankle boot");
  EXPECT_EQ(ds.captions[3], "a photo of a dress");
  EXPECT_EQ(ds.channels, 1);
  EXPECT_EQ(ds.pixels.size(), size_t(10 * 32 * 32));
  // Mostly black background: the corner pixel is -1.
  EXPECT_NEAR(ds.image(0)[0], -1.0f, 1e-6);
  const ImageDataset test = load_fashion_mnist(kFashionMnistDir, "test", 28, 3);
  EXPECT_EQ(test.count(), 3);
}

}  // namespace
}  // namespace hyperion::diffusion
