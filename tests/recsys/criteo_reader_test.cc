#include "recsys/criteo_reader.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../test_files.h"
#include "base/error.h"

namespace hyperion::recsys {
namespace {

using testing_util::expect_error;
using testing_util::TempDir;

std::vector<int64_t> rows_of(int64_t n) {
  return std::vector<int64_t>(26, n);
}

// One TSV line: label, I1..I13, C1..C26 (missing trailing fields are empty).
std::string line(const std::string& label, std::vector<std::string> ints,
                 std::vector<std::string> cats) {
  ints.resize(13);
  cats.resize(26);
  std::string s = label;
  for (const auto& f : ints) s += fmt::format("\t{}", f);
  for (const auto& f : cats) s += fmt::format("\t{}", f);
  return s;
}

// A full, valid line whose label is `label` and whose I1 is `i1` (to tell lines apart).
std::string valid(int label, int i1) {
  std::vector<std::string> cats;
  for (int t = 0; t < 26; ++t) cats.push_back(fmt::format("{:08x}", 0x1000u * unsigned(t) + 7u));
  return line(std::to_string(label), {std::to_string(i1), "2", "3"}, cats);
}

Batch read_batch(CriteoReader& reader, int64_t count) {
  BatchBuilder builder;
  builder.begin(kCriteoTables, kCriteoDenseFeatures, count);
  reader.read(count, builder);
  Batch b;
  builder.finish(b);
  return b;
}

std::vector<int32_t> bag(const Batch& b, int64_t table, int64_t row) {
  const int64_t k = table * b.rows + row;
  return {b.sparse_ids.begin() + b.sparse_offsets[size_t(k)],
          b.sparse_ids.begin() + b.sparse_offsets[size_t(k + 1)]};
}

void expect_same(const Batch& a, const Batch& b) {
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_EQ(a.dense, b.dense);
  EXPECT_EQ(a.sparse_ids, b.sparse_ids);
  EXPECT_EQ(a.sparse_offsets, b.sparse_offsets);
}

TEST(Criteo, ParsesFieldsAndMissingValues) {
  TempDir dir;
  std::vector<std::string> cats(26);
  cats[0] = "68fd1e64";
  cats[1] = "0000000A";  // upper case
  cats[2] = "f";         // short hashes are valid
  cats[25] = "ffffffff";
  const std::string path = dir.write(
      "day_0.tsv", line("1", {"0", "-3", "", "7", "1382"}, cats) + "\n" + line("0", {}, {}) + "\n");
  std::vector<int64_t> table_rows = rows_of(1000);
  table_rows[25] = int64_t{1} << 31;
  CriteoReader reader(path, table_rows);
  const Batch b = read_batch(reader, 2);
  ASSERT_EQ(b.rows, 2);
  EXPECT_EQ(b.labels, (std::vector<float>{1, 0}));
  EXPECT_EQ(b.dense[0], 0.0f);  // log(1 + 0)
  EXPECT_EQ(b.dense[1], 0.0f);  // negative -> 0
  EXPECT_EQ(b.dense[2], 0.0f);  // missing
  EXPECT_FLOAT_EQ(b.dense[3], static_cast<float>(std::log(8.0)));
  EXPECT_FLOAT_EQ(b.dense[4], static_cast<float>(std::log(1383.0)));
  for (int j = 0; j < 13; ++j) EXPECT_EQ(b.dense[size_t(13 + j)], 0.0f);
  EXPECT_EQ(bag(b, 0, 0), (std::vector<int32_t>{int32_t(0x68fd1e64u % 1000)}));
  EXPECT_EQ(bag(b, 1, 0), (std::vector<int32_t>{10}));
  EXPECT_EQ(bag(b, 2, 0), (std::vector<int32_t>{15}));
  EXPECT_EQ(bag(b, 25, 0), (std::vector<int32_t>{int32_t(0xffffffffu % (1u << 31))}));
  for (int t = 3; t < 25; ++t) EXPECT_TRUE(bag(b, t, 0).empty()) << t;
  for (int t = 0; t < 26; ++t) EXPECT_TRUE(bag(b, t, 1).empty()) << t;
  EXPECT_EQ(b.sparse_ids.size(), size_t(4));
}

TEST(Criteo, ReadsTheBundledSample) {
  const std::string path =
      std::string(HYPERION_SOURCE_DIR) + "/tests/recsys/data/criteo_sample.tsv";
  std::vector<int64_t> table_rows;
  for (int t = 0; t < 26; ++t) table_rows.push_back(1 + 997 * t);
  CriteoReader reader(path, table_rows);
  const Batch b = read_batch(reader, 20);
  ASSERT_EQ(b.rows, 20);
  // Line 1: 0  1 1 5 0 1382 4 15 2 181 1 2 (I12 missing) 2  68fd1e64 ... (C22 missing).
  EXPECT_EQ(b.labels[0], 0.0f);
  const std::vector<double> ints = {1, 1, 5, 0, 1382, 4, 15, 2, 181, 1, 2, 0, 2};
  for (size_t j = 0; j < 13; ++j)
    EXPECT_FLOAT_EQ(b.dense[j], static_cast<float>(std::log1p(ints[j]))) << j;
  EXPECT_EQ(bag(b, 0, 0), (std::vector<int32_t>{0}));  // table_rows[0] = 1
  EXPECT_EQ(bag(b, 1, 0), (std::vector<int32_t>{int32_t(0x80e26c9bu % 998)}));
  EXPECT_EQ(bag(b, 25, 0), (std::vector<int32_t>{int32_t(0x9727dd16u % (1 + 997 * 25))}));
  EXPECT_TRUE(bag(b, 21, 0).empty());
  // Line 3 has I2 = -1.
  EXPECT_EQ(b.dense[13 * 2 + 1], 0.0f);
  int positives = 0;
  for (float l : b.labels) positives += l == 1.0f;
  EXPECT_EQ(positives, 7);
  for (int64_t t = 0; t < 26; ++t)
    for (int64_t i = 0; i < 20; ++i)
      for (int32_t id : bag(b, t, i)) {
        EXPECT_GE(id, 0);
        EXPECT_LT(id, table_rows[size_t(t)]);
      }
  EXPECT_EQ(reader.state().epoch, 1u);  // all 20 lines read: the next epoch starts
  EXPECT_EQ(reader.state().line, 0u);
}

TEST(Criteo, WrapsAtEndOfFileIntoTheNextEpoch) {
  TempDir dir;
  // The last line lacks its newline.
  const std::string path =
      dir.write("d.tsv", valid(1, 10) + "\n" + valid(0, 11) + "\n" + valid(1, 12));
  CriteoReader reader(path, rows_of(100));
  Batch a = read_batch(reader, 2);
  EXPECT_EQ(reader.state().line, 2u);
  EXPECT_EQ(reader.state().epoch, 0u);
  EXPECT_EQ(reader.state().offset, valid(1, 10).size() + valid(0, 11).size() + 2);
  Batch b = read_batch(reader, 5);  // line 3, then lines 1, 2, 3 and 1 again
  ASSERT_EQ(b.rows, 5);
  EXPECT_EQ(b.labels, (std::vector<float>{1, 1, 0, 1, 1}));
  for (int i = 0; i < 5; ++i)
    EXPECT_FLOAT_EQ(b.dense[size_t(13 * i)], float(std::log1p(10 + (i + 2) % 3))) << i;
  EXPECT_EQ(reader.state().epoch, 2u);
  EXPECT_EQ(reader.state().line, 1u);
}

TEST(Criteo, StateRestoreAndSkipResumeExactly) {
  const std::string path =
      std::string(HYPERION_SOURCE_DIR) + "/tests/recsys/data/criteo_sample.tsv";
  CriteoReader reader(path, rows_of(5000));
  for (int64_t first : {0, 5, 18}) {  // 18: the next read crosses the end of the file
    reader.restore({});
    reader.skip(first);
    const CriteoReader::State s = reader.state();
    EXPECT_EQ(s.line, uint64_t(first));
    const Batch a = read_batch(reader, 7);
    const CriteoReader::State after = reader.state();

    CriteoReader other(path, rows_of(5000));
    other.restore(s);
    expect_same(a, read_batch(other, 7));
    EXPECT_EQ(other.state().offset, after.offset);
    EXPECT_EQ(other.state().line, after.line);
    EXPECT_EQ(other.state().epoch, after.epoch);

    // skip(k) then read = read and drop the first k.
    CriteoReader whole(path, rows_of(5000));
    const Batch all = read_batch(whole, first + 7);
    EXPECT_EQ(std::vector<float>(all.labels.begin() + first, all.labels.end()), a.labels);
  }
  EXPECT_EQ(reader.state().epoch, 1u);  // 18 + 7 lines of a 20-line file

  CriteoReader::State bad = reader.state();
  bad.offset = 3;  // inside line 1
  expect_error([&] { reader.restore(bad); }, {"criteo_sample.tsv", "offset 3", "start of a line"});
  bad.offset = 1 << 30;
  expect_error([&] { reader.restore(bad); }, {"criteo_sample.tsv", "past the end"});
}

TEST(Criteo, CrlfLinesParseLikeLf) {
  TempDir dir;
  const std::string l1 = valid(1, 3), l2 = line("0", {"", "5"}, {"abc"});
  CriteoReader lf(dir.write("lf.tsv", l1 + "\n" + l2 + "\n"), rows_of(77));
  CriteoReader crlf(dir.write("crlf.tsv", l1 + "\r\n" + l2 + "\r\n"), rows_of(77));
  const Batch a = read_batch(lf, 4), b = read_batch(crlf, 4);
  expect_same(a, b);
  EXPECT_EQ(bag(b, 0, 1), (std::vector<int32_t>{0xabc % 77}));
  EXPECT_EQ(crlf.state().epoch, 2u);
}

// Writes a valid line 1 and `bad` as line 2; expects reading to fail naming
// bad.tsv:2 and every needle, without skipping the line.
void expect_bad_line(const std::string& bad, std::vector<std::string> needles) {
  TempDir dir;
  const std::string path = dir.write("bad.tsv", valid(0, 1) + "\n" + bad + "\n" + valid(1, 2));
  CriteoReader reader(path, rows_of(100));
  BatchBuilder builder;
  builder.begin(26, 13);
  needles.push_back("bad.tsv:2");
  expect_error([&] { reader.read(3, builder); }, needles);
  EXPECT_EQ(builder.rows(), 1);  // line 1 was read
  EXPECT_EQ(reader.state().line, 1u);
  expect_error([&] { reader.read(1, builder); }, needles);  // still at line 2
  EXPECT_EQ(builder.rows(), 1);
}

TEST(Criteo, RejectsMalformedLines) {
  std::vector<std::string> cats(26, "0a0b0c0d");
  const std::vector<std::string> ints(13, "1");
  // Wrong field counts: 39, 41, and an empty line.
  expect_bad_line(valid(1, 1).substr(0, valid(1, 1).rfind('\t')), {"field count", "found 39"});
  expect_bad_line(valid(1, 1) + "\t", {"field count", "found 41"});
  expect_bad_line("", {"field count", "found 1 "});
  expect_bad_line(line("2", ints, cats), {"field 1 (label)", "'2'", "not 0 or 1"});
  expect_bad_line(line("", ints, cats), {"field 1 (label)", "''"});
  expect_bad_line(line("1.0", ints, cats), {"field 1 (label)", "'1.0'"});
  expect_bad_line(line("1", {"1", "abc"}, cats), {"field 3 (I2)", "'abc'", "not an integer"});
  expect_bad_line(line("1", {"1", "2", "3", "4", "1.5"}, cats), {"field 6 (I5)", "'1.5'"});
  expect_bad_line(
      line("1", {"1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", " 7"}, cats),
      {"field 14 (I13)", "' 7'"});
  expect_bad_line(line("1", {"99999999999999999999"}, cats), {"field 2 (I1)", "out of range"});
  cats[0] = "123456789";  // 9 digits
  expect_bad_line(line("1", ints, cats), {"field 15 (C1)", "'123456789'", "hex digits"});
  cats[0] = "0a0b0c0d";
  cats[2] = "xyz12345";
  expect_bad_line(line("1", ints, cats), {"field 17 (C3)", "'xyz12345'"});
  cats[2] = "0a0b0c0d";
  cats[25] = "-1";
  expect_bad_line(line("1", ints, cats), {"field 40 (C26)", "'-1'"});
  // The text at fault is truncated to 40 bytes.
  const std::string long_text(100, 'q');
  expect_bad_line(line("1", {long_text}, cats), {"field 2 (I1)", std::string(40, 'q') + "...'"});
  {
    TempDir dir;
    CriteoReader reader(dir.write("t.tsv", line("1", {long_text}, cats)), rows_of(10));
    BatchBuilder builder;
    builder.begin(26, 13);
    try {
      reader.read(1, builder);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).find(std::string(41, 'q')), std::string::npos) << e.what();
    }
  }
  // A line over 64 KiB.
  expect_bad_line(valid(1, 1) + std::string(70000, '0'), {"longer than 65536 bytes"});
}

TEST(Criteo, RejectsBadFilesAndArguments) {
  TempDir dir;
  expect_error([&] { CriteoReader(dir.file("absent.tsv"), rows_of(10)); },
               {"absent.tsv", "cannot read"});
  expect_error([&] { CriteoReader(dir.write("empty.tsv", ""), rows_of(10)); },
               {"empty.tsv", "empty"});
  const std::string path = dir.write("ok.tsv", valid(1, 1) + "\n");
  expect_error([&] { CriteoReader(path, std::vector<int64_t>(25, 10)); },
               {"ok.tsv", "table_rows has 25"});
  std::vector<int64_t> rows = rows_of(10);
  rows[4] = 0;
  expect_error([&] { CriteoReader(path, rows); }, {"table_rows[4] (C5)"});
  CriteoReader reader(path, rows_of(10));
  BatchBuilder builder;
  builder.begin(26, 12);
  expect_error([&] { reader.read(1, builder); }, {"ok.tsv", "26 tables and 12 dense"});
  builder.begin(26, 13);
  expect_error([&] { reader.read(-1, builder); }, {"count = -1"});
  // A file of one empty line is one malformed line, not an endless loop.
  CriteoReader blank(dir.write("blank.tsv", "\n"), rows_of(10));
  expect_error([&] { blank.read(1, builder); }, {"blank.tsv:1", "field count"});
}

}  // namespace
}  // namespace hyperion::recsys
