#include "io/token_shard.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "../test_files.h"
#include "base/error.h"
#include "io/atomic_file.h"

namespace hyperion::io {
namespace {

using namespace hyperion::testing_util;

namespace fs = std::filesystem;

std::vector<int32_t> random_tokens(int64_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  if (n > 0) t[0] = vocab - 1;  // the largest id is valid
  return t;
}

void round_trip(const std::string& path, int32_t vocab, int64_t n, int expect_bytes) {
  const auto tokens = random_tokens(n, vocab, static_cast<uint32_t>(vocab + n));
  write_token_shard(path, tokens.data(), n, vocab);
  EXPECT_EQ(fs::file_size(path), static_cast<uintmax_t>(32 + n * expect_bytes));
  TokenShard s = TokenShard::open(path);
  EXPECT_EQ(s.size(), n);
  EXPECT_EQ(s.vocab_size(), vocab);
  EXPECT_EQ(s.token_bytes(), expect_bytes);
  EXPECT_EQ(s.path(), path);
  std::vector<int32_t> all(static_cast<size_t>(n));
  s.read(0, n, all.data());
  EXPECT_EQ(all, tokens);
  if (n >= 20) {
    std::vector<int32_t> part(7);
    s.read(13, 7, part.data());
    EXPECT_TRUE(std::equal(part.begin(), part.end(), tokens.begin() + 13));
  }
}

TEST(TokenShard, RoundTripUint16) {
  TempDir dir;
  round_trip(dir.file("a.bin"), 1000, 1001, 2);
  round_trip(dir.file("b.bin"), 65536, 70001, 2);  // largest vocabulary with 2-byte tokens
  round_trip(dir.file("c.bin"), 7, 1, 2);
}

TEST(TokenShard, RoundTripUint32) {
  TempDir dir;
  round_trip(dir.file("a.bin"), 65537, 333, 4);
  round_trip(dir.file("b.bin"), 128256, 5000, 4);
}

TEST(TokenShard, EmptyShard) {
  TempDir dir;
  write_token_shard(dir.file("e.bin"), nullptr, 0, 100);
  TokenShard s = TokenShard::open(dir.file("e.bin"));
  EXPECT_EQ(s.size(), 0);
  s.read(0, 0, nullptr);
}

TEST(TokenShard, HeaderLayout) {
  TempDir dir;
  const std::vector<int32_t> t = {5, 0, 65535};
  write_token_shard(dir.file("h.bin"), t.data(), 3, 65536);
  const std::string bytes = read_file(dir.file("h.bin"));
  ASSERT_EQ(bytes.size(), 32u + 6u);
  EXPECT_EQ(bytes.substr(0, 8), "HYPTOKS1");
  auto u32 = [&](size_t off) {
    uint32_t v;
    std::memcpy(&v, bytes.data() + off, 4);
    return v;
  };
  uint64_t count;
  std::memcpy(&count, bytes.data() + 16, 8);
  EXPECT_EQ(u32(8), 1u);
  EXPECT_EQ(u32(12), 2u);
  EXPECT_EQ(count, 3u);
  EXPECT_EQ(u32(24), 65536u);
  EXPECT_EQ(u32(28), 0u);
  EXPECT_EQ(static_cast<unsigned char>(bytes[32]), 5);
  EXPECT_EQ(static_cast<unsigned char>(bytes[36]), 0xFF);
  EXPECT_EQ(static_cast<unsigned char>(bytes[37]), 0xFF);
}

TEST(TokenShard, WriteRejectsOutOfVocabularyTokens) {
  TempDir dir;
  const std::string path = dir.file("w.bin");
  std::vector<int32_t> t = {1, 2, 3, 100};
  expect_error([&] { write_token_shard(path, t.data(), 4, 100); },
               {path, "token 100", "position 3"});
  EXPECT_FALSE(fs::exists(path));
  t[3] = -4;
  expect_error([&] { write_token_shard(path, t.data(), 4, 100); }, {path, "-4"});
  expect_error([&] { write_token_shard(path, t.data(), 4, 0); }, {path, "vocab_size"});
  // A failed rewrite leaves the previous file intact.
  t[3] = 4;
  write_token_shard(path, t.data(), 4, 100);
  t[0] = 1000;
  EXPECT_THROW(write_token_shard(path, t.data(), 4, 100), Error);
  EXPECT_EQ(TokenShard::open(path).size(), 4);
  for (const auto& e : fs::directory_iterator(dir.path)) {
    EXPECT_EQ(e.path().filename(), "w.bin");  // no temporary files left behind
  }
}

class CorruptShard : public ::testing::Test {
 protected:
  void SetUp() override {
    path = dir.file("s.bin");
    const auto tokens = random_tokens(50, 500, 9);
    write_token_shard(path, tokens.data(), 50, 500);
    bytes = read_file(path);
  }
  void rewrite(const std::string& b) { write_file_atomic(path, b); }
  template <typename T>
  void patch(size_t off, T v) {
    std::string b = bytes;
    std::memcpy(b.data() + off, &v, sizeof(T));
    rewrite(b);
  }
  TempDir dir;
  std::string path;
  std::string bytes;
};

TEST_F(CorruptShard, BadMagic) {
  std::string b = bytes;
  b[0] = 'X';
  rewrite(b);
  expect_error([&] { TokenShard::open(path); }, {path, "bad magic"});
}

TEST_F(CorruptShard, UnknownVersion) {
  patch<uint32_t>(8, 2);
  expect_error([&] { TokenShard::open(path); }, {path, "version 2"});
}

TEST_F(CorruptShard, BadTokenBytes) {
  patch<uint32_t>(12, 3);
  expect_error([&] { TokenShard::open(path); }, {path, "token_bytes is 3"});
}

TEST_F(CorruptShard, Truncated) {
  rewrite(bytes.substr(0, bytes.size() - 1));
  expect_error([&] { TokenShard::open(path); }, {path, "truncated"});
  patch<uint64_t>(16, 51);  // header claims more tokens than stored
  expect_error([&] { TokenShard::open(path); }, {path, "truncated"});
  patch<uint64_t>(16, ~uint64_t{0});  // absurd count must not overflow the size check
  expect_error([&] { TokenShard::open(path); }, {path, "truncated"});
  rewrite(bytes.substr(0, 20));
  expect_error([&] { TokenShard::open(path); }, {path, "truncated header"});
  rewrite("");
  expect_error([&] { TokenShard::open(path); }, {path, "truncated header"});
}

TEST_F(CorruptShard, TrailingData) {
  rewrite(bytes + "xy");
  expect_error([&] { TokenShard::open(path); }, {path, "trailing"});
  patch<uint64_t>(16, 49);
  expect_error([&] { TokenShard::open(path); }, {path, "trailing"});
}

TEST_F(CorruptShard, TokenOutsideVocabulary) {
  patch<uint16_t>(32 + 2 * 17, 500);
  expect_error([&] { TokenShard::open(path); }, {path, "token 500", "position 17", "500"});
  patch<uint32_t>(24, 0);
  expect_error([&] { TokenShard::open(path); }, {path, "vocab_size"});
  patch<uint32_t>(24, 70000);  // too large for 2-byte tokens
  expect_error([&] { TokenShard::open(path); }, {path, "vocab_size"});
  patch<uint32_t>(28, 1);
  expect_error([&] { TokenShard::open(path); }, {path, "reserved"});
}

TEST(TokenShard, OpenAndReadErrors) {
  TempDir dir;
  const std::string missing = dir.file("none.bin");
  expect_error([&] { TokenShard::open(missing); }, {missing});
  expect_error([&] { TokenShard::open(dir.path.string()); }, {dir.path.string()});
  const std::string path = dir.file("r.bin");
  const auto tokens = random_tokens(10, 50, 1);
  write_token_shard(path, tokens.data(), 10, 50);
  TokenShard s = TokenShard::open(path);
  std::vector<int32_t> out(11);
  expect_error([&] { s.read(5, 6, out.data()); }, {path, "[5, 11)"});
  expect_error([&] { s.read(-1, 2, out.data()); }, {path});
  // Moves keep the mapping valid.
  TokenShard moved = std::move(s);
  moved.read(0, 10, out.data());
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), out.begin()));
  TokenShard other = TokenShard::open(path);
  other = std::move(moved);
  other.read(9, 1, out.data());
  EXPECT_EQ(out[0], tokens[9]);
}

}  // namespace
}  // namespace hyperion::io
