#include "diffusion/image_dataset.h"

#include <nlohmann/json.hpp>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "base/error.h"
#include "base/line_reader.h"
#include "base/log.h"

namespace hyperion::diffusion {

const std::vector<std::string>& fashion_mnist_classes() {
  static const std::vector<std::string> names = {"t-shirt", "trouser", "pullover", "dress", "coat",
                                                 "sandal",  "shirt",   "sneaker",  "bag",   "ankle boot"};
  return names;
}

std::string fashion_mnist_caption(int32_t label) {
  HYP_CHECK(label >= 0 && label < 10, "Fashion-MNIST label {} outside [0, 10)", label);
  return "a photo of a " + fashion_mnist_classes()[size_t(label)];
}

namespace {

// PIL's bilinear resampling weights along one axis (a triangle filter, widened by the
// scale when shrinking so every source pixel contributes): for each output index, the
// first source index and normalised weights.
struct AxisWeights {
  std::vector<int64_t> first;
  std::vector<std::vector<double>> w;
};

AxisWeights bilinear_weights(int64_t in, int64_t out, double offset, double span) {
  // Output pixel i covers source [offset + i * scale, offset + (i + 1) * scale).
  const double scale = span / double(out);
  const double filterscale = std::max(scale, 1.0);
  const double support = filterscale;
  AxisWeights a;
  for (int64_t i = 0; i < out; ++i) {
    const double center = offset + (double(i) + 0.5) * scale;
    const int64_t lo = std::max<int64_t>(int64_t(std::floor(center - support + 0.5)), 0);
    const int64_t hi = std::min<int64_t>(int64_t(std::floor(center + support + 0.5)), in);
    std::vector<double> w;
    double total = 0.0;
    for (int64_t k = lo; k < hi; ++k) {
      const double x = (double(k) - center + 0.5) / filterscale;
      const double v = std::max(0.0, 1.0 - std::fabs(x));
      w.push_back(v);
      total += v;
    }
    if (total <= 0.0) {  // degenerate: nearest pixel
      const int64_t k = std::clamp<int64_t>(int64_t(center), 0, in - 1);
      a.first.push_back(k);
      a.w.push_back({1.0});
      continue;
    }
    for (double& v : w) v /= total;
    a.first.push_back(lo);
    a.w.push_back(std::move(w));
  }
  return a;
}

}  // namespace

void resize_center_crop(const io::Image& image, int64_t resolution, int64_t channels,
                        bool center_crop, float* out) {
  HYP_CHECK(resolution > 0 && resolution <= 8192, "image resolution {} outside [1, 8192]", resolution);
  HYP_CHECK(channels == 1 || channels == 3, "image channels {} (1 or 3)", channels);
  const int64_t w = image.width, h = image.height, c = image.channels;
  // The region of the source that maps onto the square, in source pixels: the resize of
  // the shorter side to `resolution` then a centered crop is the same as resampling the
  // centered square-ish window (crop offsets rounded in the resized image, as torchvision).
  double x0 = 0, y0 = 0, span_x = double(w), span_y = double(h);
  if (center_crop) {
    const int64_t rw = w <= h ? resolution : int64_t(double(resolution) * double(w) / double(h));
    const int64_t rh = h <= w ? resolution : int64_t(double(resolution) * double(h) / double(w));
    const double left = std::round(double(rw - resolution) / 2.0), top = std::round(double(rh - resolution) / 2.0);
    // The resized image has rw x rh pixels, each covering w / rw source pixels.
    const double sx = double(w) / double(rw), sy = double(h) / double(rh);
    x0 = left * sx;
    y0 = top * sy;
    span_x = double(resolution) * sx;
    span_y = double(resolution) * sy;
  }
  const AxisWeights ax = bilinear_weights(w, resolution, x0, span_x);
  const AxisWeights ay = bilinear_weights(h, resolution, y0, span_y);
  // Horizontal pass into [h, resolution, c] doubles, then vertical.
  std::vector<double> tmp(size_t(h * resolution * c));
  for (int64_t y = 0; y < h; ++y)
    for (int64_t i = 0; i < resolution; ++i)
      for (int64_t ch = 0; ch < c; ++ch) {
        double acc = 0.0;
        for (size_t k = 0; k < ax.w[size_t(i)].size(); ++k)
          acc += ax.w[size_t(i)][k] * image.pixels[size_t((y * w + ax.first[size_t(i)] + int64_t(k)) * c + ch)];
        tmp[size_t((y * resolution + i) * c + ch)] = acc;
      }
  for (int64_t j = 0; j < resolution; ++j)
    for (int64_t i = 0; i < resolution; ++i) {
      double px[4] = {0, 0, 0, 0};
      for (int64_t ch = 0; ch < c; ++ch)
        for (size_t k = 0; k < ay.w[size_t(j)].size(); ++k)
          px[ch] += ay.w[size_t(j)][k] * tmp[size_t(((ay.first[size_t(j)] + int64_t(k)) * resolution + i) * c + ch)];
      float* o = out + (j * resolution + i) * channels;
      const int64_t color = std::min<int64_t>(c, 3);
      for (int64_t ch = 0; ch < channels; ++ch) {
        double v;
        if (channels == 1) {
          v = 0.0;
          for (int64_t k = 0; k < color; ++k) v += px[k];
          v /= double(color);
        } else {
          v = px[c == 1 ? 0 : ch];
        }
        o[ch] = float(std::clamp(v, 0.0, 255.0) / 127.5 - 1.0);
      }
    }
}

io::Image to_image(const float* pixels, int64_t height, int64_t width, int64_t channels) {
  io::Image img;
  img.width = width;
  img.height = height;
  img.channels = channels;
  img.pixels.resize(img.bytes());
  for (size_t i = 0; i < img.pixels.size(); ++i) {
    const double v = std::isfinite(pixels[i]) ? (double(pixels[i]) + 1.0) * 127.5 : 0.0;
    img.pixels[i] = uint8_t(std::lround(std::clamp(v, 0.0, 255.0)));
  }
  return img;
}

ImageDataset load_image_folder(const std::string& dir, const ImageFolderOptions& opt) {
  namespace fs = std::filesystem;
  const std::string meta = (fs::path(dir) / "metadata.jsonl").string();
  HYP_CHECK(fs::exists(meta), "{}: an image folder needs metadata.jsonl (lines of {{\"file_name\", \"text\"}})",
            dir);
  ImageDataset ds;
  ds.resolution = opt.resolution;
  ds.channels = opt.channels;
  const int64_t per_image = opt.resolution * opt.resolution * opt.channels;
  LineReader lines(meta, size_t(1) << 20);
  std::string_view line;
  int64_t line_no = 0;
  for (LineReader::Status st; (st = lines.next(line)) != LineReader::Status::kEnd;) {
    line_no = lines.line_number();
    HYP_CHECK(st == LineReader::Status::kLine, "{}:{}: line longer than 1 MiB", meta, line_no);
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("{}:{}: not a JSON object ({})", meta, line_no, e.what());
    }
    HYP_CHECK(j.is_object() && j.contains("file_name") && j["file_name"].is_string(),
              "{}:{}: needs a string \"file_name\"", meta, line_no);
    const std::string caption = j.contains("text") && j["text"].is_string() ? j["text"].get<std::string>() : "";
    const std::string name = j["file_name"].get<std::string>();
    HYP_CHECK(!name.empty() && name[0] != '/' && name.find("..") == std::string::npos,
              "{}:{}: file_name '{}' must be a path inside the folder", meta, line_no, name);
    const std::string path = (fs::path(dir) / name).string();
    io::Image img;
    try {
      img = io::read_image(path);
    } catch (const Error& e) {
      if (opt.strict) throw;
      log_warn("skipping {}: {}", path, e.what());
      ds.skipped.push_back(e.what());
      continue;
    }
    ds.pixels.resize(ds.pixels.size() + size_t(per_image));
    resize_center_crop(img, opt.resolution, opt.channels, opt.center_crop,
                       ds.pixels.data() + ds.pixels.size() - size_t(per_image));
    ds.captions.push_back(caption);
    ds.labels.push_back(-1);
    if (opt.limit > 0 && ds.count() >= opt.limit) break;
  }
  HYP_CHECK(ds.count() > 0, "{}: no readable image ({} skipped)", meta, ds.skipped.size());
  return ds;
}

namespace {

// The bytes of a gzip'd (or plain) file, at most max_bytes.
std::string read_gzip(const std::string& path, size_t max_bytes) {
  gzFile f = gzopen(path.c_str(), "rb");
  HYP_CHECK(f != nullptr, "{}: cannot open (is the dataset-fashion-mnist package installed?)", path);
  std::string out;
  char buf[1 << 16];
  while (out.size() < max_bytes) {
    const int n = gzread(f, buf, unsigned(std::min(sizeof(buf), max_bytes - out.size())));
    if (n < 0) {
      int err = 0;
      const std::string msg = gzerror(f, &err);
      gzclose(f);
      fail("{}: corrupt gzip data ({})", path, msg);
    }
    if (n == 0) break;
    out.append(buf, size_t(n));
  }
  gzclose(f);
  return out;
}

uint32_t be32(const std::string& b, size_t at) {
  return uint32_t(uint8_t(b[at])) << 24 | uint32_t(uint8_t(b[at + 1])) << 16 |
         uint32_t(uint8_t(b[at + 2])) << 8 | uint32_t(uint8_t(b[at + 3]));
}

}  // namespace

ImageDataset load_fashion_mnist(const std::string& dir, const std::string& split, int64_t resolution,
                                int64_t limit) {
  namespace fs = std::filesystem;
  HYP_CHECK(split == "train" || split == "test", "Fashion-MNIST split '{}' (train or test)", split);
  const std::string prefix = split == "train" ? "train" : "t10k";
  auto path_of = [&](const char* kind) {
    for (const char* ext : {".gz", ""}) {
      const std::string p = (fs::path(dir) / (prefix + "-" + kind + "-idx" + (kind[0] == 'i' ? "3" : "1") +
                                                "-ubyte" + ext)).string();
      if (fs::exists(p)) return p;
    }
    fail("{}: no {}-{}-idx*-ubyte[.gz] (install Debian's dataset-fashion-mnist)", dir, prefix, kind);
  };
  const std::string images_path = path_of("images"), labels_path = path_of("labels");
  const int64_t want = limit > 0 ? limit : 60000;
  const std::string labels = read_gzip(labels_path, size_t(8 + want));
  HYP_CHECK(labels.size() >= 8 && be32(labels, 0) == 0x801, "{}: not an idx1 label file", labels_path);
  const int64_t n_labels = int64_t(be32(labels, 4));
  const std::string images = read_gzip(images_path, size_t(16 + want * 28 * 28));
  HYP_CHECK(images.size() >= 16 && be32(images, 0) == 0x803, "{}: not an idx3 image file", images_path);
  const int64_t n_images = int64_t(be32(images, 4)), rows = be32(images, 8), cols = be32(images, 12);
  HYP_CHECK(n_images == n_labels, "{} holds {} images but {} holds {} labels", images_path, n_images,
            labels_path, n_labels);
  HYP_CHECK(rows > 0 && cols > 0 && rows * cols <= 4096, "{}: images of {}x{}", images_path, rows, cols);
  const int64_t count = std::min<int64_t>({n_images, want, int64_t((images.size() - 16) / size_t(rows * cols)),
                                          int64_t(labels.size() - 8)});
  ImageDataset ds;
  ds.resolution = resolution;
  ds.channels = 1;
  ds.pixels.resize(size_t(count * resolution * resolution));
  io::Image img;
  img.width = cols;
  img.height = rows;
  img.channels = 1;
  for (int64_t i = 0; i < count; ++i) {
    const int32_t label = int32_t(uint8_t(labels[size_t(8 + i)]));
    HYP_CHECK(label < 10, "{}: label {} at index {} outside [0, 10)", labels_path, label, i);
    img.pixels.assign(images.begin() + 16 + i * rows * cols, images.begin() + 16 + (i + 1) * rows * cols);
    resize_center_crop(img, resolution, 1, true, ds.pixels.data() + i * resolution * resolution);
    ds.captions.push_back(fashion_mnist_caption(label));
    ds.labels.push_back(label);
  }
  return ds;
}

}  // namespace hyperion::diffusion
