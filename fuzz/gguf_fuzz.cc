// libFuzzer: GGUF. The first byte picks the case:
//   even: the reader on raw bytes (every structural check), then dequantize each tensor;
//   odd:  a round trip: keys and tensors built from the bytes are written with GgufWriter
//         and read back with GgufFile; every value must come back (f32 exactly, f16 and
//         q8_0 within their rounding).
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "fuzz_util.h"
#include "io/gguf.h"

namespace {

using namespace hyperion;

void read_raw(const uint8_t* data, size_t size) {
  fuzz::MemoryFile file(data, size);
  try {
    const io::GgufFile f = io::GgufFile::open(file.path());
    for (const std::string& k : f.keys()) (void)f.type(k);
    for (const io::GgufTensor& t : f.tensors()) {
      if (t.shape.numel() > (int64_t{1} << 22)) continue;  // (bounded by the file anyway)
      try {
        (void)f.dequantize(t.name);
      } catch (const Error&) {
      }
    }
  } catch (const Error&) {
  }
}

void round_trip(fuzz::Bytes in) {
  io::GgufWriter w;
  // The value each key must read back as: the last one set (a repeated key is replaced).
  struct Value {
    bool is_u32;
    uint32_t u32;
    std::string text;
  };
  std::map<std::string, Value> want;
  struct Tensor {
    std::string name;
    Shape shape;
    io::GgmlType type;
    std::vector<float> values;
  };
  std::vector<Tensor> tensors;
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("hyperion-gguf-fuzz-" + std::to_string(::getpid())))
                              .string();
  const std::string path = dir + "/m.gguf";
  try {
    const int nkeys = in.take<uint8_t>() % 6;
    for (int i = 0; i < nkeys; ++i) {
      const std::string key = "k" + std::to_string(in.take<uint8_t>() % 4) + "." + in.take_string(12);
      if (in.take<uint8_t>() % 2) {
        const uint32_t v = in.take<uint32_t>();
        w.set_u32(key, v);
        want[key] = Value{true, v, ""};
      } else {
        const std::string v = in.take_string(40);
        w.set_string(key, v);
        want[key] = Value{false, 0, v};
      }
    }
    const int ntensors = in.take<uint8_t>() % 4;
    for (int i = 0; i < ntensors; ++i) {
      Tensor t;
      t.name = "t" + std::to_string(i);
      const int64_t rows = 1 + in.take<uint8_t>() % 4;
      const int pick = in.take<uint8_t>() % 3;
      t.type = pick == 0   ? io::GgmlType::kF32
               : pick == 1 ? io::GgmlType::kF16
                           : io::GgmlType::kQ8_0;
      const int64_t cols = t.type == io::GgmlType::kQ8_0 ? 32 : 1 + in.take<uint8_t>() % 40;
      t.shape = Shape{rows, cols};
      for (int64_t j = 0; j < rows * cols; ++j)
        t.values.push_back(static_cast<float>(in.take<int16_t>()) / 256.0f);
      tensors.push_back(std::move(t));
    }
    for (const Tensor& t : tensors) w.add_tensor(t.name, t.shape, t.values.data(), t.type);
    std::filesystem::create_directories(dir);
    w.write(path);
  } catch (const Error&) {
    return;  // a key the format cannot hold (refused by name): nothing to read back
  }
  // What the writer accepted must read back, value for value.
  const io::GgufFile f = io::GgufFile::open(path);
  for (const auto& [key, v] : want) {
    if (!f.has(key)) __builtin_trap();
    if (v.is_u32 ? f.get_u32(key) != v.u32 : f.get_string(key) != v.text) __builtin_trap();
  }
  for (const Tensor& t : tensors) {
    const std::vector<float> back = f.dequantize(t.name);
    if (back.size() != t.values.size()) __builtin_trap();
    float amax = 0;
    for (float v : t.values) amax = std::max(amax, std::fabs(v));
    for (size_t j = 0; j < back.size(); ++j) {
      const float want_v = t.values[j], err = std::fabs(back[j] - want_v);
      // f16: 11 significant bits; q8_0: half a step of amax/127, plus the f16 scale's error.
      const float tol = t.type == io::GgmlType::kF32   ? 0.0f
                        : t.type == io::GgmlType::kF16 ? std::fabs(want_v) * 1e-3f
                                                       : amax / 127.0f * 0.5f + amax * 2e-3f;
      if (!(err <= tol)) __builtin_trap();
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  if (data[0] % 2 == 0)
    read_raw(data + 1, size - 1);
  else
    round_trip(fuzz::Bytes(data + 1, size - 1));
  return 0;
}
