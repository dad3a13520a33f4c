// Reading a line-oriented file (JSON lines: events.jsonl, metrics.jsonl) in bounded
// memory: through a buffer of at most `max_line_bytes` + 64 KiB, whatever the file's size
// or the length of its lines. A line longer than the bound is skipped whole (read past,
// never held) and reported as such, so a corrupt or hostile file cannot make its reader
// allocate gigabytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hyperion {

class LineReader {
 public:
  enum class Status { kLine, kTooLong, kEnd };

  // Opens `path` at byte `start` (the start of a line); throws hyperion::Error naming it
  // when it cannot be read.
  LineReader(const std::string& path, size_t max_line_bytes, int64_t start = 0);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line, without its '\n' (valid until the next call): kLine; kTooLong for a
  // line over the bound (skipped, `line` empty); kEnd at the end of the file.
  Status next(std::string_view& line);
  // The 1-based number of the line last returned (or skipped).
  int64_t line_number() const { return line_number_; }
  // Whether the line last returned had no '\n' (the file's last line, maybe torn).
  bool unterminated() const { return unterminated_; }
  size_t max_line_bytes() const { return max_; }
  // The file offset just past what next() has returned or skipped so far.
  int64_t offset() const { return base_ + static_cast<int64_t>(begin_); }

 private:
  bool fill();  // reads more after end_; false at end of file

  std::string path_;
  int fd_ = -1;
  size_t max_;
  std::vector<char> buf_;
  size_t begin_ = 0, end_ = 0;
  int64_t base_ = 0;  // the file offset of buf_[0]
  bool eof_ = false, unterminated_ = false;
  int64_t line_number_ = 0;
};

}  // namespace hyperion
