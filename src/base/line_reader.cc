#include "base/line_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/input_file.h"

namespace hyperion {

namespace {
constexpr size_t kChunk = 64 * 1024;
}

LineReader::LineReader(const std::string& path, size_t max_line_bytes, int64_t start)
    : path_(path), max_(std::max<size_t>(max_line_bytes, 1)), base_(start) {
  fd_ = open_regular_file(path, nullptr);  // never blocks on a FIFO, never reads a device
  if (start > 0 && ::lseek(fd_, start, SEEK_SET) != start) {
    const int err = errno;
    ::close(fd_);
    fail("{}: cannot seek to byte {}: {}", path, start, os_error_text(err));
  }
  buf_.resize(std::min(max_ + 1, kChunk) + kChunk);
}

LineReader::~LineReader() {
  if (fd_ >= 0) ::close(fd_);
}

bool LineReader::fill() {
  if (eof_) return false;
  if (begin_ > 0) {  // keep the unread part at the front
    std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    base_ += static_cast<int64_t>(begin_);
    begin_ = 0;
  }
  if (end_ == buf_.size()) buf_.resize(std::min(buf_.size() * 2, max_ + 1 + kChunk));
  for (;;) {
    const ssize_t n = ::read(fd_, buf_.data() + end_, buf_.size() - end_);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("{}: read failed: {}", path_, os_error_text(errno));
    if (n == 0) {
      eof_ = true;
      return false;
    }
    end_ += static_cast<size_t>(n);
    return true;
  }
}

LineReader::Status LineReader::next(std::string_view& line) {
  line = {};
  unterminated_ = false;
  size_t scanned = begin_;
  for (;;) {
    const char* nl = static_cast<const char*>(
        std::memchr(buf_.data() + scanned, '\n', end_ - scanned));
    if (nl != nullptr) {
      const size_t at = static_cast<size_t>(nl - buf_.data());
      ++line_number_;
      if (at - begin_ > max_) {
        begin_ = at + 1;
        return Status::kTooLong;
      }
      line = std::string_view(buf_.data() + begin_, at - begin_);
      begin_ = at + 1;
      return Status::kLine;
    }
    if (end_ - begin_ > max_) {
      // Too long already: read past the rest of it without keeping any of it.
      ++line_number_;
      for (;;) {
        base_ += static_cast<int64_t>(end_);
        begin_ = end_ = 0;
        if (!fill()) {
          unterminated_ = true;  // the file's last line, without its '\n'
          return Status::kTooLong;
        }
        if (const void* p = std::memchr(buf_.data(), '\n', end_)) {
          begin_ = static_cast<size_t>(static_cast<const char*>(p) - buf_.data()) + 1;
          return Status::kTooLong;
        }
      }
    }
    scanned = end_;
    const size_t offset = begin_;
    if (!fill()) {
      if (begin_ == end_) return Status::kEnd;
      ++line_number_;
      unterminated_ = true;
      line = std::string_view(buf_.data() + begin_, end_ - begin_);
      begin_ = end_;
      return Status::kLine;
    }
    scanned -= offset;  // fill() moved the unread part to the front
  }
}

}  // namespace hyperion
