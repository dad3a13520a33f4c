#include "recsys/criteo_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <utility>

#include "base/error.h"
#include "base/input_file.h"

namespace hyperion::recsys {

namespace {

constexpr size_t kBufferBytes = size_t{1} << 20;
constexpr int kFields = 1 + kCriteoDenseFeatures + kCriteoTables;

// "label", "I1".."I13", "C1".."C26" for the 1-based field index.
std::string field_name(int field) {
  if (field == 1) return "label";
  if (field <= 1 + kCriteoDenseFeatures) return fmt::format("I{}", field - 1);
  return fmt::format("C{}", field - 1 - kCriteoDenseFeatures);
}

// The text at fault as an error shows it: at most 40 bytes, control bytes as '?'.
std::string shown(std::string_view text) {
  constexpr size_t kShown = 40;
  std::string s(text.substr(0, kShown));
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  if (text.size() > kShown) s += "...";
  return s;
}

}  // namespace

CriteoReader::CriteoReader(std::string path, std::vector<int64_t> table_rows)
    : path_(std::move(path)), table_rows_(std::move(table_rows)) {
  HYP_CHECK(table_rows_.size() == kCriteoTables,
            "CriteoReader '{}': table_rows has {} entries, expected one per categorical "
            "feature ({})",
            path_, table_rows_.size(), kCriteoTables);
  for (size_t t = 0; t < table_rows_.size(); ++t)
    HYP_CHECK(table_rows_[t] >= 1 && table_rows_[t] <= (int64_t{1} << 31),
              "CriteoReader '{}': table_rows[{}] (C{}) = {} is outside [1, 2^31]", path_, t, t + 1,
              table_rows_[t]);
  int64_t size = 0;
  fd_ = open_regular_file(path_, &size);  // never blocks on a FIFO, never reads a device
  if (size == 0) {
    ::close(fd_);
    fail("Criteo file '{}' is empty", path_);
  }
  size_ = static_cast<uint64_t>(size);
  buffer_.resize(kBufferBytes);
  dense_.resize(kCriteoDenseFeatures);
  ids_.reserve(kCriteoTables);
  bag_sizes_.resize(kCriteoTables);
  seek(0);
}

CriteoReader::~CriteoReader() {
  if (fd_ >= 0) ::close(fd_);
}

void CriteoReader::seek(uint64_t offset) {
  offset_ = offset;
  read_pos_ = offset;
  begin_ = end_ = 0;
  at_eof_ = false;
}

bool CriteoReader::fill() {
  if (at_eof_) return false;
  if (begin_ > 0) {
    std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  for (;;) {
    const ssize_t n =
        ::pread(fd_, buffer_.data() + end_, buffer_.size() - end_, static_cast<off_t>(read_pos_));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("Criteo file '{}': read failed: {}", path_, os_error_text(errno));
    if (n == 0) {
      at_eof_ = true;
      return false;
    }
    end_ += static_cast<size_t>(n);
    read_pos_ += static_cast<uint64_t>(n);
    return true;
  }
}

size_t CriteoReader::peek_line(std::string_view& line) {
  // A line holds at most kCriteoMaxLineBytes, then maybe \r, then \n.
  constexpr size_t kMax = static_cast<size_t>(kCriteoMaxLineBytes);
  size_t raw = 0, bytes = 0;
  for (;;) {
    const char* s = buffer_.data() + begin_;
    const size_t avail = end_ - begin_;
    const void* nl = std::memchr(s, '\n', std::min(avail, kMax + 2));
    if (nl != nullptr) {
      raw = static_cast<size_t>(static_cast<const char*>(nl) - s);
      bytes = raw + 1;
      break;
    }
    HYP_CHECK(avail < kMax + 2, "{}:{}: line is longer than {} bytes", path_, line_ + 1, kMax);
    if (!fill()) {
      if (avail == 0) return 0;
      raw = bytes = avail;  // the last line, without a newline
      break;
    }
  }
  line = std::string_view(buffer_.data() + begin_, raw);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  HYP_CHECK(line.size() <= kMax, "{}:{}: line is longer than {} bytes", path_, line_ + 1, kMax);
  return bytes;
}

void CriteoReader::advance(size_t bytes) {
  begin_ += bytes;
  offset_ += bytes;
  ++line_;
  if (offset_ >= size_) {  // the end of the file: the next epoch starts
    ++epoch_;
    line_ = 0;
    seek(0);
  }
}

void CriteoReader::read(int64_t count, BatchBuilder& into) {
  HYP_CHECK(count >= 0, "CriteoReader::read '{}': count = {} is negative", path_, count);
  HYP_CHECK(into.tables() == kCriteoTables && into.dense_features() == kCriteoDenseFeatures,
            "CriteoReader::read '{}': the BatchBuilder was begun with {} tables and {} dense "
            "features, expected {} and {}",
            path_, into.tables(), into.dense_features(), kCriteoTables, kCriteoDenseFeatures);
  for (int64_t n = 0; n < count;) {
    std::string_view line;
    const size_t bytes = peek_line(line);
    if (bytes == 0) {  // the file ended early (it shrank since it was opened)
      HYP_CHECK(offset_ > 0, "Criteo file '{}' is empty", path_);
      ++epoch_;
      line_ = 0;
      seek(0);
      continue;
    }
    parse_line(line, into);
    advance(bytes);
    ++n;
  }
}

void CriteoReader::skip(int64_t count) {
  HYP_CHECK(count >= 0, "CriteoReader::skip '{}': count = {} is negative", path_, count);
  for (int64_t n = 0; n < count;) {
    std::string_view line;
    const size_t bytes = peek_line(line);
    if (bytes == 0) {
      HYP_CHECK(offset_ > 0, "Criteo file '{}' is empty", path_);
      ++epoch_;
      line_ = 0;
      seek(0);
      continue;
    }
    advance(bytes);
    ++n;
  }
}

void CriteoReader::restore(const State& s) {
  HYP_CHECK(s.offset <= size_,
            "CriteoReader::restore '{}': state offset {} is past the end of the file ({} "
            "bytes)",
            path_, s.offset, size_);
  if (s.offset > 0) {
    char before = 0;
    ssize_t n;
    do {
      n = ::pread(fd_, &before, 1, static_cast<off_t>(s.offset - 1));
    } while (n < 0 && errno == EINTR);
    if (n < 0) fail("Criteo file '{}': read failed: {}", path_, os_error_text(errno));
    HYP_CHECK(n == 1 && before == '\n',
              "CriteoReader::restore '{}': state offset {} is not the start of a line", path_,
              s.offset);
  }
  seek(s.offset);
  line_ = s.line;
  epoch_ = s.epoch;
}

void CriteoReader::parse_line(std::string_view line, BatchBuilder& into) {
  const uint64_t line_no = line_ + 1;
  const auto tabs = std::count(line.begin(), line.end(), '\t');
  HYP_CHECK(tabs + 1 == kFields,
            "{}:{}: field count: found {} tab-separated fields, expected {} (label, I1-I13, "
            "C1-C26)",
            path_, line_no, tabs + 1, kFields);
  auto bad = [&](int field, std::string_view text, const char* what) {
    fail("{}:{}: field {} ({}): '{}' {}", path_, line_no, field, field_name(field), shown(text),
         what);
  };

  float label = 0.0f;
  ids_.clear();
  size_t pos = 0;
  for (int field = 1; field <= kFields; ++field) {
    const size_t tab = field < kFields ? line.find('\t', pos) : line.size();
    const std::string_view text = line.substr(pos, tab - pos);
    pos = tab + 1;
    const char* first = text.data();
    const char* last = text.data() + text.size();
    if (field == 1) {
      if (text != "0" && text != "1") bad(field, text, "is not 0 or 1");
      label = text == "1" ? 1.0f : 0.0f;
    } else if (field <= 1 + kCriteoDenseFeatures) {
      int64_t x = 0;
      if (!text.empty()) {
        const auto [end, ec] = std::from_chars(first, last, x);
        if (ec == std::errc::result_out_of_range)
          bad(field, text, "is out of range for a 64-bit integer");
        if (ec != std::errc() || end != last) bad(field, text, "is not an integer");
      }
      dense_[size_t(field - 2)] =
          static_cast<float>(std::log1p(static_cast<double>(std::max<int64_t>(x, 0))));
    } else {
      const size_t t = static_cast<size_t>(field - 2 - kCriteoDenseFeatures);
      if (text.empty()) {
        bag_sizes_[t] = 0;
        continue;
      }
      uint32_t h = 0;
      const auto [end, ec] = std::from_chars(first, last, h, 16);
      if (text.size() > 8 || ec != std::errc() || end != last)
        bad(field, text, "is not a hashed category (1-8 hex digits)");
      ids_.push_back(static_cast<int32_t>(static_cast<int64_t>(h) % table_rows_[t]));
      bag_sizes_[t] = 1;
    }
  }
  into.add_example(label, dense_, ids_, bag_sizes_);
}

}  // namespace hyperion::recsys
