// LineReader (base/line_reader.h): lines in bounded memory, against a plain split of the
// same bytes, with lines over the bound skipped whole.
#include "base/line_reader.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "../test_files.h"

namespace hyperion {
namespace {

using testing_util::TempDir;

struct Read {
  std::vector<std::string> lines;  // "<too long>" for a skipped one
  bool last_unterminated = false;
};

Read read_all(const std::string& path, size_t max, int64_t start = 0) {
  LineReader in(path, max, start);
  Read r;
  std::string_view line;
  for (LineReader::Status st; (st = in.next(line)) != LineReader::Status::kEnd;) {
    r.lines.push_back(st == LineReader::Status::kTooLong ? "<too long>" : std::string(line));
    r.last_unterminated = in.unterminated();
    EXPECT_EQ(in.line_number(), static_cast<int64_t>(r.lines.size()));
  }
  return r;
}

// The reference: split on '\n'; a last piece without '\n' is a line when not empty.
Read split(const std::string& text, size_t max) {
  Read r;
  size_t from = 0;
  while (from < text.size()) {
    const size_t nl = text.find('\n', from);
    const size_t end = nl == std::string::npos ? text.size() : nl;
    r.lines.push_back(end - from > max ? "<too long>" : text.substr(from, end - from));
    r.last_unterminated = nl == std::string::npos;
    from = end + 1;
  }
  return r;
}

TEST(LineReader, MatchesASplitOfTheSameBytes) {
  TempDir dir;
  std::mt19937 rng(7);
  for (size_t max : {size_t{1}, size_t{5}, size_t{100}, size_t{70000}, size_t{1} << 20}) {
    for (int trial = 0; trial < 6; ++trial) {
      std::string text;
      const int lines = static_cast<int>(rng() % 50);
      for (int i = 0; i < lines; ++i) {
        // Mostly short lines, some around the bound and some far over it (a chunk or more).
        const size_t kind = rng() % 10;
        const size_t len = kind < 6 ? rng() % 20 : kind < 8 ? max + rng() % 3 - 1 : 150000;
        text.append(len, static_cast<char>('a' + i % 26));
        text += '\n';
      }
      if (rng() % 2) text += "tail";
      const std::string path = dir.write("f.jsonl", text);
      const Read want = split(text, max), got = read_all(path, max);
      EXPECT_EQ(got.lines, want.lines) << "max " << max << " trial " << trial;
      EXPECT_EQ(got.last_unterminated, want.last_unterminated);
    }
  }
}

TEST(LineReader, AHugeLineIsSkippedNotHeld) {
  TempDir dir;
  // 64 MiB on one line between two short ones: read with a 1 KiB bound.
  std::string text = "first\n";
  text.append(64u << 20, 'x');
  text += "\nlast\n";
  const std::string path = dir.write("big.jsonl", text);
  const Read r = read_all(path, 1024);
  EXPECT_EQ(r.lines, (std::vector<std::string>{"first", "<too long>", "last"}));
}

TEST(LineReader, StartsAtAnOffsetAndReportsWhereItIs) {
  TempDir dir;
  const std::string path = dir.write("o.jsonl", "aa\nbbb\ncc");
  LineReader in(path, 100, 3);
  std::string_view line;
  ASSERT_EQ(in.next(line), LineReader::Status::kLine);
  EXPECT_EQ(line, "bbb");
  EXPECT_EQ(in.offset(), 7);
  ASSERT_EQ(in.next(line), LineReader::Status::kLine);
  EXPECT_EQ(line, "cc");
  EXPECT_TRUE(in.unterminated());
  EXPECT_EQ(in.offset(), 9);
  EXPECT_EQ(in.next(line), LineReader::Status::kEnd);
}

TEST(LineReader, AMissingFileIsNamed) {
  try {
    LineReader in("/nonexistent/events.jsonl", 10);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/events.jsonl"), std::string::npos);
  }
}

}  // namespace
}  // namespace hyperion
