#include "io/token_shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/input_file.h"
#include "base/threads.h"
#include "io/atomic_file.h"

namespace hyperion::io {

// The header and tokens are stored little endian; on a little-endian host they are plain
// memory copies. (Every supported target is little endian.)
static_assert(std::endian::native == std::endian::little, "token shards assume little endian");

namespace {

template <typename T>
void put(unsigned char* dst, T v) {
  std::memcpy(dst, &v, sizeof(T));
}

template <typename T>
T get(const unsigned char* src) {
  T v;
  std::memcpy(&v, src, sizeof(T));
  return v;
}

template <typename T>
void write_tokens(AtomicFileWriter& w, const std::string& path, const int32_t* tokens, int64_t n,
                  int32_t vocab_size) {
  constexpr int64_t kChunk = int64_t{1} << 16;
  std::vector<T> buf(static_cast<size_t>(std::min(n, kChunk)));
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t m = std::min(kChunk, n - begin);
    bool ok = true;
    for (int64_t i = 0; i < m; ++i) {
      const int32_t t = tokens[begin + i];
      ok &= t >= 0 && t < vocab_size;
      buf[i] = static_cast<T>(t);
    }
    if (!ok) {
      for (int64_t i = 0; i < m; ++i) {
        const int32_t t = tokens[begin + i];
        HYP_CHECK(t >= 0 && t < vocab_size,
                  "write_token_shard '{}': token {} at position {} is outside the vocabulary "
                  "[0, {})",
                  path, t, begin + i, vocab_size);
      }
    }
    w.write(buf.data(), static_cast<size_t>(m) * sizeof(T));
  }
}

// Largest token in [0, n), scanned in parallel (the shard may be gigabytes).
template <typename T>
uint32_t max_token(const T* p, int64_t n) {
  const int workers = num_threads();
  std::vector<uint32_t> part(static_cast<size_t>(workers) + 1, 0);
  // One fixed chunk per worker slot: the reduction does not depend on the team size.
  parallel_chunks(workers, 1, [&](int64_t wb, int64_t we) {
    for (int64_t w = wb; w < we; ++w) {
      const int64_t b = n * w / workers, e = n * (w + 1) / workers;
      T m = 0;
      for (int64_t i = b; i < e; ++i) m = std::max(m, p[i]);
      part[static_cast<size_t>(w)] = m;
    }
  });
  return *std::max_element(part.begin(), part.end());
}

template <typename T>
int64_t first_token_at_least(const T* p, int64_t n, uint32_t limit) {
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] >= limit) return i;
  }
  return -1;
}

}  // namespace

void write_token_shard(const std::string& path, const int32_t* tokens, int64_t n,
                       int32_t vocab_size) {
  HYP_CHECK(vocab_size > 0, "write_token_shard '{}': vocab_size must be positive, got {}", path,
            vocab_size);
  HYP_CHECK(n >= 0, "write_token_shard '{}': negative token count {}", path, n);
  HYP_CHECK(n == 0 || tokens != nullptr, "write_token_shard '{}': null token pointer", path);
  const uint32_t token_bytes = vocab_size <= 65536 ? 2 : 4;
  unsigned char header[kTokenShardHeaderBytes] = {};
  std::memcpy(header, kTokenShardMagic, 8);
  put<uint32_t>(header + 8, kTokenShardVersion);
  put<uint32_t>(header + 12, token_bytes);
  put<uint64_t>(header + 16, static_cast<uint64_t>(n));
  put<uint32_t>(header + 24, static_cast<uint32_t>(vocab_size));
  put<uint32_t>(header + 28, 0);
  AtomicFileWriter w(path);
  w.write(header, sizeof(header));
  if (token_bytes == 2) {
    write_tokens<uint16_t>(w, path, tokens, n, vocab_size);
  } else {
    write_tokens<uint32_t>(w, path, tokens, n, vocab_size);
  }
  w.commit();
}

TokenShard TokenShard::open(const std::string& path) {
  TokenShard s;
  s.path_ = path;
  int64_t size = 0;
  const int fd = open_regular_file(path, &size);  // never a FIFO or device
  const uint64_t file_bytes = static_cast<uint64_t>(size);
  if (file_bytes < static_cast<uint64_t>(kTokenShardHeaderBytes)) {
    ::close(fd);
    fail("token shard '{}': truncated header ({} bytes, expected at least {})", path, file_bytes,
         kTokenShardHeaderBytes);
  }
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) fail("token shard '{}': mmap failed: {}", path, std::strerror(map_errno));
  s.map_ = map;
  s.map_bytes_ = file_bytes;
  // From here on `s` owns the mapping; errors unmap it through the destructor.
  const auto* h = static_cast<const unsigned char*>(map);
  HYP_CHECK(std::memcmp(h, kTokenShardMagic, 8) == 0,
            "token shard '{}': bad magic (not a hyperion token shard; expected \"HYPTOKS1\")",
            path);
  const uint32_t version = get<uint32_t>(h + 8);
  HYP_CHECK(version == kTokenShardVersion, "token shard '{}': unsupported version {} (expected {})",
            path, version, kTokenShardVersion);
  const uint32_t token_bytes = get<uint32_t>(h + 12);
  HYP_CHECK(token_bytes == 2 || token_bytes == 4,
            "token shard '{}': token_bytes is {} (expected 2 or 4)", path, token_bytes);
  const uint64_t count = get<uint64_t>(h + 16);
  const uint32_t vocab = get<uint32_t>(h + 24);
  HYP_CHECK(vocab > 0 && vocab <= static_cast<uint32_t>(INT32_MAX),
            "token shard '{}': invalid vocab_size {}", path, vocab);
  HYP_CHECK(token_bytes == 4 || vocab <= 65536,
            "token shard '{}': vocab_size {} does not fit 2-byte tokens", path, vocab);
  const uint32_t reserved = get<uint32_t>(h + 28);
  HYP_CHECK(reserved == 0, "token shard '{}': reserved header field is {} (expected 0)", path,
            reserved);
  const uint64_t payload = file_bytes - kTokenShardHeaderBytes;
  HYP_CHECK(count <= payload / token_bytes,
            "token shard '{}': truncated: token_count {} needs {} bytes per token, the file has "
            "only {} bytes of tokens",
            path, count, token_bytes, payload);
  HYP_CHECK(payload == count * token_bytes,
            "token shard '{}': {} bytes of trailing data after {} tokens", path,
            payload - count * token_bytes, count);
  s.tokens_ = h + kTokenShardHeaderBytes;
  s.count_ = static_cast<int64_t>(count);
  s.vocab_size_ = static_cast<int32_t>(vocab);
  s.token_bytes_ = static_cast<int>(token_bytes);
  // The header is 32 bytes into a page-aligned mapping, so the token array is aligned.
  const int64_t n = s.count_;
  int64_t bad = -1;
  if (token_bytes == 2) {
    const auto* p = reinterpret_cast<const uint16_t*>(s.tokens_);
    if (max_token(p, n) >= vocab) bad = first_token_at_least(p, n, vocab);
  } else {
    const auto* p = reinterpret_cast<const uint32_t*>(s.tokens_);
    if (max_token(p, n) >= vocab) bad = first_token_at_least(p, n, vocab);
  }
  if (bad >= 0) {
    const uint32_t t =
        token_bytes == 2 ? get<uint16_t>(s.tokens_ + bad * 2) : get<uint32_t>(s.tokens_ + bad * 4);
    fail("token shard '{}': token {} at position {} is >= vocab_size {}", path, t, bad, vocab);
  }
  return s;
}

TokenShard::TokenShard(TokenShard&& o) noexcept
    : path_(std::move(o.path_)),
      map_(std::exchange(o.map_, nullptr)),
      map_bytes_(std::exchange(o.map_bytes_, 0)),
      tokens_(std::exchange(o.tokens_, nullptr)),
      count_(std::exchange(o.count_, 0)),
      vocab_size_(std::exchange(o.vocab_size_, 0)),
      token_bytes_(std::exchange(o.token_bytes_, 0)) {}

TokenShard& TokenShard::operator=(TokenShard&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
    tokens_ = std::exchange(o.tokens_, nullptr);
    count_ = std::exchange(o.count_, 0);
    vocab_size_ = std::exchange(o.vocab_size_, 0);
    token_bytes_ = std::exchange(o.token_bytes_, 0);
  }
  return *this;
}

TokenShard::~TokenShard() {
  unmap();
}

void TokenShard::unmap() noexcept {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
}

void TokenShard::read(int64_t begin, int64_t n, int32_t* out) const {
  HYP_CHECK(begin >= 0 && n >= 0 && begin <= count_ && n <= count_ - begin,
            "token shard '{}': read of [{}, {}) is outside its {} tokens", path_, begin, begin + n,
            count_);
  if (token_bytes_ == 2) {
    const auto* p = reinterpret_cast<const uint16_t*>(tokens_) + begin;
    for (int64_t i = 0; i < n; ++i) out[i] = p[i];
  } else {
    const auto* p = reinterpret_cast<const uint32_t*>(tokens_) + begin;
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(p[i]);
  }
}

}  // namespace hyperion::io
