// The GGUF reader and writer (io/gguf.h): every value and tensor type, the Q8_0 blocks,
// the Q4_0/K blocks (written through the block quantiser, decoded as kernels' reference
// does), and malformed files refused by name.
#include "io/gguf.h"
#include "kernels/block_quant.h"
#include "tensor/quantize_q8_0.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../kernels/kernel_test_util.h"
#include "../test_files.h"
#include "base/error.h"
#include "io/atomic_file.h"
#include "tensor/convert.h"

namespace hyperion::io {
namespace {

using namespace hyperion::testing_util;

namespace fs = std::filesystem;

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
        default:  // the block types: GgufBlocks below
          FAIL() << "no block types in this test";
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
  expect_error([&] { e.add_tensor("t", {4}, x.data(), static_cast<GgmlType>(10)); },
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

// ---- Q4_0, Q4_K, Q5_K, Q6_K ----

constexpr GgmlType kBlockTypes[] = {GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ5_K,
                                    GgmlType::kQ6_K};

BlockType block_type_of(GgmlType t) {
  const BlockFormat* f = block_format_of_ggml(static_cast<uint32_t>(t));
  EXPECT_NE(f, nullptr);
  return f ? f->type : BlockType::kQ8_0;
}

// kernels' quantize_blocks, as the converter hands it to the writer.
void quantize_with_kernels(GgmlType t, const float* src, unsigned char* dst, int64_t n) {
  quantize_blocks(block_type_of(t), src, dst, n);
}

TEST(GgufBlocks, NamesAndSizesAreGgmls) {
  for (const GgmlType t : kBlockTypes) {
    const BlockFormat& f = block_format(block_type_of(t));
    EXPECT_EQ(ggml_type_name(t), std::string_view(f.name));
    EXPECT_EQ(static_cast<uint32_t>(t), f.ggml_type);
    EXPECT_EQ(ggml_block_size(t), f.values);
    EXPECT_EQ(ggml_block_bytes(t), f.bytes);
    EXPECT_EQ(ggml_nbytes(t, 3 * f.values), 3 * f.bytes);
    EXPECT_TRUE(ggml_needs_block_quantizer(t));
  }
  EXPECT_EQ(ggml_type_name(GgmlType::kQ4_K), "q4_K");
  EXPECT_EQ(ggml_block_bytes(GgmlType::kQ6_K), 210u);
  EXPECT_FALSE(ggml_needs_block_quantizer(GgmlType::kQ8_0));
  EXPECT_FALSE(ggml_needs_block_quantizer(GgmlType::kF16));
  EXPECT_THROW(ggml_nbytes(GgmlType::kQ5_K, 128), Error);
}

// The writer quantises each row through the block quantiser, rows in parallel: the bytes
// are the quantiser's for each row, whatever the thread count, and the reader decodes
// them to exactly what kernels' reference dequantisation gives.
TEST(GgufBlocks, WriterQuantisesRowsThroughTheBlockQuantizer) {
  TempDir dir;
  std::mt19937 rng(21);
  struct Case {
    std::string name;
    Shape shape;
    GgmlType type;
  };
  const std::vector<Case> cases = {
      {"q4_0.2d", {3, 96}, GgmlType::kQ4_0},
      {"q4_k.3d", {2, 3, 512}, GgmlType::kQ4_K},
      {"q5_k.1d", {768}, GgmlType::kQ5_K},
      {"q6_k.2d", {5, 256}, GgmlType::kQ6_K},
      {"q4_k.big", {1100, 1024}, GgmlType::kQ4_K},  // > one chunk of rows
      {"q6_k.wide", {2, 1 << 20 | 1 << 9}, GgmlType::kQ6_K},  // a row > one chunk
  };
  std::vector<std::vector<float>> data;
  for (const auto& c : cases) data.push_back(randn(size_t(c.shape.numel()), rng, 0.05f));
  std::vector<std::string> paths;
  for (const int threads : {1, 4}) {
    const RestoreNumThreads restore;
    set_num_threads(threads);
    GgufWriter w;
    w.set_block_quantizer(quantize_with_kernels);
    for (size_t i = 0; i < cases.size(); ++i) {
      if (i % 2 == 0) {
        w.add_tensor(cases[i].name, cases[i].shape, data[i].data(), cases[i].type);
      } else {
        const std::vector<float>* v = &data[i];
        w.add_tensor(
            cases[i].name, cases[i].shape, [v](float* dst) { std::copy(v->begin(), v->end(), dst); },
            cases[i].type);
      }
    }
    paths.push_back(dir.file(fmt::format("b{}.gguf", threads)));
    w.write(paths.back());
  }
  EXPECT_EQ(read_file(paths[0]), read_file(paths[1]));
  GgufFile f = GgufFile::open(paths[0]);
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    SCOPED_TRACE(c.name);
    const GgufTensor& t = f.tensor(c.name);
    EXPECT_EQ(t.type, c.type);
    EXPECT_EQ(t.shape, c.shape);
    const int64_t n = c.shape.numel(), cols = c.shape.dim(-1);
    ASSERT_EQ(t.nbytes, ggml_nbytes(c.type, n));
    std::vector<unsigned char> want(t.nbytes);
    const size_t row_bytes = ggml_nbytes(c.type, cols);
    for (int64_t r = 0; r < n / cols; ++r)
      quantize_blocks(block_type_of(c.type), data[i].data() + r * cols,
                      want.data() + size_t(r) * row_bytes, cols);
    EXPECT_EQ(std::memcmp(t.data, want.data(), want.size()), 0);
    std::vector<float> ref_values(static_cast<size_t>(n));
    dequantize_blocks_reference(block_type_of(c.type), t.data, ref_values.data(), n);
    const std::vector<float> got = f.dequantize(c.name);
    ASSERT_EQ(got.size(), ref_values.size());
    EXPECT_EQ(std::memcmp(got.data(), ref_values.data(), got.size() * 4), 0);
  }
}

// The reader's decoding of arbitrary blocks (every quant bit pattern, scales of either
// sign, subnormal and normal f16) equals kernels' reference dequantisation bit for bit.
TEST(GgufBlocks, ReaderDecodesArbitraryBlocksAsTheKernelsReference) {
  TempDir dir;
  std::mt19937 rng(4);
  std::uniform_int_distribution<int> byte(0, 255);
  GgufWriter w;
  std::vector<std::vector<unsigned char>> blocks;
  blocks.reserve(std::size(kBlockTypes));  // the producers keep pointers into it
  for (const GgmlType t : kBlockTypes) {
    const int64_t n = 6 * ggml_block_size(t);
    std::vector<unsigned char> b(ggml_nbytes(t, n));
    for (auto& v : b) v = static_cast<unsigned char>(byte(rng));
    // Keep the f16 scales finite (high bytes of d, dmin at 0, 2; Q6_K's d at 208).
    const size_t bb = ggml_block_bytes(t);
    for (size_t k = 0; k < b.size(); k += bb) {
      for (const size_t at : t == GgmlType::kQ6_K   ? std::vector<size_t>{209}
                             : t == GgmlType::kQ4_0 ? std::vector<size_t>{1}
                                                    : std::vector<size_t>{1, 3})
        b[k + at] &= 0xBB;  // clears an exponent bit: never 0x7C00
    }
    blocks.push_back(b);
    const std::vector<unsigned char>* src = &blocks.back();
    w.add_encoded_tensor(
        std::string(ggml_type_name(t)), {2, n / 2},
        [src](unsigned char* dst) { std::copy(src->begin(), src->end(), dst); }, t);
  }
  w.write(dir.file("r.gguf"));
  GgufFile f = GgufFile::open(dir.file("r.gguf"));
  for (const GgmlType t : kBlockTypes) {
    SCOPED_TRACE(ggml_type_name(t));
    const GgufTensor& g = f.tensor(std::string(ggml_type_name(t)));
    const int64_t n = g.shape.numel();
    std::vector<float> want(static_cast<size_t>(n));
    dequantize_blocks_reference(block_type_of(t), g.data, want.data(), n);
    const std::vector<float> got = f.dequantize(g.name);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << i;
  }
}

TEST(GgufBlocks, WriterErrorsNameTheTensorAndRow) {
  TempDir dir;
  std::vector<float> x(4 * 256, 0.25f);
  GgufWriter none;
  expect_error([&] { none.add_tensor("w", {4, 256}, x.data(), GgmlType::kQ4_K); },
               {"'w'", "q4_K", "set_block_quantizer"});
  GgufWriter w;
  w.set_block_quantizer(quantize_with_kernels);
  expect_error([&] { w.add_tensor("w", {2, 384}, x.data(), GgmlType::kQ5_K); },
               {"'w'", "q5_K", "multiple of 256"});
  expect_error([&] { w.add_tensor("w", {2, 48}, x.data(), GgmlType::kQ4_0); },
               {"'w'", "q4_0", "multiple of 32"});
  x[2 * 256 + 7] = std::numeric_limits<float>::quiet_NaN();
  w.add_tensor("bad", {4, 256}, x.data(), GgmlType::kQ6_K);
  const std::string path = dir.file("e.gguf");
  for (const int threads : {1, 4}) {
    const RestoreNumThreads restore;
    set_num_threads(threads);
    expect_error([&] { w.write(path); }, {path, "'bad'", "q6_K", "row 2", "element 7"});
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(temp_files_left(path));
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
  s.t1_type = 10;
  check(s, {"tensor 'w1'", "unsupported ggml type 10 (q2_K)", "q4_K"});
  s.t1_type = 9;
  check(s, {"tensor 'w1'", "unsupported ggml type 9 (q8_1)"});
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
  s.t1_type = 12;
  s.t1_ne = {32, 2};  // a q4_K row must be a whole number of 256-value blocks
  check(s, {"tensor 'w1'", "row length 32", "q4_K", "256"});
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

}  // namespace
}  // namespace hyperion::io
