#include "text/text_input.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "../test_files.h"
#include "base/error.h"
#include "io/atomic_file.h"

namespace hyperion::text {
namespace {

using namespace hyperion::testing_util;

namespace fs = std::filesystem;
using Docs = std::vector<std::string>;

TEST(TextInput, FortuneFormat) {
  TempDir dir;
  // '%' lines separate; blank lines inside an entry are kept, blank edges trimmed,
  // empty entries skipped, indentation kept.
  const auto p = dir.write("f.txt",
                           "First entry\nline two\n%\n\n\tSecond entry\n\nsame entry\n\n%\n%\n"
                           "  \n%\nLast, no newline");
  EXPECT_EQ(read_documents(p),
            (Docs{"First entry\nline two", "\tSecond entry\n\nsame entry", "Last, no newline"}));
  // A line with more than '%' is text.
  EXPECT_EQ(read_documents(dir.write("g.txt", "a\n%%\n 100% sure\n%\nb\n")),
            (Docs{"a\n%%\n 100% sure", "b"}));
}

TEST(TextInput, BlankLineFormat) {
  TempDir dir;
  const auto p = dir.write("b.txt", "\n\npara one\nstill one\n\n\n \t \npara two\r\nline\r\n\n");
  EXPECT_EQ(read_documents(p), (Docs{"para one\nstill one", "para two\nline"}));
  EXPECT_EQ(read_documents(dir.write("one.txt", "single")), (Docs{"single"}));
  EXPECT_TRUE(read_documents(dir.write("empty.txt", "")).empty());
  EXPECT_TRUE(read_documents(dir.write("blank.txt", "\n \n\t\n")).empty());
  // A UTF-8 byte order mark is not part of the text.
  EXPECT_EQ(read_documents(dir.write("bom.txt", "\xEF\xBB\xBFhello\n")), (Docs{"hello"}));
}

TEST(TextInput, Jsonl) {
  TempDir dir;
  const auto p =
      dir.write("d.jsonl",
                "{\"text\": \"first doc\\nwith newline\", \"id\": 1}\n"
                "\n"
                "  {\"meta\": {\"a\": [1, 2]}, \"text\": \"caf\\u00e9 \\ud83d\\ude00\"}\r\n"
                "{\"text\": \"\"}\n"
                "{\"text\": \"  \"}\n"
                "{\"text\": \"last\"}");
  EXPECT_EQ(read_documents(p),
            (Docs{"first doc\nwith newline", "caf\xC3\xA9 \xF0\x9F\x98\x80", "last"}));
}

TEST(TextInput, JsonlErrorsNameFileLineAndField) {
  TempDir dir;
  const auto bad = dir.write("bad.jsonl", "{\"text\": \"ok\"}\n\n{\"text\": \"unterminated}\n");
  expect_error([&] { read_documents(bad); }, {bad + ":3", "invalid JSON"});
  const auto missing = dir.write("missing.jsonl", "{\"text\": \"ok\"}\n{\"body\": \"x\"}\n");
  expect_error([&] { read_documents(missing); }, {missing + ":2", "missing field 'text'"});
  const auto number = dir.write("number.jsonl", "{\"text\": 42}\n");
  expect_error([&] { read_documents(number); }, {number + ":1", "'text'", "string", "number"});
  const auto null_text = dir.write("null.jsonl", "{\"text\": null}\n");
  expect_error([&] { read_documents(null_text); }, {null_text + ":1", "'text'", "null"});
  const auto array = dir.write("array.jsonl", "[\"text\"]\n");
  expect_error([&] { read_documents(array); }, {array + ":1", "JSON object"});
  const auto trailing = dir.write("trail.jsonl", "{\"text\": \"a\"} {\"text\": \"b\"}\n");
  expect_error([&] { read_documents(trailing); }, {trailing + ":1", "invalid JSON"});
}

TEST(TextInput, FileErrors) {
  TempDir dir;
  const auto csv = dir.write("data.csv", "a,b\n");
  expect_error([&] { read_documents(csv); }, {csv, ".txt or .jsonl"});
  const std::string missing = (dir.path / "nope.txt").string();
  expect_error([&] { read_documents(missing); }, {missing});
}

#ifdef HYPERION_SOURCE_DIR
// The corpus shipped for the default training job (data/README.md) parses as documented.
TEST(TextInput, BundledCorpus) {
  const auto docs = read_documents(std::string(HYPERION_SOURCE_DIR) + "/data/corpus/fortunes.txt");
  EXPECT_EQ(docs.size(), 11927u);
  size_t bytes = 0;
  for (const auto& d : docs) {
    ASSERT_FALSE(d.empty());
    bytes += d.size();
    for (unsigned char c : d) {
      ASSERT_TRUE(c >= 0x20 || c == '\n' || c == '\t') << "control byte " << int(c) << " in " << d;
    }
  }
  EXPECT_GT(bytes, 1500000u);
}
#endif

}  // namespace
}  // namespace hyperion::text
