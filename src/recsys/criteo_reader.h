// Streams examples from Criteo click logs (the Kaggle Display Advertising Challenge train
// file and the Terabyte day_0 .. day_23 files) into a BatchBuilder.
//
// Format: one example per line, 40 tab-separated fields:
//   field 1        label, 0 or 1
//   fields 2-14    I1..I13: integer counts, possibly negative, empty when missing
//   fields 15-40   C1..C26: hashed categories, 1-8 hex digits, empty when missing
// A line may end in CRLF (the \r is dropped); the last line may lack its newline.
//
// Conversion (the DLRM preprocessing): dense feature j = log(1 + max(I_j, 0)), 0 when
// missing; table t's bag is the single id parse_hex(C_t) % table_rows[t], or empty when
// C_t is missing.
//
// The file is streamed through a 1 MiB buffer, never loaded whole. Reading wraps to the
// start of the file at its end, starting the next epoch; the position (byte offset, line
// and epoch) is a State a checkpoint can hold. Every malformed line is an error naming
// file:line, the field (e.g. "field 3 (I2)") and the text at fault; a bad line is never
// skipped. The file must not change while it is read.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "recsys/batch_builder.h"

namespace hyperion::recsys {

inline constexpr int kCriteoDenseFeatures = 13;
inline constexpr int kCriteoTables = 26;
inline constexpr int64_t kCriteoMaxLineBytes = int64_t{1} << 16;  // without the newline

class CriteoReader {
 public:
  // Where the next example starts: its byte offset in the file, the lines of the
  // current epoch already consumed (the next line is line + 1, 1-based) and the epoch.
  struct State {
    uint64_t offset = 0;
    uint64_t line = 0;
    uint64_t epoch = 0;
  };

  // Opens `path`; table_rows holds the embedding rows of the 26 tables (each in
  // [1, 2^31], ids being int32). Throws hyperion::Error naming the file when it is
  // missing, unreadable or empty, or naming table_rows when it is not 26 valid sizes.
  CriteoReader(std::string path, std::vector<int64_t> table_rows);
  ~CriteoReader();
  CriteoReader(const CriteoReader&) = delete;
  CriteoReader& operator=(const CriteoReader&) = delete;

  // Appends the next `count` (>= 0) examples to `into`, which must have been begun with
  // 26 tables and 13 dense features, wrapping to the start of the file (epoch + 1) at its
  // end. Throws hyperion::Error at a malformed line, naming file:line and the field; the
  // examples before it stay appended and the reader stays at the bad line.
  void read(int64_t count, BatchBuilder& into);
  // Passes over the next `count` (>= 0) lines without parsing them (only their length is
  // checked), wrapping like read(): for a rank taking its slice of a shared file.
  void skip(int64_t count);

  State state() const { return {offset_, line_, epoch_}; }
  // Resumes at `s` (from state(), maybe of another reader of the same file). Throws
  // naming the file when s.offset is past its end or not at the start of a line.
  void restore(const State& s);

  const std::string& path() const { return path_; }

 private:
  // The next line (without its newline and \r) into `line`, returning the bytes it takes
  // in the file with its newline; 0 at the end of the file. Does not advance.
  size_t peek_line(std::string_view& line);
  // Consumes the line peek_line returned (`bytes` long), wrapping at the end of the file.
  void advance(size_t bytes);
  void seek(uint64_t offset);
  // Reads more of the file into the buffer after the unconsumed bytes; false at its end.
  bool fill();
  void parse_line(std::string_view line, BatchBuilder& into);

  std::string path_;
  std::vector<int64_t> table_rows_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint64_t read_pos_ = 0;  // file offset of buffer_[end_]

  uint64_t offset_ = 0, line_ = 0, epoch_ = 0;

  std::vector<char> buffer_;
  size_t begin_ = 0, end_ = 0;  // unconsumed bytes of buffer_, starting at file offset_
  bool at_eof_ = false;         // the buffer holds everything up to the end of the file

  std::vector<float> dense_;
  std::vector<int32_t> ids_, bag_sizes_;
};

}  // namespace hyperion::recsys
