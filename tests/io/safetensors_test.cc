#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "../test_files.h"
#include "base/error.h"
#include "io/atomic_file.h"
#include "tensor/convert.h"

namespace hyperion::io {
namespace {

using namespace hyperion::testing_util;

namespace fs = std::filesystem;

// Expects fn to throw hyperion::Error whose message contains every needle.
std::vector<unsigned char> random_bytes(size_t n, std::mt19937& rng) {
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

// A file of: u64 header length, `header` (padded with spaces to a multiple of 8 unless
// `exact`), then `data`.
std::string raw_file(const std::string& header, size_t data_bytes, bool exact = false) {
  std::string h = header;
  if (!exact) h.append((8 - h.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  out += h;
  out.append(data_bytes, '\x01');
  return out;
}

TEST(Safetensors, RoundTripEveryDTypeWithMetadata) {
  TempDir dir;
  std::mt19937 rng(42);
  struct Case {
    std::string name;
    DType dtype;
    Shape shape;
  };
  const std::vector<Case> cases = {
      {"f32", DType::kF32, {3, 5}},
      {"bf16", DType::kBF16, {7}},
      {"f16", DType::kF16, {2, 3, 4}},
      {"e4m3", DType::kE4M3, {17}},
      {"e5m2", DType::kE5M2, {1, 1, 9}},
      {"i8", DType::kI8, {4, 4}},
      {"u8", DType::kU8, {63}},
      {"i32", DType::kI32, {2, 2, 2, 2, 2, 2}},
      {"scalar", DType::kF32, {}},
      {"empty", DType::kF32, {0, 4}},
      {"after.odd.bytes", DType::kF32, {100}},  // lands at a misaligned offset
  };
  std::vector<std::vector<unsigned char>> data;
  SafetensorsWriter w;
  for (const auto& c : cases) {
    data.push_back(random_bytes(size_t(c.shape.numel()) * dtype_size(c.dtype), rng));
    w.add(c.name, c.dtype, c.shape, data.back().data());
  }
  w.set_metadata("format", "pt");
  w.set_metadata("step", "1000");
  w.set_metadata("note", "quotes \" and unicode \xc3\xa9");
  const std::string path = dir.file("model.safetensors");
  w.write(path);
  EXPECT_FALSE(testing_util::temp_files_left(path));

  const std::string bytes = read_file(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ((8 + n) % 64, 0u);  // the data region starts 64-byte aligned

  SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.path(), path);
  ASSERT_EQ(f.tensors().size(), cases.size());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("step"), "1000");
  EXPECT_EQ(f.metadata().at("note"), "quotes \" and unicode \xc3\xa9");
  EXPECT_EQ(f.metadata().size(), 3u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    SCOPED_TRACE(c.name);
    const SafetensorsTensor& t = f.get(c.name);
    EXPECT_EQ(&t, f.find(c.name));
    EXPECT_EQ(t.dtype, c.dtype);
    EXPECT_EQ(t.shape, c.shape);
    ASSERT_EQ(t.nbytes, data[i].size());
    if (t.nbytes) {
      EXPECT_EQ(std::memcmp(t.data, data[i].data(), t.nbytes), 0);
    }
    // Same-dtype read_into copies bytes exactly.
    std::vector<unsigned char> copy(t.nbytes + 1);
    f.read_into(c.name, TensorView(copy.data(), c.dtype, c.shape));
    if (t.nbytes) {
      EXPECT_EQ(std::memcmp(copy.data(), data[i].data(), t.nbytes), 0);
    }
  }
  // tensors() are in file order, which is the order added.
  for (size_t i = 1; i < cases.size(); ++i)
    EXPECT_LE(static_cast<const char*>(f.get(cases[i - 1].name).data),
              static_cast<const char*>(f.get(cases[i].name).data));
  EXPECT_EQ(f.find("nope"), nullptr);

  // Moving keeps the mapping (and the data pointers) alive.
  const void* p = f.get("f32").data;
  SafetensorsFile g = std::move(f);
  EXPECT_EQ(g.get("f32").data, p);
  EXPECT_EQ(std::memcmp(g.get("f32").data, data[0].data(), data[0].size()), 0);
}

TEST(Safetensors, EmptyFileRoundTrip) {
  TempDir dir;
  SafetensorsWriter w;
  w.write(dir.file("empty.safetensors"));
  SafetensorsFile f = SafetensorsFile::open(dir.file("empty.safetensors"));
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_TRUE(f.metadata().empty());
}

TEST(Safetensors, ReadIntoConverts) {
  TempDir dir;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  // Big enough to use several threads and chunks, with an odd tail.
  const int64_t n = 70001;
  std::vector<float> x(n);
  for (auto& v : x) v = dist(rng);
  std::vector<bf16> xb(n);
  std::vector<f16> xh(n);
  for (int64_t i = 0; i < n; ++i) {
    xb[i] = f32_to_bf16(x[i]);
    xh[i] = f32_to_f16(x[i]);
  }
  const uint8_t pad[3] = {1, 2, 3};
  SafetensorsWriter w;
  w.add("pad", DType::kU8, {3}, pad);  // makes every following tensor misaligned
  w.add("x32", DType::kF32, {n}, x.data());
  w.add("xb", DType::kBF16, {n}, xb.data());
  w.add("xh", DType::kF16, {n}, xh.data());
  const std::string path = dir.file("conv.safetensors");
  w.write(path);
  SafetensorsFile f = SafetensorsFile::open(path);

  std::vector<float> out32(n);
  std::vector<bf16> outb(n);
  const TensorView v32(out32.data(), DType::kF32, {n});
  const TensorView vb(outb.data(), DType::kBF16, {n});

  f.read_into("x32", v32);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out32[i], x[i]) << i;
  f.read_into("x32", vb);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(outb[i].bits, f32_to_bf16(x[i]).bits) << i;
  f.read_into("xb", v32);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out32[i], bf16_to_f32(xb[i])) << i;
  f.read_into("xb", vb);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(outb[i].bits, xb[i].bits) << i;
  f.read_into("xh", v32);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out32[i], f16_to_f32(xh[i])) << i;
  f.read_into("xh", vb);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(outb[i].bits, f32_to_bf16(f16_to_f32(xh[i])).bits);

  // Errors name the file, the tensor and both shapes / dtypes.
  std::vector<float> small(10);
  expect_error(
      [&] {
        f.read_into("x32", TensorView(small.data(), DType::kF32, {2, 5}));
      },
      {path, "'x32'", "[70001]", "[2, 5]"});
  expect_error([&] { f.read_into("pad", TensorView(small.data(), DType::kF32, {3})); },
               {path, "'pad'", "uint8", "f32"});
  std::vector<int32_t> ints(n);
  expect_error([&] { f.read_into("x32", TensorView(ints.data(), DType::kI32, {n})); },
               {path, "'x32'", "int32"});
  expect_error([&] { f.read_into("x3", v32); }, {path, "'x3'", "'x32'"});
  expect_error([&] { f.get("model.layers.0.q"); }, {path, "model.layers.0.q", "4 tensors"});
}

TEST(Safetensors, WriterRejectsBadInput) {
  float v = 1.0f;
  SafetensorsWriter w;
  w.add("a", DType::kF32, {1}, &v);
  expect_error([&] { w.add("a", DType::kF32, {1}, &v); }, {"duplicate", "'a'"});
  expect_error([&] { w.add("__metadata__", DType::kF32, {1}, &v); }, {"__metadata__"});
  expect_error([&] { w.add("", DType::kF32, {1}, &v); }, {"empty"});
  expect_error([&] { w.add("b", DType::kF32, {4}, nullptr); }, {"'b'", "no data"});
  TempDir dir;
  expect_error([&] { w.write(dir.file("no/dir/x.safetensors")); }, {"no/dir/x.safetensors"});
}

TEST(Safetensors, OpenAcceptsHolesAndUnpaddedHeaders) {
  TempDir dir;
  const std::string path = dir.file("holes.safetensors");
  // A hole between the tensors and trailing bytes after them are tolerated; so is a header
  // that is not padded to 8 bytes (some writers do not pad).
  write_bytes(path, raw_file(R"({"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]},)"
                             R"("a":{"dtype":"I8","shape":[],"data_offsets":[0,1]}})",
                             20, /*exact=*/true));
  SafetensorsFile f = SafetensorsFile::open(path);
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors()[0].name, "a");  // file order
  EXPECT_EQ(f.tensors()[1].name, "b");
  EXPECT_EQ(f.get("b").nbytes, 2u);
}

// Each malformed file is rejected with a message naming the file and what is wrong.
TEST(Safetensors, CorruptFilesAreRejected) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  auto check = [&](const std::string& contents, std::vector<std::string> needles) {
    write_bytes(path, contents);
    needles.push_back("safetensors: " + path);
    expect_error([&] { SafetensorsFile::open(path); }, needles);
  };
  auto entry = [](const std::string& name, const std::string& body) {
    return "{\"" + name + "\":" + body + "}";
  };

  check("", {"0 bytes", "too short"});
  check("12345", {"5 bytes", "too short"});
  {
    std::string s(8, '\0');
    const uint64_t n = 1000;
    std::memcpy(s.data(), &n, 8);
    check(s + "{}", {"header length 1000", "past the end"});
    const uint64_t huge = uint64_t{1} << 40;
    std::memcpy(s.data(), &huge, 8);
    check(s + "{}", {"absurd"});
  }
  check(raw_file("{\"a\": [1, 2", 0), {"invalid JSON"});
  check(raw_file("[1, 2]", 0), {"expected an object"});
  check(raw_file(entry("t", "[1]"), 4), {"tensor 't'", "expected an object"});
  check(raw_file(entry("t", R"({"shape":[1],"data_offsets":[0,4]})"), 4),
        {"tensor 't'", "missing field 'dtype'"});
  check(raw_file(entry("t", R"({"dtype":"F32","data_offsets":[0,4]})"), 4),
        {"tensor 't'", "missing field 'shape'"});
  check(raw_file(entry("t", R"({"dtype":"F32","shape":[1]})"), 4),
        {"tensor 't'", "missing field 'data_offsets'"});
  check(raw_file(entry("t", R"({"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1})"), 4),
        {"tensor 't'", "unknown field 'x'"});
  for (const char* dt : {"F64", "I64", "X", "BOOL"})
    check(raw_file(entry("w", std::string(R"({"dtype":")") + dt +
                                  R"(","shape":[1],"data_offsets":[0,8]})"),
                   8),
          {"tensor 'w'", std::string("'") + dt + "'", "unsupported dtype"});
  check(raw_file(entry("w", R"({"dtype":4,"shape":[1],"data_offsets":[0,4]})"), 4),
        {"tensor 'w'", "dtype"});
  check(raw_file(entry("w", R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})"), 4),
        {"tensor 'w'", "shape[0] = -1"});
  check(raw_file(entry("w", R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,4]})"), 4),
        {"tensor 'w'", "shape[0] = 2.5"});
  check(raw_file(entry("w", R"({"dtype":"F32","shape":[1,"2"],"data_offsets":[0,8]})"), 8),
        {"tensor 'w'", "shape[1]"});
  check(raw_file(entry("w", R"({"dtype":"F32","shape":4,"data_offsets":[0,16]})"), 16),
        {"tensor 'w'", "shape"});
  check(raw_file(entry("w", R"({"dtype":"U8","shape":[1,1,1,1,1,1,1],"data_offsets":[0,1]})"), 1),
        {"tensor 'w'", "rank 7"});
  check(
      raw_file(
          entry("w", R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]})"), 4),
      {"tensor 'w'", "overflows"});
  check(raw_file(entry("w", R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})"), 4),
        {"tensor 'w'", "past the end", "truncated"});
  check(raw_file(entry("w", R"({"dtype":"F32","shape":[0],"data_offsets":[8,4]})"), 8),
        {"tensor 'w'", "end before begin"});
  check(raw_file(entry("w", R"({"dtype":"F32","shape":[1],"data_offsets":[0]})"), 4),
        {"tensor 'w'", "data_offsets"});
  check(raw_file(entry("w", R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})"), 4),
        {"tensor 'w'", "data_offsets"});
  check(raw_file(entry("w", R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})"), 16),
        {"tensor 'w'", "hold 8 bytes", "needs 12"});
  check(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 16),
        {"'b'", "overlaps", "'a'"});
  check(raw_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                 R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                 2),
        {"tensor 'a'", "twice"});
  check(raw_file(R"({"__metadata__":{"k":1}})", 0), {"__metadata__", "'k'", "string"});
  check(raw_file(R"({"__metadata__":[1]})", 0), {"__metadata__"});
  expect_error([&] { SafetensorsFile::open(dir.file("missing.safetensors")); },
               {"safetensors", dir.file("missing.safetensors")});
}

// Files from another writer (json key order, compact offsets) are read the same way.
TEST(Safetensors, ReadsHandWrittenFile) {
  TempDir dir;
  const std::string path = dir.file("hand.safetensors");
  std::string data(12, '\0');
  const float vals[2] = {1.5f, -2.0f};
  std::memcpy(data.data() + 4, vals, 8);
  const int32_t i = -7;
  std::memcpy(data.data(), &i, 4);
  std::string file = raw_file(R"({"__metadata__":{"format":"pt"},)"
                              R"("w":{"data_offsets":[4,12],"shape":[1,2],"dtype":"F32"},)"
                              R"("i":{"shape":[],"dtype":"I32","data_offsets":[0,4]}})",
                              0);
  write_bytes(path, file + data);
  SafetensorsFile f = SafetensorsFile::open(path);
  std::vector<float> out(2);
  f.read_into("w", TensorView(out.data(), DType::kF32, {1, 2}));
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_EQ(out[1], -2.0f);
  int32_t got = 0;
  f.read_into("i", TensorView(&got, DType::kI32, {}));
  EXPECT_EQ(got, -7);
  EXPECT_EQ(f.metadata().at("format"), "pt");
}

}  // namespace
}  // namespace hyperion::io
