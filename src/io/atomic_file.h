// Crash-safe file output and whole-file input.
//
// Outputs (checkpoints, converted models, configs) are written to a temporary file in the
// destination's directory ("<path>.tmp.<pid>.<n>", created exclusively, so no other file
// is ever truncated or removed in its place), flushed to disk with fsync, renamed over
// the destination and the directory is fsynced, so after a crash the destination holds
// either the complete old contents or the complete new ones, never a torn mix. Only a
// regular file is ever replaced: an existing directory, device, FIFO, socket or symbolic
// link at the destination is refused with an error naming it. A replaced file keeps its
// read/write/execute permission bits (not set-id bits).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace hyperion::io {

// Writes `bytes` to `path` atomically (see above). Throws hyperion::Error naming the path
// and the OS error.
void write_file_atomic(const std::string& path, std::string_view bytes);

// Reads the whole file: a regular file only, opened without blocking (base/input_file.h),
// of at most max_bytes (a plausible size for what it holds: the default suits any text or
// JSON file read whole). Throws hyperion::Error naming the path and the cause.
inline constexpr int64_t kReadFileMaxBytes = int64_t{2} << 30;
std::string read_file(const std::string& path, int64_t max_bytes = kReadFileMaxBytes);

// Creates `dir` and its parents if missing. Throws hyperion::Error naming the directory
// and the cause ("read-only file system", "disk full", "permission denied").
void make_directories(const std::string& dir);

// fsyncs a directory so that a rename or create inside it is durable.
void fsync_directory(const std::string& dir);

// Read-only memory map of a whole file (readers of large checkpoints use it so that
// tensors are paged in on demand and never copied). Movable; unmaps on destruction. An
// empty file maps to data() == nullptr, size() == 0.
class MappedFile {
 public:
  static MappedFile open(const std::string& path);  // throws naming the path and OS error

  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept { swap(o); }
  MappedFile& operator=(MappedFile&& o) noexcept {
    MappedFile tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void swap(MappedFile& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
  }
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

// Streaming atomic writer: write() any number of times, then commit(). Destroying the
// writer without commit() (an exception, an early return) removes the temporary file and
// leaves any previous file at `path` untouched. Small writes are buffered; large ones go
// straight to the file without a copy.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t n);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  // Flushes, fsyncs, renames over `path` and fsyncs the directory. Nothing may be written
  // afterwards.
  void commit();

  size_t bytes_written() const { return written_; }
  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  void flush_buffer();
  void write_fd(const void* data, size_t n);
  void abandon() noexcept;

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  bool committed_ = false;
  size_t written_ = 0;
  std::string buffer_;
};

}  // namespace hyperion::io
