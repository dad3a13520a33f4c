// On-disk token shard: a flat array of token ids written once by `data prepare` and
// memory-mapped by the data loader.
//
// Layout (little endian):
//   offset 0   char[8]  magic "HYPTOKS1"
//   offset 8   uint32   version = 1
//   offset 12  uint32   token_bytes: 2 (uint16 tokens) or 4 (uint32 tokens)
//   offset 16  uint64   token_count
//   offset 24  uint32   vocab_size (every token is < vocab_size)
//   offset 28  uint32   reserved = 0
//   offset 32  token_count * token_bytes bytes of tokens
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace hyperion::io {

inline constexpr char kTokenShardMagic[8] = {'H', 'Y', 'P', 'T', 'O', 'K', 'S', '1'};
inline constexpr uint32_t kTokenShardVersion = 1;
inline constexpr int64_t kTokenShardHeaderBytes = 32;

// Writes `n` tokens atomically, as uint16 when vocab_size <= 65536, else uint32. Throws
// naming the file and the position when a token is outside [0, vocab_size).
void write_token_shard(const std::string& path, const int32_t* tokens, int64_t n,
                       int32_t vocab_size);

// A read-only, memory-mapped shard. open() validates the header, the file size and every
// token (< vocab_size), throwing hyperion::Error naming the file and the field at fault.
// Movable, not copyable; read() is const and thread-safe.
class TokenShard {
 public:
  static TokenShard open(const std::string& path);

  TokenShard(TokenShard&&) noexcept;
  TokenShard& operator=(TokenShard&&) noexcept;
  ~TokenShard();

  int64_t size() const { return count_; }
  int32_t vocab_size() const { return vocab_size_; }
  int token_bytes() const { return token_bytes_; }
  const std::string& path() const { return path_; }
  // Copies tokens [begin, begin + n) to out as int32. Throws naming the file when the
  // range is outside [0, size()).
  void read(int64_t begin, int64_t n, int32_t* out) const;

 private:
  TokenShard() = default;
  void unmap() noexcept;

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char* tokens_ = nullptr;
  int64_t count_ = 0;
  int32_t vocab_size_ = 0;
  int token_bytes_ = 0;
};

}  // namespace hyperion::io
