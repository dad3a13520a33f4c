#include "io/gguf.h"
#include "kernels/quantize.h"
#include "kernels/quantize_q8_0.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "../test_files.h"
#include "bpe_tokenizer_fixture.h"
#include "base/error.h"
#include "io/atomic_file.h"
#include "io/gguf_convert.h"
#include "io/safetensors.h"
#include "model/param_store.h"
#include "tensor/convert.h"

namespace hyperion::io {
namespace {

using namespace hyperion::testing_util;

namespace fs = std::filesystem;

// Runs fn under every SIMD target compiled into Highway and supported here.
template <typename Fn>
void for_each_target(Fn&& fn) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    SCOPED_TRACE(hwy::TargetName(target));
    hwy::SetSupportedTargetsForTest(target);
    fn();
  }
  hwy::SetSupportedTargetsForTest(0);
}

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// An independent GGUF serializer written from the format description, used to check the
// writer byte for byte and to build malformed files.
struct RawGguf {
  std::string magic = "GGUF";
  uint32_t version = 3;
  std::string kvs, infos, data;
  uint64_t n_kv = 0, n_tensors = 0;
  uint64_t alignment = 32;

  template <typename T>
  static void pod(std::string& o, T v) {
    o.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  static void str(std::string& o, const std::string& s) {
    pod<uint64_t>(o, s.size());
    o += s;
  }
  void kv(const std::string& key, uint32_t type, const std::string& payload) {
    str(kvs, key);
    pod<uint32_t>(kvs, type);
    kvs += payload;
    ++n_kv;
  }
  template <typename T>
  void kv_pod(const std::string& key, uint32_t type, T v) {
    std::string p;
    pod(p, v);
    kv(key, type, p);
  }
  void tensor(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type,
              uint64_t offset) {
    str(infos, name);
    pod<uint32_t>(infos, uint32_t(ne.size()));
    for (uint64_t d : ne) pod(infos, d);
    pod(infos, type);
    pod(infos, offset);
    ++n_tensors;
  }
  std::string bytes() const {
    std::string o = magic;
    pod(o, version);
    pod(o, n_tensors);
    pod(o, n_kv);
    o += kvs;
    o += infos;
    o.append((alignment - o.size() % alignment) % alignment, '\0');
    return o + data;
  }
};

TEST(Gguf, KeyValueRoundTripAllTypes) {
  TempDir dir;
  GgufWriter w;
  w.set<uint8_t>("t.u8", 250);
  w.set<int8_t>("t.i8", -100);
  w.set<uint16_t>("t.u16", 65000);
  w.set<int16_t>("t.i16", -30000);
  w.set_u32("t.u32", 4000000000u);
  w.set_i32("t.i32", -2000000000);
  w.set_f32("t.f32", 0.1f);
  w.set_bool("t.bool", true);
  w.set_string("t.string", std::string("h\xc3\xa9llo\0x", 8));
  w.set_u64("t.u64", 18000000000000000000ull);
  w.set<int64_t>("t.i64", -9000000000000000000ll);
  w.set<double>("t.f64", 3.141592653589793);
  w.set_array<uint8_t>("a.u8", {1, 2, 255});
  w.set_array<int8_t>("a.i8", {-1, 127});
  w.set_array<uint16_t>("a.u16", {7});
  w.set_array<int16_t>("a.i16", {-7, 8});
  w.set_array<uint32_t>("a.u32", {1, 4000000000u});
  w.set_i32_array("a.i32", {1, -2, 3});
  w.set_array<uint64_t>("a.u64", {1ull << 60});
  w.set_array<int64_t>("a.i64", {-(1ll << 60), 5});
  w.set_f32_array("a.f32", {1.5f, -0.25f});
  w.set_array<double>("a.f64", {1e300});
  w.set_array<bool>("a.bool", {true, false, true});
  w.set_string_array("a.string", {"a", "", "longer string"});
  w.set_f32_array("a.empty", {});
  w.set_u32("replaced", 1);
  w.set_string("replaced", "now a string");  // keeps its position
  const std::string path = dir.file("kv.gguf");
  w.write(path);

  GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_TRUE(f.tensors().empty());
  ASSERT_EQ(f.keys().size(), 26u);
  EXPECT_EQ(f.keys()[0], "t.u8");
  EXPECT_EQ(f.keys()[25], "replaced");
  EXPECT_EQ(f.get<uint8_t>("t.u8"), 250);
  EXPECT_EQ(f.get<int8_t>("t.i8"), -100);
  EXPECT_EQ(f.get<uint16_t>("t.u16"), 65000);
  EXPECT_EQ(f.get<int16_t>("t.i16"), -30000);
  EXPECT_EQ(f.get_u32("t.u32"), 4000000000u);
  EXPECT_EQ(f.get_i32("t.i32"), -2000000000);
  EXPECT_EQ(f.get_f32("t.f32"), 0.1f);
  EXPECT_TRUE(f.get_bool("t.bool"));
  EXPECT_EQ(f.get_string("t.string"), std::string("h\xc3\xa9llo\0x", 8));
  EXPECT_EQ(f.get_u64("t.u64"), 18000000000000000000ull);
  EXPECT_EQ(f.get<int64_t>("t.i64"), -9000000000000000000ll);
  EXPECT_EQ(f.get<double>("t.f64"), 3.141592653589793);
  EXPECT_EQ(f.get_array<uint8_t>("a.u8"), (std::vector<uint8_t>{1, 2, 255}));
  EXPECT_EQ(f.get_array<int8_t>("a.i8"), (std::vector<int8_t>{-1, 127}));
  EXPECT_EQ(f.get_array<uint16_t>("a.u16"), (std::vector<uint16_t>{7}));
  EXPECT_EQ(f.get_array<int16_t>("a.i16"), (std::vector<int16_t>{-7, 8}));
  EXPECT_EQ(f.get_array<uint32_t>("a.u32"), (std::vector<uint32_t>{1, 4000000000u}));
  EXPECT_EQ(f.get_i32_array("a.i32"), (std::vector<int32_t>{1, -2, 3}));
  EXPECT_EQ(f.get_array<uint64_t>("a.u64"), (std::vector<uint64_t>{1ull << 60}));
  EXPECT_EQ(f.get_array<int64_t>("a.i64"), (std::vector<int64_t>{-(1ll << 60), 5}));
  EXPECT_EQ(f.get_f32_array("a.f32"), (std::vector<float>{1.5f, -0.25f}));
  EXPECT_EQ(f.get_array<double>("a.f64"), (std::vector<double>{1e300}));
  EXPECT_EQ(f.get_array<bool>("a.bool"), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(f.get_string_array("a.string"), (std::vector<std::string>{"a", "", "longer string"}));
  EXPECT_TRUE(f.get_f32_array("a.empty").empty());
  EXPECT_EQ(f.get_string("replaced"), "now a string");
  EXPECT_EQ(f.type("t.f64"), GgufType::kF64);
  EXPECT_EQ(f.type("a.bool"), GgufType::kArray);
  EXPECT_EQ(f.array_type("a.string"), GgufType::kString);
  EXPECT_EQ(f.array_size("a.i32"), 3u);
  EXPECT_TRUE(f.has("a.u8"));
  EXPECT_FALSE(f.has("nope"));

  expect_error([&] { f.get_u32("t.i32"); }, {path, "'t.i32'", "i32", "u32"});
  expect_error([&] { f.get_f32_array("a.i32"); }, {path, "'a.i32'", "array of i32"});
  expect_error([&] { f.get_u32("a.u32"); }, {"'a.u32'", "array of u32", "expected u32"});
  expect_error([&] { f.get_string("missing.key"); }, {path, "'missing.key'", "not found"});
  expect_error([&] { f.array_type("t.u8"); }, {"'t.u8'", "not an array"});
  expect_error([&] { f.tensor("w"); }, {path, "'w'", "not found"});
}

// The writer's output equals an independent serialisation of the same content.
TEST(Gguf, WriterMatchesIndependentSerialisation) {
  TempDir dir;
  const std::vector<float> w1 = {1, 2, 3, 4, 5, 6};   // [2, 3] f32: 24 bytes, padded to 32
  const std::vector<float> w2 = {0.5f, -1.0f, 2.0f};  // [3] f16: 6 bytes
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 2);
  w.set_string_array("tokenizer.ggml.tokens", {"<s>", "a"});
  w.add_tensor("w1", {2, 3}, w1.data(), GgmlType::kF32);
  w.add_tensor("w2", {3}, w2.data(), GgmlType::kF16);
  const std::string path = dir.file("w.gguf");
  w.write(path);

  RawGguf r;
  std::string p;
  RawGguf::str(p, "llama");
  r.kv("general.architecture", 8, p);
  r.kv_pod<uint32_t>("llama.block_count", 4, 2);
  p.clear();
  RawGguf::pod<uint32_t>(p, 8);
  RawGguf::pod<uint64_t>(p, 2);
  RawGguf::str(p, "<s>");
  RawGguf::str(p, "a");
  r.kv("tokenizer.ggml.tokens", 9, p);
  r.tensor("w1", {3, 2}, 0, 0);  // ne is innermost-first
  r.tensor("w2", {3}, 1, 32);
  r.data.append(reinterpret_cast<const char*>(w1.data()), 24);
  r.data.append(8, '\0');
  for (float v : w2) RawGguf::pod(r.data, f32_to_f16(v).bits);
  r.data.append(26, '\0');
  EXPECT_EQ(read_file(path), r.bytes());
}

TEST(Gguf, TensorRoundTripAllTypesAndAlignment) {
  TempDir dir;
  std::mt19937 rng(3);
  struct Case {
    std::string name;
    Shape shape;
    GgmlType type;
  };
  const std::vector<Case> cases = {
      {"f32.1d", {7}, GgmlType::kF32},
      {"f16.2d", {5, 3}, GgmlType::kF16},
      {"bf16.3d", {2, 3, 5}, GgmlType::kBF16},
      {"q8.2d", {3, 64}, GgmlType::kQ8_0},
      {"q8.4d", {2, 1, 3, 32}, GgmlType::kQ8_0},
      {"f32.4d", {1, 2, 3, 4}, GgmlType::kF32},
      {"q8.big", {40, 4096}, GgmlType::kQ8_0},  // > one write chunk, several threads
      {"f16.big", {1 << 20 | 3}, GgmlType::kF16},
  };
  for (uint32_t alignment : {32u, 64u, 256u}) {
    SCOPED_TRACE(alignment);
    std::vector<std::vector<float>> data;
    GgufWriter w;
    w.set_u32("general.alignment", alignment);
    for (const auto& c : cases) {
      data.push_back(randn(size_t(c.shape.numel()), rng, 2.0f));
      w.add_tensor(c.name, c.shape, data.back().data(), c.type);
    }
    const std::string path = dir.file("t.gguf");
    w.write(path);
    GgufFile f = GgufFile::open(path);
    EXPECT_EQ(f.alignment(), alignment);
    EXPECT_EQ(f.data_offset() % alignment, 0u);
    ASSERT_EQ(f.tensors().size(), cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      const auto& c = cases[i];
      SCOPED_TRACE(c.name);
      const GgufTensor& t = f.tensors()[i];
      EXPECT_EQ(&t, &f.tensor(c.name));
      EXPECT_EQ(t.name, c.name);
      EXPECT_EQ(t.shape, c.shape);
      EXPECT_EQ(t.type, c.type);
      EXPECT_EQ(t.offset % alignment, 0u);
      EXPECT_EQ(t.nbytes, ggml_nbytes(c.type, c.shape.numel()));
      const int64_t n = c.shape.numel();
      std::vector<float> expect(static_cast<size_t>(n));
      const float* x = data[i].data();
      switch (c.type) {
        case GgmlType::kF32:
          expect = data[i];
          break;
        case GgmlType::kF16:
          for (int64_t k = 0; k < n; ++k) expect[k] = f16_to_f32(f32_to_f16(x[k]));
          break;
        case GgmlType::kBF16:
          for (int64_t k = 0; k < n; ++k) expect[k] = bf16_to_f32(f32_to_bf16(x[k]));
          break;
        case GgmlType::kQ8_0: {
          std::vector<unsigned char> q(ggml_nbytes(c.type, n));
          ref::quantize_row_q8_0(x, q.data(), n);
          EXPECT_EQ(std::memcmp(q.data(), t.data, q.size()), 0);
          ref::dequantize_row_q8_0(q.data(), expect.data(), n);
          break;
        }
      }
      const std::vector<float> got = f.dequantize(c.name);
      ASSERT_EQ(got.size(), expect.size());
      EXPECT_EQ(std::memcmp(got.data(), expect.data(), got.size() * 4), 0);
    }
  }
}

// ne[] in the file is the reverse of the row-major shape.
TEST(Gguf, DimsAreStoredInnermostFirst) {
  TempDir dir;
  std::vector<float> x(2 * 3 * 64, 1.0f);
  GgufWriter w;
  w.add_tensor("abc", {2, 3, 64}, x.data(), GgmlType::kF32);
  w.write(dir.file("d.gguf"));
  const std::string bytes = read_file(dir.file("d.gguf"));
  const size_t at = bytes.find("abc");
  ASSERT_NE(at, std::string::npos);
  uint32_t n_dims;
  uint64_t ne[3];
  std::memcpy(&n_dims, bytes.data() + at + 3, 4);
  std::memcpy(ne, bytes.data() + at + 7, 24);
  EXPECT_EQ(n_dims, 3u);
  EXPECT_EQ(ne[0], 64u);
  EXPECT_EQ(ne[1], 3u);
  EXPECT_EQ(ne[2], 2u);
  EXPECT_EQ(GgufFile::open(dir.file("d.gguf")).tensor("abc").shape, Shape({2, 3, 64}));
}

TEST(Gguf, ProducerTensorsAndWriterErrors) {
  TempDir dir;
  const std::string path = dir.file("p.gguf");
  GgufWriter w;
  w.add_tensor(
      "made", {2, 32},
      [](float* dst) {
        for (int i = 0; i < 64; ++i) dst[i] = float(i);
      },
      GgmlType::kF32);
  w.write(path);
  const std::vector<float> got = GgufFile::open(path).dequantize("made");
  for (int i = 0; i < 64; ++i) EXPECT_EQ(got[i], float(i));

  // A failing producer aborts the write; the previous file stays.
  GgufWriter bad;
  bad.add_tensor(
      "broken", {4}, [](float*) { fail("source checkpoint is truncated"); }, GgmlType::kF32);
  expect_error([&] { bad.write(path); }, {path, "'broken'", "truncated"});
  EXPECT_EQ(GgufFile::open(path).tensors().size(), 1u);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 1);

  std::vector<float> x(64);
  GgufWriter e;
  expect_error([&] { e.add_tensor(std::string(64, 'n'), {4}, x.data(), GgmlType::kF32); },
               {"1 to 63 bytes"});
  expect_error(
      [&] {
        e.add_tensor("r5", {1, 1, 1, 1, 4}, x.data(), GgmlType::kF32);
      },
      {"'r5'", "rank"});
  expect_error([&] { e.add_tensor("r0", {}, x.data(), GgmlType::kF32); }, {"'r0'", "rank"});
  expect_error(
      [&] {
        e.add_tensor("q", {2, 33}, x.data(), GgmlType::kQ8_0);
      },
      {"'q'", "q8_0", "multiple of 32"});
  expect_error([&] { e.add_tensor("t", {4}, x.data(), static_cast<GgmlType>(2)); },
               {"'t'", "unsupported"});
  e.add_tensor("dup", {4}, x.data(), GgmlType::kF32);
  expect_error([&] { e.add_tensor("dup", {4}, x.data(), GgmlType::kF32); }, {"duplicate", "'dup'"});
  e.set_u32("general.alignment", 48);
  expect_error([&] { e.write(dir.file("e.gguf")); }, {"general.alignment", "48", "power of two"});
  e.set_i32("general.alignment", 64);
  expect_error([&] { e.write(dir.file("e.gguf")); }, {"general.alignment", "u32"});
}

// ---- Q8_0 ----

TEST(GgufQ8_0, MatchesLlamaCppReferenceOnKnownBlock) {
  // amax = 127 -> d = 1 exactly: the quantised values are roundf(x), ties away from zero.
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;
  x[1] = 2.5f;
  x[2] = -2.5f;
  x[3] = 0.49f;
  x[4] = -0.5f;
  x[5] = 126.5f;
  x[6] = -127.0f;
  x[7] = 3.4999f;
  const int8_t want[8] = {127, 3, -3, 0, -1, 127, -127, 3};
  for_each_target([&] {
    unsigned char q[34];
    quantize_row_q8_0(x.data(), q, 32);
    uint16_t d;
    std::memcpy(&d, q, 2);
    EXPECT_EQ(d, 0x3C00);  // f16 1.0
    for (int j = 0; j < 8; ++j) EXPECT_EQ(int8_t(q[2 + j]), want[j]) << j;
    for (int j = 8; j < 32; ++j) EXPECT_EQ(q[2 + j], 0);
  });
}

TEST(GgufQ8_0, SimdEqualsScalarReferenceAndErrorBound) {
  std::mt19937 rng(11);
  for (int64_t nblocks : {1, 2, 7, 17, 100, 5000}) {
    SCOPED_TRACE(nblocks);
    const int64_t n = nblocks * 32;
    std::vector<float> x = randn(size_t(n), rng, 3.0f);
    if (nblocks > 2) {
      for (int j = 0; j < 32; ++j) x[32 + j] = 0.0f;  // all-zero block: d = 0
      x[70] = 1e4f;                                   // one outlier dominates its block
      x[100] = std::numeric_limits<float>::quiet_NaN();
      for (int j = 0; j < 32; ++j) x[128 + j] = float(j - 16) * 0.5f;
      // d = 1 exactly, so x * id lands on exact halves: ties round away from zero.
      x[160] = 127.0f;
      for (int j = 1; j < 32; ++j) x[160 + j] = (j % 2 ? 1.0f : -1.0f) * (float(j) + 0.5f);
    }
    std::vector<unsigned char> want(size_t(nblocks) * 34), got(want.size());
    ref::quantize_row_q8_0(x.data(), want.data(), n);
    std::vector<float> deq_want(static_cast<size_t>(n)), deq_got(static_cast<size_t>(n));
    ref::dequantize_row_q8_0(want.data(), deq_want.data(), n);
    for_each_target([&] {
      std::fill(got.begin(), got.end(), 0xAB);
      quantize_row_q8_0(x.data(), got.data(), n);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0);
      dequantize_row_q8_0(want.data(), deq_got.data(), n);
      EXPECT_EQ(std::memcmp(deq_got.data(), deq_want.data(), size_t(n) * 4), 0);
    });
    // |x - deq| <= d/2 (rounding) + 127 |d - d16| (d stored as f16) + float slack.
    for (int64_t b = 0; b < nblocks; ++b) {
      float amax = 0.0f;
      bool has_nan = false;
      for (int j = 0; j < 32; ++j) {
        const float v = x[b * 32 + j];
        if (std::isnan(v))
          has_nan = true;
        else
          amax = std::max(amax, std::fabs(v));
      }
      const float d = amax / 127.0f;
      uint16_t dbits;
      std::memcpy(&dbits, want.data() + b * 34, 2);
      const float d16 = f16_to_f32(f16{dbits});
      const double bound = d / 2.0 + 127.0 * std::fabs(double(d) - d16) + 1e-6 * amax;
      for (int j = 0; j < 32; ++j) {
        const float v = x[b * 32 + j];
        if (std::isnan(v)) {
          EXPECT_EQ(deq_want[b * 32 + j], 0.0f);
          continue;
        }
        ASSERT_LE(std::fabs(double(v) - deq_want[b * 32 + j]), bound)
            << "block " << b << " j " << j << (has_nan ? " (nan block)" : "");
      }
    }
  }
  // A block so small that 1/d overflows to inf: +-inf saturate to 127/-128, 0 * inf = NaN
  // gives 0, identically on every path.
  {
    std::vector<float> tiny(32, 0.0f);
    tiny[0] = 1e-39f;
    tiny[1] = -1e-39f;
    tiny[2] = 5e-40f;
    unsigned char want[34], got[34];
    ref::quantize_row_q8_0(tiny.data(), want, 32);
    EXPECT_EQ(int8_t(want[2]), 127);
    EXPECT_EQ(int8_t(want[3]), -128);
    EXPECT_EQ(int8_t(want[5]), 0);
    for_each_target([&] {
      quantize_row_q8_0(tiny.data(), got, 32);
      EXPECT_EQ(std::memcmp(got, want, 34), 0);
    });
  }
  std::vector<float> x(33);
  std::vector<unsigned char> q(68);
  EXPECT_THROW(quantize_row_q8_0(x.data(), q.data(), 33), Error);
  EXPECT_THROW(dequantize_row_q8_0(q.data(), x.data(), 31), Error);
}

// ---- malformed files ----

// A valid little file: two KVs and two tensors, built by RawGguf so each field can be
// broken independently.
struct Spec {
  std::string magic = "GGUF";
  uint32_t version = 3;
  uint32_t kv_type = 4;   // of "general.alignment"-free key "a.key" (u32)
  uint32_t arr_elem = 6;  // element type of the array "a.arr"
  uint64_t arr_count = 2;
  uint32_t t1_type = 0;  // ggml type of tensor "w1"
  std::vector<uint64_t> t1_ne = {32, 2};
  uint64_t t2_offset = 256;  // of tensor "w2" (w1 is 256 bytes)
  std::string t2_name = "w2";
  std::string key2 = "a.arr";
  bool add_alignment = false;
  uint32_t alignment_type = 4;
  uint32_t alignment = 32;
  uint64_t data_bytes = 256 + 128;
};

std::string build(const Spec& s) {
  RawGguf r;
  r.magic = s.magic;
  r.version = s.version;
  r.kv_pod<uint32_t>("a.key", s.kv_type, 7);
  std::string p;
  RawGguf::pod<uint32_t>(p, s.arr_elem);
  RawGguf::pod<uint64_t>(p, s.arr_count);
  RawGguf::pod<float>(p, 1.0f);
  RawGguf::pod<float>(p, 2.0f);
  r.kv(s.key2, 9, p);
  if (s.add_alignment) {
    r.kv_pod<uint32_t>("general.alignment", s.alignment_type, s.alignment);
    r.alignment = s.alignment;
  }
  r.tensor("w1", s.t1_ne, s.t1_type, 0);
  r.tensor(s.t2_name, {32}, 0, s.t2_offset);
  r.data.assign(s.data_bytes, '\0');
  return r.bytes();
}

TEST(GgufCorrupt, BaselineIsValid) {
  TempDir dir;
  write_bytes(dir.file("ok.gguf"), build(Spec{}));
  GgufFile f = GgufFile::open(dir.file("ok.gguf"));
  EXPECT_EQ(f.get_u32("a.key"), 7u);
  EXPECT_EQ(f.get_f32_array("a.arr"), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_EQ(f.tensor("w1").shape, Shape({2, 32}));
  EXPECT_EQ(f.tensor("w2").offset, 256u);
}

TEST(GgufCorrupt, EveryTruncationIsRejected) {
  TempDir dir;
  const std::string full = build(Spec{});
  const std::string path = dir.file("trunc.gguf");
  // Every prefix that cuts into the header or the tensors' data must fail cleanly.
  const size_t data_end = full.size();  // w2 ends exactly at the end of the file
  for (size_t len = 0; len < data_end; ++len) {
    write_bytes(path, full.substr(0, len));
    try {
      GgufFile::open(path);
      ADD_FAILURE() << "prefix of " << len << " bytes was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
}

TEST(GgufCorrupt, MalformedFieldsAreRejected) {
  TempDir dir;
  const std::string path = dir.file("bad.gguf");
  auto check = [&](const Spec& s, std::vector<std::string> needles) {
    write_bytes(path, build(s));
    needles.push_back("gguf: " + path);
    expect_error([&] { GgufFile::open(path); }, needles);
  };
  Spec s;
  s.magic = "GGML";
  check(s, {"bad magic"});
  s = Spec{};
  s.version = 1;
  check(s, {"version 1"});
  s.version = 4;
  check(s, {"version 4"});
  s = Spec{};
  s.kv_type = 13;
  check(s, {"key 'a.key'", "unknown value type 13"});
  s = Spec{};
  s.arr_elem = 77;
  check(s, {"key 'a.arr'", "unknown array element type 77"});
  s.arr_elem = 9;
  check(s, {"key 'a.arr'", "nested arrays"});
  s = Spec{};
  s.arr_count = uint64_t{1} << 62;  // absurd count: truncation, not a giant allocation
  check(s, {"key 'a.arr'", "truncated"});
  s.arr_elem = 8;
  check(s, {"key 'a.arr'", "truncated"});
  s = Spec{};
  s.key2 = "a.key";
  check(s, {"'a.key'", "duplicate key"});
  s = Spec{};
  s.t2_name = "w1";
  check(s, {"tensor 'w1'", "duplicate tensor"});
  s.t2_name = std::string(64, 'x');
  check(s, {"1 to 63 bytes"});
  s = Spec{};
  s.t1_type = 2;
  check(s, {"tensor 'w1'", "unsupported ggml type 2 (q4_0)"});
  s.t1_type = 1000;
  check(s, {"tensor 'w1'", "1000"});
  s = Spec{};
  s.t1_ne = {};
  check(s, {"tensor 'w1'", "n_dims = 0"});
  s.t1_ne = {1, 1, 1, 1, 64};
  check(s, {"tensor 'w1'", "n_dims = 5"});
  s.t1_ne = {1ull << 40, 1ull << 40};
  check(s, {"tensor 'w1'", "overflow"});
  s = Spec{};
  s.t1_type = 8;
  s.t1_ne = {33, 1};
  check(s, {"tensor 'w1'", "row length 33", "q8_0"});
  s = Spec{};
  s.t2_offset = 250;
  check(s, {"tensor 'w2'", "offset 250", "alignment"});
  s.t2_offset = 1 << 20;
  check(s, {"tensor 'w2'", "past the end"});
  s.t2_offset = 224;
  check(s, {"tensor 'w2'", "overlaps tensor 'w1'"});
  s = Spec{};
  s.data_bytes = 300;
  check(s, {"tensor 'w2'", "past the end", "truncated"});
  s = Spec{};
  s.add_alignment = true;
  s.alignment = 24;
  check(s, {"general.alignment", "24", "power of two"});
  s.alignment_type = 5;
  s.alignment = 32;
  check(s, {"general.alignment", "i32", "u32"});
  expect_error([&] { GgufFile::open(dir.file("missing.gguf")); }, {dir.file("missing.gguf")});

  // A string whose length runs past the end of the file.
  RawGguf r;
  std::string p;
  RawGguf::pod<uint64_t>(p, ~uint64_t{0});
  r.kv("s", 8, p);
  write_bytes(path, r.bytes());
  expect_error([&] { GgufFile::open(path); }, {path, "key 's'", "truncated"});
}

TEST(GgufCorrupt, CustomAlignmentIsHonoured) {
  TempDir dir;
  Spec s;
  s.add_alignment = true;
  s.alignment = 128;
  write_bytes(dir.file("a.gguf"), build(s));
  GgufFile f = GgufFile::open(dir.file("a.gguf"));
  EXPECT_EQ(f.alignment(), 128u);
  EXPECT_EQ(f.data_offset() % 128, 0u);
  s.t2_offset = 320;  // multiple of 32 but not of 128
  write_bytes(dir.file("b.gguf"), build(s));
  expect_error([&] { GgufFile::open(dir.file("b.gguf")); }, {"tensor 'w2'", "alignment 128"});
}

// ---- checkpoint conversion ----

// A SentencePiece BPE model (vocab 300, byte fallback) trained once on generated text.
class ConvertTest : public ::testing::Test {
 protected:
  static constexpr int kSpVocab = 300;

  static void SetUpTestSuite() {
    tok_dir_ = fs::temp_directory_path() / fmt::format("hyp_gguf_tok_{}", ::getpid());
    fs::remove_all(tok_dir_);
    fs::create_directories(tok_dir_);
    const std::vector<std::string> words = {
        "the",   "model", "learns", "tokens", "quickly", "from",     "small",  "batches",
        "of",    "text",  "while",  "heads",  "attend",  "to",       "every",  "position",
        "layer", "norm",  "scales", "hidden", "states",  "gradient", "flows",  "back",
        "zebra", "jumps", "over",   "lazy",   "dogs",    "vexing",   "quartz", "waltz"};
    std::mt19937 rng(5);
    std::string text;
    for (int line = 0; line < 400; ++line) {
      const int n = 4 + int(rng() % 10);
      for (int k = 0; k < n; ++k) text += (k ? " " : "") + words[rng() % words.size()];
      text += line % 7 == 0 ? ". 42!\n" : "\n";
    }
    const std::string corpus = (tok_dir_ / "corpus.txt").string();
    write_bytes(corpus, text);
    const auto status = sentencepiece::SentencePieceTrainer::Train(fmt::format(
        "--input={} --model_prefix={} --vocab_size={} --model_type=bpe --byte_fallback=true "
        "--character_coverage=1.0 --num_threads=1 --minloglevel=2 "
        "--normalization_rule_name=identity --remove_extra_whitespaces=false",
        corpus, (tok_dir_ / "tok").string(), kSpVocab));
    ASSERT_TRUE(status.ok()) << status.ToString();
    // SentencePiece's defaults (NFKC, whitespace collapsing): llama.cpp cannot reproduce
    // them, so converting a checkpoint with this tokenizer must fail.
    const auto nfkc = sentencepiece::SentencePieceTrainer::Train(fmt::format(
        "--input={} --model_prefix={} --vocab_size={} --model_type=bpe --byte_fallback=true "
        "--character_coverage=1.0 --num_threads=1 --minloglevel=2",
        corpus, (tok_dir_ / "nfkc").string(), kSpVocab));
    ASSERT_TRUE(nfkc.ok()) << nfkc.ToString();
  }
  static void TearDownTestSuite() { fs::remove_all(tok_dir_); }

  struct Options {
    int64_t vocab = 304;  // > kSpVocab: the converter pads with [PADi] tokens
    int64_t dim = 64, ff = 80, layers = 2, heads = 4, kv_heads = 2;
    int64_t head_dim = 0;  // > 0: written to config.json (else dim / heads, not written)
    bool tied = false;
    bool write_lm_head = true;  // only looked at when tied
    std::string drop;           // a tensor to leave out
    std::string reshape;        // a tensor to give a wrong shape
    std::string extra;          // an extra tensor to add
    std::string drop_key;       // a config key to leave out
    bool gemma = false;         // a GemmaForCausalLM checkpoint
    std::string model_type;     // "qwen2", "qwen3" or "" (llama / gemma as above)
    bool attention_bias = false;  // llama: biases on q, k, v and o
    nlohmann::json rope_scaling;  // written when not null
  };

  // Builds model.safetensors + config.json + tokenizer.model in dir.path / "ckpt".
  void make_checkpoint(const Options& o) {
    opt_ = o;
    ckpt_ = (dir_.path / "ckpt").string();
    fs::create_directories(ckpt_);
    fs::copy_file(tok_dir_ / "tok.model", fs::path(ckpt_) / "tokenizer.model",
                  fs::copy_options::overwrite_existing);
    const int64_t hd = o.head_dim > 0 ? o.head_dim : o.dim / o.heads;
    std::vector<std::pair<std::string, Shape>> spec = {
        {"model.embed_tokens.weight", {o.vocab, o.dim}}};
    for (int64_t i = 0; i < o.layers; ++i) {
      const std::string p = fmt::format("model.layers.{}.", i);
      spec.push_back({p + "input_layernorm.weight", {o.dim}});
      const bool qkv_bias = o.model_type == "qwen2" || o.attention_bias;
      spec.push_back({p + "self_attn.q_proj.weight", {o.heads * hd, o.dim}});
      if (qkv_bias) spec.push_back({p + "self_attn.q_proj.bias", {o.heads * hd}});
      spec.push_back({p + "self_attn.k_proj.weight", {o.kv_heads * hd, o.dim}});
      if (qkv_bias) spec.push_back({p + "self_attn.k_proj.bias", {o.kv_heads * hd}});
      spec.push_back({p + "self_attn.v_proj.weight", {o.kv_heads * hd, o.dim}});
      if (qkv_bias) spec.push_back({p + "self_attn.v_proj.bias", {o.kv_heads * hd}});
      if (o.model_type == "qwen3") {
        spec.push_back({p + "self_attn.q_norm.weight", {hd}});
        spec.push_back({p + "self_attn.k_norm.weight", {hd}});
      }
      spec.push_back({p + "self_attn.o_proj.weight", {o.dim, o.heads * hd}});
      if (o.attention_bias) spec.push_back({p + "self_attn.o_proj.bias", {o.dim}});
      spec.push_back({p + "post_attention_layernorm.weight", {o.dim}});
      spec.push_back({p + "mlp.gate_proj.weight", {o.ff, o.dim}});
      spec.push_back({p + "mlp.up_proj.weight", {o.ff, o.dim}});
      spec.push_back({p + "mlp.down_proj.weight", {o.dim, o.ff}});
    }
    spec.push_back({"model.norm.weight", {o.dim}});
    if (!o.tied || o.write_lm_head) spec.push_back({"lm_head.weight", {o.vocab, o.dim}});
    if (!o.extra.empty()) spec.push_back({o.extra, {4}});

    std::mt19937 rng(17);
    weights_.clear();
    bf16_store_.clear();
    SafetensorsWriter w;
    for (auto& [name, shape] : spec) {
      if (name == o.drop) continue;
      if (name == o.reshape) shape[0] += 2;
      std::vector<float> v = randn(size_t(shape.numel()), rng, 0.5f);
      // One tensor is stored as bf16 to exercise the conversion on read.
      if (name == "model.layers.1.mlp.gate_proj.weight") {
        auto& b = bf16_store_[name];
        b.resize(v.size());
        for (size_t k = 0; k < v.size(); ++k) {
          b[k] = f32_to_bf16(v[k]);
          v[k] = bf16_to_f32(b[k]);
        }
        weights_[name] = std::move(v);
        w.add(name, DType::kBF16, shape, b.data());
      } else {
        weights_[name] = std::move(v);
        w.add(name, DType::kF32, shape, weights_[name].data());
      }
    }
    w.set_metadata("format", "pt");
    w.write((fs::path(ckpt_) / "model.safetensors").string());

    nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}},
                          {"model_type", "llama"},
                          {"vocab_size", o.vocab},
                          {"hidden_size", o.dim},
                          {"intermediate_size", o.ff},
                          {"num_hidden_layers", o.layers},
                          {"num_attention_heads", o.heads},
                          {"num_key_value_heads", o.kv_heads},
                          {"rms_norm_eps", 1e-5},
                          {"rope_theta", 500000.0},
                          {"max_position_embeddings", 256},
                          {"tie_word_embeddings", o.tied},
                          {"bos_token_id", 1},
                          {"eos_token_id", 2},
                          {"torch_dtype", "float32"}};
    if (o.head_dim > 0) cfg["head_dim"] = o.head_dim;
    if (o.gemma) {
      cfg["architectures"] = {"GemmaForCausalLM"};
      cfg["model_type"] = "gemma";
      cfg["hidden_activation"] = "gelu_pytorch_tanh";
    }
    if (o.model_type == "qwen2" || o.model_type == "qwen3") {
      cfg["architectures"] = {o.model_type == "qwen2" ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM"};
      cfg["model_type"] = o.model_type;
    }
    if (o.attention_bias) cfg["attention_bias"] = true;
    if (!o.rope_scaling.is_null()) cfg["rope_scaling"] = o.rope_scaling;
    if (!o.drop_key.empty()) cfg.erase(o.drop_key);
    write_bytes((fs::path(ckpt_) / "config.json").string(), cfg.dump(2));
  }

  GgufFile convert(const std::string& type) {
    out_ = dir_.file("model-" + type + ".gguf");
    convert_checkpoint_to_gguf(ckpt_, out_, type);
    return GgufFile::open(out_);
  }

  // Inverse of the q/k row permutation, written from its definition: GGUF row
  // h*hd + 2*j + t holds Hugging Face row h*hd + t*hd/2 + j.
  static std::vector<float> unpermute(const std::vector<float>& g, int64_t rows, int64_t cols,
                                      int64_t n_head) {
    const int64_t hd = rows / n_head;
    std::vector<float> out(g.size());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t h = r / hd, j = (r % hd) / 2, t = r % 2;
      std::copy_n(g.begin() + r * cols, cols, out.begin() + (h * hd + t * (hd / 2) + j) * cols);
    }
    return out;
  }

  static inline fs::path tok_dir_;
  TempDir dir_;
  Options opt_;
  std::string ckpt_, out_;
  std::map<std::string, std::vector<float>> weights_;
  std::map<std::string, std::vector<bf16>> bf16_store_;
};

TEST_F(ConvertTest, F32UntiedMetadataTensorsAndVocab) {
  make_checkpoint({});
  GgufFile f = convert("f32");
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.keys()[0], "general.architecture");
  EXPECT_EQ(f.get_string("general.name"), "ckpt");
  EXPECT_EQ(f.get_u32("general.file_type"), 0u);
  EXPECT_EQ(f.get_u32("general.alignment"), 32u);
  EXPECT_EQ(f.get_u32("llama.context_length"), 256u);
  EXPECT_EQ(f.get_u32("llama.embedding_length"), 64u);
  EXPECT_EQ(f.get_u32("llama.block_count"), 2u);
  EXPECT_EQ(f.get_u32("llama.feed_forward_length"), 80u);
  EXPECT_EQ(f.get_u32("llama.rope.dimension_count"), 16u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count"), 4u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count_kv"), 2u);
  EXPECT_EQ(f.get_f32("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_EQ(f.get_f32("llama.rope.freq_base"), 500000.0f);
  EXPECT_EQ(f.get_u32("llama.vocab_size"), 304u);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f.get_u32("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(f.get_u32("tokenizer.ggml.eos_token_id"), 2u);
  EXPECT_TRUE(f.get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_TRUE(f.get_bool("tokenizer.ggml.add_space_prefix"));
  EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_eos_token"));

  // Vocabulary, against the SentencePiece model itself.
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load((fs::path(ckpt_) / "tokenizer.model").string()).ok());
  ASSERT_EQ(sp.GetPieceSize(), kSpVocab);
  EXPECT_EQ(f.get_u32("tokenizer.ggml.unknown_token_id"), uint32_t(sp.unk_id()));
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  const auto scores = f.get_f32_array("tokenizer.ggml.scores");
  const auto types = f.get_i32_array("tokenizer.ggml.token_type");
  ASSERT_EQ(tokens.size(), 304u);
  ASSERT_EQ(scores.size(), 304u);
  ASSERT_EQ(types.size(), 304u);
  int bytes = 0, normal = 0;
  for (int i = 0; i < kSpVocab; ++i) {
    EXPECT_EQ(tokens[i], sp.IdToPiece(i));
    EXPECT_EQ(scores[i], sp.GetScore(i));
    bytes += types[i] == 6;
    normal += types[i] == 1;
  }
  EXPECT_EQ(bytes, 256);  // byte_fallback pieces <0x00>..<0xFF>
  EXPECT_EQ(tokens[sp.PieceToId("<0x41>")], "<0x41>");
  EXPECT_EQ(types[sp.PieceToId("<0x41>")], 6);
  EXPECT_EQ(normal, kSpVocab - 256 - 3);
  EXPECT_EQ(types[sp.unk_id()], 2);
  EXPECT_EQ(types[sp.bos_id()], 3);
  EXPECT_EQ(types[sp.eos_id()], 3);
  EXPECT_EQ(tokens[300], "[PAD300]");
  EXPECT_EQ(scores[303], -10000.0f);
  EXPECT_EQ(types[303], 5);

  // Tensors: 1 + 9 per layer + output_norm + output.
  ASSERT_EQ(f.tensors().size(), 1u + 9u * 2u + 2u);
  const int64_t dim = 64, hd = 16;
  EXPECT_EQ(f.tensor("token_embd.weight").shape, Shape({304, dim}));
  EXPECT_EQ(f.tensor("blk.1.attn_k.weight").shape, Shape({2 * hd, dim}));
  EXPECT_EQ(f.tensor("blk.0.ffn_down.weight").shape, Shape({dim, 80}));
  for (const auto& t : f.tensors()) EXPECT_EQ(t.type, GgmlType::kF32) << t.name;
  const std::map<std::string, std::string> plain = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
      {"blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight"},
      {"blk.1.ffn_norm.weight", "model.layers.1.post_attention_layernorm.weight"},
      {"blk.0.attn_v.weight", "model.layers.0.self_attn.v_proj.weight"},
      {"blk.0.attn_output.weight", "model.layers.0.self_attn.o_proj.weight"},
      {"blk.1.ffn_gate.weight", "model.layers.1.mlp.gate_proj.weight"},  // stored as bf16
      {"blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight"},
      {"blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight"},
  };
  for (const auto& [gg, hf] : plain) EXPECT_EQ(f.dequantize(gg), weights_.at(hf)) << gg;
  for (int layer = 0; layer < 2; ++layer) {
    const std::string p = fmt::format("model.layers.{}.self_attn.", layer);
    const std::string b = fmt::format("blk.{}.", layer);
    EXPECT_EQ(unpermute(f.dequantize(b + "attn_q.weight"), 4 * hd, dim, 4),
              weights_.at(p + "q_proj.weight"));
    EXPECT_EQ(unpermute(f.dequantize(b + "attn_k.weight"), 2 * hd, dim, 2),
              weights_.at(p + "k_proj.weight"));
    EXPECT_NE(f.dequantize(b + "attn_q.weight"), weights_.at(p + "q_proj.weight"));
  }
  EXPECT_FALSE(testing_util::temp_files_left(out_));
}

// What the permutation is for: Hugging Face applies RoPE to (i, i + hd/2) pairs of each
// head, llama.cpp's llama graph to adjacent (2i, 2i + 1) pairs. With the permuted weights
// the rotated q/k are the same vectors up to the row permutation, so every attention score
// q.k agrees.
TEST_F(ConvertTest, PermutedWeightsGiveTheSameRopeAttentionScores) {
  make_checkpoint({});
  GgufFile f = convert("f32");
  const int64_t dim = 64, hd = 16, heads = 4, kv = 2, half = hd / 2;
  std::mt19937 rng(23);
  const std::vector<float> xq = randn(dim, rng), xk = randn(dim, rng);
  const int pos_q = 7, pos_k = 3;
  auto matvec = [&](const std::vector<float>& w, const std::vector<float>& x, int64_t rows) {
    std::vector<double> y(size_t(rows), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < dim; ++c) y[r] += double(w[r * dim + c]) * x[c];
    return y;
  };
  auto angle = [&](int pos, int64_t j) { return pos * std::pow(500000.0, -2.0 * j / hd); };
  auto rope_hf = [&](std::vector<double> y, int pos) {  // rotate-half pairs (j, j + half)
    for (size_t h = 0; h < y.size() / hd; ++h)
      for (int64_t j = 0; j < half; ++j) {
        double& a = y[h * hd + j];
        double& b = y[h * hd + j + half];
        const double c = std::cos(angle(pos, j)), s = std::sin(angle(pos, j));
        const double a0 = a;
        a = a0 * c - b * s;
        b = b * c + a0 * s;
      }
    return y;
  };
  auto rope_gguf = [&](std::vector<double> y, int pos) {  // adjacent pairs (2j, 2j + 1)
    for (size_t h = 0; h < y.size() / hd; ++h)
      for (int64_t j = 0; j < half; ++j) {
        double& a = y[h * hd + 2 * j];
        double& b = y[h * hd + 2 * j + 1];
        const double c = std::cos(angle(pos, j)), s = std::sin(angle(pos, j));
        const double a0 = a;
        a = a0 * c - b * s;
        b = b * c + a0 * s;
      }
    return y;
  };
  const auto q_hf =
      rope_hf(matvec(weights_.at("model.layers.0.self_attn.q_proj.weight"), xq, heads * hd), pos_q);
  const auto k_hf =
      rope_hf(matvec(weights_.at("model.layers.0.self_attn.k_proj.weight"), xk, kv * hd), pos_k);
  const auto q_gg = rope_gguf(matvec(f.dequantize("blk.0.attn_q.weight"), xq, heads * hd), pos_q);
  const auto k_gg = rope_gguf(matvec(f.dequantize("blk.0.attn_k.weight"), xk, kv * hd), pos_k);
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t g = h / (heads / kv);  // grouped-query attention: kv head of q head h
    double s_hf = 0, s_gg = 0;
    for (int64_t i = 0; i < hd; ++i) {
      s_hf += q_hf[h * hd + i] * k_hf[g * hd + i];
      s_gg += q_gg[h * hd + i] * k_gg[g * hd + i];
    }
    EXPECT_NEAR(s_gg, s_hf, 1e-9 * (1 + std::fabs(s_hf))) << "head " << h;
  }
}

// hyperion's config.json always states head_dim, which may differ from hidden / heads.
TEST_F(ConvertTest, ExplicitHeadDim) {
  Options o;
  o.head_dim = 8;  // q_proj [32, 64], o_proj [64, 32]
  make_checkpoint(o);
  GgufFile f = convert("f32");
  EXPECT_EQ(f.get_u32("llama.rope.dimension_count"), 8u);
  EXPECT_EQ(f.get_u32("llama.attention.key_length"), 8u);
  EXPECT_EQ(f.get_u32("llama.attention.value_length"), 8u);
  EXPECT_EQ(f.tensor("blk.0.attn_q.weight").shape, Shape({32, 64}));
  EXPECT_EQ(f.tensor("blk.0.attn_k.weight").shape, Shape({16, 64}));
  EXPECT_EQ(f.tensor("blk.0.attn_output.weight").shape, Shape({64, 32}));
  EXPECT_EQ(unpermute(f.dequantize("blk.1.attn_q.weight"), 32, 64, 4),
            weights_.at("model.layers.1.self_attn.q_proj.weight"));
  EXPECT_EQ(unpermute(f.dequantize("blk.1.attn_k.weight"), 16, 64, 2),
            weights_.at("model.layers.1.self_attn.k_proj.weight"));
  // Where head_dim is hidden / heads (given or not) the keys are absent: llama.cpp derives it.
  make_checkpoint({});
  EXPECT_FALSE(convert("f32").has("llama.attention.key_length"));
  o.head_dim = 16;  // = 64 / 4, written to config.json
  make_checkpoint(o);
  EXPECT_FALSE(convert("f32").has("llama.attention.key_length"));
}

// A Gemma converts to llama.cpp's gemma architecture: gemma.* keys, key/value lengths
// always written, norms stored as 1 + w (the scale llama.cpp applies), q/k rows left in
// Hugging Face's rotate-half order, and the head tied to token_embd.
TEST_F(ConvertTest, GemmaArchitectureNormsAndUnpermutedRope) {
  Options o;
  o.gemma = true;
  o.tied = true;
  o.write_lm_head = false;
  o.head_dim = 24;  // not dim / heads
  make_checkpoint(o);
  GgufFile f = convert("f32");
  EXPECT_EQ(f.get_string("general.architecture"), "gemma");
  EXPECT_EQ(f.get_u32("gemma.block_count"), 2u);
  EXPECT_EQ(f.get_u32("gemma.embedding_length"), 64u);
  EXPECT_EQ(f.get_u32("gemma.attention.key_length"), 24u);
  EXPECT_FALSE(f.has("llama.block_count"));
  EXPECT_EQ(f.find("output.weight"), nullptr);
  EXPECT_EQ(f.dequantize("blk.1.attn_q.weight"),
            weights_.at("model.layers.1.self_attn.q_proj.weight"));
  EXPECT_EQ(f.dequantize("blk.0.attn_k.weight"),
            weights_.at("model.layers.0.self_attn.k_proj.weight"));
  for (const auto& [gg, hf] :
       {std::pair<std::string, std::string>{"blk.0.attn_norm.weight",
                                            "model.layers.0.input_layernorm.weight"},
        {"blk.1.ffn_norm.weight", "model.layers.1.post_attention_layernorm.weight"},
        {"output_norm.weight", "model.norm.weight"}}) {
    const std::vector<float> got = f.dequantize(gg), w = weights_.at(hf);
    ASSERT_EQ(got.size(), w.size());
    for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(got[i], w[i] + 1.0f) << gg << " " << i;
  }
}

// Gemma 2 and Gemma 3 (a checkpoint written from the model's own layout and config.json):
// llama.cpp's gemma2 / gemma3 architectures with their soft caps and window, the four
// norms of a layer (and Gemma 3's q/k norms) stored as 1 + w; a model whose pattern,
// scale or caps llama.cpp's graphs would not reproduce is refused by name.
TEST_F(ConvertTest, Gemma2AndGemma3PostNormsCapsAndWindows) {
  for (DecoderFamily f : {DecoderFamily::kGemma2, DecoderFamily::kGemma3}) {
    const bool g3 = f == DecoderFamily::kGemma3;
    SCOPED_TRACE(g3 ? "gemma3" : "gemma2");
    LlamaConfig c;
    c.arch = family_info(f).defaults;
    c.vocab_size = 304;
    c.dim = 64;
    c.n_layers = g3 ? 6 : 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 24;
    c.ffn_dim = 80;
    c.max_seq_len = 256;
    c.tie_embeddings = true;
    c.arch.sliding_window = 32;
    c.arch.query_pre_attn_scalar = 24;
    ParamStore ps(c, false, false);
    ps.init(5, 0.3);
    ckpt_ = (dir_.path / (g3 ? "g3" : "g2")).string();
    fs::create_directories(ckpt_);
    fs::copy_file(tok_dir_ / "tok.model", fs::path(ckpt_) / "tokenizer.model",
                  fs::copy_options::overwrite_existing);
    auto write_store = [&](const LlamaConfig& cfg, const ParamStore& store) {
      SafetensorsWriter w;
      for (const ParamInfo& p : store.infos())
        w.add(p.name, DType::kF32, p.shape, store.params() + p.offset);
      w.write((fs::path(ckpt_) / "model.safetensors").string());
      write_bytes((fs::path(ckpt_) / "config.json").string(), cfg.to_hf_json());
    };
    auto write = [&](const LlamaConfig& cfg) { write_store(cfg, ps); };
    write(c);
    GgufFile g = convert("f32");
    const std::string a = g3 ? "gemma3" : "gemma2";
    EXPECT_EQ(g.get_string("general.architecture"), a);
    EXPECT_EQ(g.get_u32(a + ".attention.sliding_window"), 32u);
    EXPECT_EQ(g.get_u32(a + ".attention.key_length"), 24u);
    if (!g3) {
      EXPECT_EQ(g.get_f32("gemma2.attn_logit_softcapping"), 50.0f);
      EXPECT_EQ(g.get_f32("gemma2.final_logit_softcapping"), 30.0f);
    } else {
      EXPECT_FALSE(g.has("gemma3.attn_logit_softcapping"));
    }
    std::vector<std::pair<std::string, std::string>> norms = {
        {"blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight"},
        {"blk.1.post_attention_norm.weight", "model.layers.1.post_attention_layernorm.weight"},
        {"blk.1.ffn_norm.weight", "model.layers.1.pre_feedforward_layernorm.weight"},
        {"blk.1.post_ffw_norm.weight", "model.layers.1.post_feedforward_layernorm.weight"}};
    if (g3) norms.push_back({"blk.0.attn_k_norm.weight", "model.layers.0.self_attn.k_norm.weight"});
    for (const auto& [gg, hf] : norms) {
      const std::vector<float> got = g.dequantize(gg);
      const ParamInfo* info = ps.find(hf);
      ASSERT_NE(info, nullptr) << hf;
      ASSERT_EQ(int64_t(got.size()), info->numel) << gg;
      for (int64_t i = 0; i < info->numel; ++i)
        ASSERT_EQ(got[size_t(i)], ps.params()[info->offset + i] + 1.0f) << gg << " " << i;
    }
    // What llama.cpp's graph would compute differently: refused, naming the key.
    LlamaConfig other = c;
    other.arch.query_pre_attn_scalar = 16;
    write(other);
    expect_error([&] { convert("f32"); }, {"config.json", "query_pre_attn_scalar"});
    other = c;
    other.arch.sliding_window_pattern = 3;
    write(other);
    expect_error([&] { convert("f32"); }, {"config.json", "layer_types"});
    if (!g3) {
      // llama.cpp's "27B" Gemma 2 (46 layers) scales by 1/sqrt(hidden_size / heads).
      LlamaConfig big = c;
      big.n_layers = 46;
      big.arch.query_pre_attn_scalar = 16;  // 64 / 4
      ParamStore big_ps(big, false, false);
      big_ps.init(6, 0.3);
      write_store(big, big_ps);
      EXPECT_EQ(convert("f32").get_u32("gemma2.block_count"), 46u);
      big.arch.query_pre_attn_scalar = 24;  // head_dim: right for 26 layers, not for 46
      write_store(big, big_ps);
      expect_error([&] { convert("f32"); }, {"query_pre_attn_scalar", "46 layers"});
    }
  }
}

// Qwen2 (q/k/v biases) and Qwen3 (q/k norms) as llama.cpp's qwen2 / qwen3 architectures:
// rows kept in Hugging Face's order (their graphs rotate halves), biases and norms f32.
TEST_F(ConvertTest, QwenArchitecturesBiasesAndQkNorms) {
  for (const char* mt : {"qwen2", "qwen3"}) {
    SCOPED_TRACE(mt);
    Options o;
    o.model_type = mt;
    o.head_dim = mt == std::string("qwen3") ? 24 : 0;
    make_checkpoint(o);
    GgufFile f = convert("f16");
    EXPECT_EQ(f.get_string("general.architecture"), mt);
    const std::string a = mt;
    EXPECT_EQ(f.get_u32(a + ".block_count"), 2u);
    EXPECT_EQ(f.get_u32(a + ".attention.head_count_kv"), 2u);
    const int64_t hd = o.head_dim > 0 ? o.head_dim : 16;
    EXPECT_EQ(f.get_u32(a + ".rope.dimension_count"), uint32_t(hd));
    // q_proj is not permuted.
    std::vector<float> q = f.dequantize("blk.1.attn_q.weight");
    const std::vector<float>& want = weights_.at("model.layers.1.self_attn.q_proj.weight");
    ASSERT_EQ(q.size(), want.size());
    for (size_t i = 0; i < q.size(); ++i) ASSERT_NEAR(q[i], want[i], 1e-3f * (1 + std::fabs(want[i])));
    if (a == "qwen2") {
      EXPECT_EQ(f.dequantize("blk.0.attn_k.bias"), weights_.at("model.layers.0.self_attn.k_proj.bias"));
      EXPECT_EQ(f.tensor("blk.0.attn_v.bias").type, GgmlType::kF32);
      EXPECT_EQ(f.find("blk.0.attn_output.bias"), nullptr);
    } else {
      EXPECT_EQ(f.dequantize("blk.1.attn_q_norm.weight"),
                weights_.at("model.layers.1.self_attn.q_norm.weight"));
      EXPECT_EQ(f.tensor("blk.1.attn_k_norm.weight").type, GgmlType::kF32);
      EXPECT_EQ(f.get_u32("qwen3.attention.key_length"), 24u);
    }
  }
}

// Llama with attention_bias: the q/k biases are permuted with their rows; Llama 3.1's
// scaled RoPE becomes rope_freqs.weight (plain over scaled frequency), linear and YaRN
// become rope.scaling.* keys.
TEST_F(ConvertTest, AttentionBiasAndRopeScaling) {
  Options o;
  o.attention_bias = true;
  o.rope_scaling = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                    {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 64}};
  make_checkpoint(o);
  GgufFile f = convert("f32");
  const std::vector<float> qb = f.dequantize("blk.0.attn_q.bias");
  EXPECT_EQ(unpermute(qb, 64, 1, 4), weights_.at("model.layers.0.self_attn.q_proj.bias"));
  const std::vector<float> kb = f.dequantize("blk.0.attn_k.bias");
  EXPECT_EQ(unpermute(kb, 32, 1, 2), weights_.at("model.layers.0.self_attn.k_proj.bias"));
  EXPECT_EQ(f.dequantize("blk.1.attn_output.bias"), weights_.at("model.layers.1.self_attn.o_proj.bias"));
  const std::vector<float> factors = f.dequantize("rope_freqs.weight");
  ASSERT_EQ(factors.size(), 8u);  // head_dim 16
  // theta 500000, head_dim 16: wavelengths 2 pi 500000^(i/8); original context 64 ->
  // high band (< 16) kept (factor 1), low band (> 64) divided by 8.
  for (size_t i = 0; i < factors.size(); ++i) {
    const double wavelen = 2 * M_PI * std::pow(500000.0, double(i) / 8);
    if (wavelen < 16) {
      EXPECT_FLOAT_EQ(factors[i], 1.0f) << i;
    }
    if (wavelen > 64) {
      EXPECT_FLOAT_EQ(factors[i], 8.0f) << i;
    }
    if (wavelen >= 16 && wavelen <= 64) {
      EXPECT_GT(factors[i], 1.0f);
      EXPECT_LT(factors[i], 8.0f);
    }
  }
  EXPECT_FALSE(f.has("llama.rope.scaling.type"));
  o = Options{};
  o.rope_scaling = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}};
  make_checkpoint(o);
  GgufFile y = convert("f32");
  EXPECT_EQ(y.get_string("llama.rope.scaling.type"), "yarn");
  EXPECT_EQ(y.get_f32("llama.rope.scaling.factor"), 4.0f);
  EXPECT_EQ(y.get_u32("llama.rope.scaling.original_context_length"), 64u);
  o.rope_scaling = {{"rope_type", "linear"}, {"factor", 2.0}};
  make_checkpoint(o);
  GgufFile l = convert("f32");
  EXPECT_EQ(l.get_string("llama.rope.scaling.type"), "linear");
  EXPECT_EQ(l.get_f32("llama.rope.scaling.factor"), 2.0f);
}

TEST_F(ConvertTest, TiedEmbeddingsOmitOutput) {
  Options o;
  o.tied = true;
  o.write_lm_head = false;
  make_checkpoint(o);
  GgufFile f = convert("f16");
  EXPECT_EQ(f.tensors().size(), 1u + 9u * 2u + 1u);
  EXPECT_EQ(f.find("output.weight"), nullptr);
  EXPECT_NE(f.find("output_norm.weight"), nullptr);
  // A saved copy of the tied head is not needed either.
  o.write_lm_head = true;
  make_checkpoint(o);
  EXPECT_EQ(convert("f16").find("output.weight"), nullptr);
}

TEST_F(ConvertTest, HalfPrecisionTypes) {
  make_checkpoint({});
  for (const auto& [name, type, file_type] :
       {std::tuple{"f16", GgmlType::kF16, 1u}, std::tuple{"bf16", GgmlType::kBF16, 32u}}) {
    SCOPED_TRACE(name);
    GgufFile f = convert(name);
    EXPECT_EQ(f.get_u32("general.file_type"), file_type);
    for (const auto& t : f.tensors()) {
      const bool one_d = t.shape.rank() == 1;
      EXPECT_EQ(t.type, one_d ? GgmlType::kF32 : type) << t.name;
    }
    const std::vector<float>& up = weights_.at("model.layers.0.mlp.up_proj.weight");
    const std::vector<float> got = f.dequantize("blk.0.ffn_up.weight");
    for (size_t i = 0; i < up.size(); ++i) {
      const float want =
          type == GgmlType::kF16 ? f16_to_f32(f32_to_f16(up[i])) : bf16_to_f32(f32_to_bf16(up[i]));
      ASSERT_EQ(got[i], want) << i;
    }
    EXPECT_EQ(f.dequantize("blk.0.attn_norm.weight"),
              weights_.at("model.layers.0.input_layernorm.weight"));
  }
}

TEST_F(ConvertTest, Q8_0TypeSelection) {
  make_checkpoint({});
  GgufFile f = convert("q8_0");
  EXPECT_EQ(f.get_u32("general.file_type"), 7u);
  EXPECT_EQ(f.tensor("token_embd.weight").type, GgmlType::kQ8_0);
  EXPECT_EQ(f.tensor("blk.0.attn_q.weight").type, GgmlType::kQ8_0);
  EXPECT_EQ(f.tensor("blk.0.attn_output.weight").type, GgmlType::kQ8_0);
  EXPECT_EQ(f.tensor("blk.0.ffn_gate.weight").type, GgmlType::kQ8_0);  // rows of 64
  EXPECT_EQ(f.tensor("blk.0.ffn_down.weight").type, GgmlType::kF16);   // rows of 80
  EXPECT_EQ(f.tensor("blk.0.attn_norm.weight").type, GgmlType::kF32);
  EXPECT_EQ(f.tensor("output_norm.weight").type, GgmlType::kF32);
  EXPECT_EQ(f.tensor("output.weight").type, GgmlType::kQ8_0);
  // Q8_0 data is exactly llama.cpp's quantisation of the permuted weights.
  const int64_t rows = 64, cols = 64;
  std::vector<float> permuted(size_t(rows * cols));
  permute_rope_rows_for_gguf(weights_.at("model.layers.1.self_attn.q_proj.weight").data(),
                             permuted.data(), rows, cols, 4);
  std::vector<unsigned char> q(ggml_nbytes(GgmlType::kQ8_0, rows * cols));
  ref::quantize_row_q8_0(permuted.data(), q.data(), rows * cols);
  const GgufTensor& t = f.tensor("blk.1.attn_q.weight");
  ASSERT_EQ(t.nbytes, q.size());
  EXPECT_EQ(std::memcmp(t.data, q.data(), q.size()), 0);
  const std::vector<float> down = f.dequantize("blk.1.ffn_down.weight");
  const std::vector<float>& want = weights_.at("model.layers.1.mlp.down_proj.weight");
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(down[i], f16_to_f32(f32_to_f16(want[i])));
}

// A checkpoint trained with quantization: int8 maps its per-channel int8 weights into
// Q8_0 as they are: every block of a row holds the row's int8 values (those of the
// training forward: the weights quantised per output channel) and the row's scale in f16.
TEST_F(ConvertTest, Q8_0KeepsTheInt8OfQuantizedTraining) {
  make_checkpoint({});
  write_bytes((fs::path(ckpt_) / "trainer_state.json").string(),
              R"({"step": 5, "config": {"quantization": "int8", "quantize_logits": "false"}})");
  GgufFile f = convert("q8_0");
  auto check_matrix = [&](const std::string& gg, std::vector<float> w, int64_t rows, int64_t cols) {
    std::vector<int8_t> q(w.size());
    std::vector<float> s(static_cast<size_t>(rows));
    quantize_rows(TensorView(w.data(), DType::kF32, {rows, cols}),
                  TensorView(q.data(), DType::kI8, {rows, cols}), s.data());
    const GgufTensor& t = f.tensor(gg);
    ASSERT_EQ(t.type, GgmlType::kQ8_0) << gg;
    const auto* blocks = static_cast<const unsigned char*>(t.data);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < cols / 32; ++b) {
        const unsigned char* blk = blocks + (r * (cols / 32) + b) * 34;
        uint16_t d;
        std::memcpy(&d, blk, 2);
        ASSERT_EQ(d, f32_to_f16(s[size_t(r)]).bits) << gg << " row " << r;
        ASSERT_EQ(std::memcmp(blk + 2, q.data() + r * cols + b * 32, 32), 0) << gg << " row " << r;
      }
  };
  std::vector<float> permuted(64 * 64);
  permute_rope_rows_for_gguf(weights_.at("model.layers.1.self_attn.q_proj.weight").data(),
                             permuted.data(), 64, 64, 4);
  check_matrix("blk.1.attn_q.weight", permuted, 64, 64);
  check_matrix("blk.0.ffn_gate.weight", weights_.at("model.layers.0.mlp.gate_proj.weight"), opt_.ff,
               64);
  // The embedding and the unquantised head keep llama.cpp's own block quantisation.
  const std::vector<float>& head = weights_.at("lm_head.weight");
  std::vector<unsigned char> want(ggml_nbytes(GgmlType::kQ8_0, int64_t(head.size())));
  ref::quantize_row_q8_0(head.data(), want.data(), int64_t(head.size()));
  EXPECT_EQ(std::memcmp(f.tensor("output.weight").data, want.data(), want.size()), 0);
}

TEST_F(ConvertTest, RejectsTokenizerNormalisationLlamaCppCannotReproduce) {
  make_checkpoint({});
  fs::copy_file(tok_dir_ / "nfkc.model", fs::path(ckpt_) / "tokenizer.model",
                fs::copy_options::overwrite_existing);
  out_ = dir_.file("nfkc.gguf");
  expect_error([&] { convert_checkpoint_to_gguf(ckpt_, out_, "f32"); },
               {ckpt_, "tokenizer.model", "nmt_nfkc", "remove_extra_whitespaces"});
  EXPECT_FALSE(fs::exists(out_));
}

// A Qwen3 checkpoint whose tokenizer is a tokenizer.json (as the Hub ships Qwen and Llama
// 3): the GGUF carries a "gpt2" vocabulary with the qwen2 pre-tokenizer, its merges, no
// BOS, and the chat template, beside the same tensors as with a SentencePiece tokenizer.
TEST_F(ConvertTest, TokenizerJsonBecomesAGpt2Vocabulary) {
  Options o;
  o.model_type = "qwen3";
  make_checkpoint(o);
  fs::remove(fs::path(ckpt_) / "tokenizer.model");
  testing_util::write_hf_tokenizer(ckpt_,
                                   testing_util::bpe_tokenizer(testing_util::kQwen2Split, true, true),
                                   false);
  const GgufFile f = convert("f32");
  EXPECT_EQ(f.get_string("general.architecture"), "qwen3");
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "qwen2");
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), size_t(o.vocab));
  EXPECT_EQ(tokens[300], "<|begin_of_text|>");
  EXPECT_EQ(tokens[303], "[PAD303]");
  EXPECT_EQ(f.array_size("tokenizer.ggml.merges"), 3u);
  EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_FALSE(f.has("tokenizer.ggml.scores"));
  EXPECT_TRUE(f.has("tokenizer.chat_template"));
  EXPECT_EQ(f.get_u32("tokenizer.ggml.bos_token_id"), 1u);  // config.json's ids
  EXPECT_TRUE(f.find("blk.0.attn_q_norm.weight") != nullptr);
}

TEST_F(ConvertTest, ErrorsNameDirectoryFileAndField) {
  auto expect_fails = [&](const Options& o, std::vector<std::string> needles,
                          const std::string& type = "f32") {
    make_checkpoint(o);
    out_ = dir_.file("bad.gguf");
    needles.push_back(ckpt_);
    expect_error([&] { convert_checkpoint_to_gguf(ckpt_, out_, type); }, needles);
    EXPECT_FALSE(fs::exists(out_));
    EXPECT_FALSE(testing_util::temp_files_left(out_));
  };
  Options o;
  o.drop_key = "hidden_size";
  expect_fails(o, {"config.json", "missing key 'hidden_size'"});
  o = {};
  o.drop = "model.layers.1.self_attn.v_proj.weight";
  expect_fails(o, {"model.safetensors", "missing tensor 'model.layers.1.self_attn.v_proj.weight'"});
  o = {};
  o.reshape = "model.layers.0.mlp.down_proj.weight";
  expect_fails(
      o, {"model.safetensors", "'model.layers.0.mlp.down_proj.weight'", "[66, 80]", "[64, 80]"});
  o = {};
  o.drop = "lm_head.weight";
  expect_fails(o, {"missing tensor 'lm_head.weight'", "tie_word_embeddings"});
  o = {};
  o.extra = "model.layers.2.self_attn.q_proj.weight";
  expect_fails(o, {"model.safetensors", "'model.layers.2.self_attn.q_proj.weight'"});
  expect_fails({}, {"unknown output type 'q4_0'"}, "q4_0");

  make_checkpoint({});
  fs::remove(fs::path(ckpt_) / "tokenizer.model");
  expect_error([&] { convert_checkpoint_to_gguf(ckpt_, dir_.file("x.gguf"), "f32"); },
               {ckpt_, "tokenizer.model"});
  make_checkpoint({});
  write_bytes((fs::path(ckpt_) / "config.json").string(), "{\"vocab_size\": 304,");
  expect_error([&] { convert_checkpoint_to_gguf(ckpt_, dir_.file("x.gguf"), "f32"); },
               {ckpt_, "config.json", "invalid JSON"});
  write_bytes((fs::path(ckpt_) / "config.json").string(),
              R"({"vocab_size": 304, "hidden_size": "64"})");
  expect_error([&] { convert_checkpoint_to_gguf(ckpt_, dir_.file("x.gguf"), "f32"); },
               {ckpt_, "config.json", "'hidden_size'", "not an integer"});
  fs::remove(fs::path(ckpt_) / "config.json");
  expect_error([&] { convert_checkpoint_to_gguf(ckpt_, dir_.file("x.gguf"), "f32"); },
               {ckpt_, "config.json"});
  // A sliding window llama.cpp's llama graph would ignore.
  make_checkpoint({});
  {
    auto cfg = nlohmann::json::parse(read_file((fs::path(ckpt_) / "config.json").string()));
    cfg["model_type"] = "mistral";
    cfg["architectures"] = {"MistralForCausalLM"};
    cfg["sliding_window"] = 16;
    write_bytes((fs::path(ckpt_) / "config.json").string(), cfg.dump());
  }
  expect_error([&] { convert_checkpoint_to_gguf(ckpt_, dir_.file("x.gguf"), "f32"); },
               {ckpt_, "sliding_window", "16"});
  // The tokenizer has more pieces than the model's vocabulary.
  o = {};
  o.vocab = 200;
  expect_fails(o, {"tokenizer.model", "300 pieces", "vocab_size is 200"});
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_.path), fs::directory_iterator()), 1);
}

}  // namespace
}  // namespace hyperion::io
