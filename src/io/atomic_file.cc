#include "io/atomic_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "base/error.h"
#include "base/input_file.h"

namespace hyperion::io {

namespace {

constexpr size_t kBufferSize = size_t{1} << 20;

std::string parent_dir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

// An output may replace a regular file only: renaming over /dev/full (as root), a
// directory or a symbolic link would destroy something that is not ours to replace.
void check_replaceable(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;  // absent: fine (other errors surface later)
  if (!S_ISREG(st.st_mode))
    fail("cannot write '{}': it exists and is {}; only a regular file is replaced (remove it or "
         "choose another output path)",
         path, file_kind_name(st.st_mode));
}

}  // namespace

void make_directories(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("cannot create directory '{}': {}", dir, os_error_text(ec.value()));
}

void fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("cannot open directory '{}' to fsync it: {}", dir, os_error_text(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems do not support fsync on directories; that is not a failure of ours.
  if (rc != 0 && err != EINVAL && err != ENOTSUP)
    fail("cannot fsync directory '{}': {}", dir, os_error_text(err));
}

std::string read_file(const std::string& path, int64_t max_bytes) {
  return read_regular_file(path, max_bytes);
}

MappedFile MappedFile::open(const std::string& path) {
  int64_t size = 0;
  const int fd = open_regular_file(path, &size);
  MappedFile m;
  if (size > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      fail("cannot mmap '{}': {}", path, os_error_text(err));
    }
    m.data_ = static_cast<const unsigned char*>(p);
    m.size_ = static_cast<size_t>(size);
  }
  ::close(fd);  // the mapping keeps the file referenced
  return m;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFileWriter writer(path);
  writer.write(bytes.data(), bytes.size());
  writer.commit();
}

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  HYP_CHECK(!path_.empty(), "AtomicFileWriter: empty output path");
  check_replaceable(path_);
  // A temporary name of our own, created exclusively: a file already there (another
  // writer's, or anything else) is never truncated, nor deleted by abandon().
  static std::atomic<uint64_t> serial{0};
  for (int attempt = 0; fd_ < 0; ++attempt) {
    temp_path_ = fmt::format("{}.tmp.{}.{}", path_, static_cast<int64_t>(::getpid()), serial++);
    fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd_ < 0 && (errno != EEXIST || attempt >= 100))
      fail("cannot create '{}' (temporary file for '{}'): {}", temp_path_, path_,
           os_error_text(errno));
  }
  // A replaced file keeps its permissions (a 0600 file stays private).
  struct stat old {};
  if (::stat(path_.c_str(), &old) == 0) (void)!::fchmod(fd_, old.st_mode & 0777);
  buffer_.reserve(kBufferSize);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!committed_) abandon();
}

void AtomicFileWriter::abandon() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  ::unlink(temp_path_.c_str());
}

void AtomicFileWriter::write_fd(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    // Linux transfers at most ~2 GiB per write call; loop on short writes.
    ssize_t k = ::write(fd_, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      fail("cannot write '{}' (temporary file for '{}'): {}", temp_path_, path_,
           os_error_text(errno));
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void AtomicFileWriter::flush_buffer() {
  if (buffer_.empty()) return;
  write_fd(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void AtomicFileWriter::write(const void* data, size_t n) {
  HYP_CHECK(fd_ >= 0 && !committed_, "AtomicFileWriter: write to '{}' after commit or failure",
            path_);
  if (n == 0) return;
  if (n >= kBufferSize) {
    flush_buffer();
    write_fd(data, n);
  } else {
    if (buffer_.size() + n > kBufferSize) flush_buffer();
    buffer_.append(static_cast<const char*>(data), n);
  }
  written_ += n;
}

void AtomicFileWriter::commit() {
  HYP_CHECK(fd_ >= 0 && !committed_, "AtomicFileWriter: '{}' committed twice or after failure",
            path_);
  flush_buffer();
  if (::fsync(fd_) != 0)
    fail("cannot fsync '{}' (temporary file for '{}'): {}", temp_path_, path_,
         os_error_text(errno));
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0)
    fail("cannot close '{}' (temporary file for '{}'): {}", temp_path_, path_,
         os_error_text(errno));
  check_replaceable(path_);  // again: it may have appeared while we wrote
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0)
    fail("cannot rename '{}' to '{}': {}", temp_path_, path_, os_error_text(errno));
  committed_ = true;
  fsync_directory(parent_dir(path_));
}

}  // namespace hyperion::io
