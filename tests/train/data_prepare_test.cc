#include "train/data_prepare.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "../test_files.h"
#include "base/error.h"
#include "cli/commands.h"
#include "io/atomic_file.h"
#include "io/token_shard.h"
#include "text/text_input.h"
#include "text/tokenizer.h"

namespace hyperion::train {
namespace {

using namespace hyperion::testing_util;

namespace fs = std::filesystem;

std::string make_doc(std::mt19937& rng) {
  static const char* kWords[] = {"alpha", "beta",  "gamma", "delta", "the",   "a",     "of",
                                 "model", "token", "data",  "train", "valid", "split", "and",
                                 "when",  "every", "small", "text",  "runs",  "fast",  "slow"};
  std::string s;
  const int n = 5 + static_cast<int>(rng() % 30);
  for (int i = 0; i < n; ++i) {
    s += kWords[rng() % std::size(kWords)];
    if (i % 7 == 6) s += std::to_string(rng() % 100);
    s += (i % 10 == 9 && i + 1 < n) ? "\n" : " ";
  }
  return s + "done.";
}

// A .txt (fortune format) with 60 documents and a .jsonl with 20.
std::vector<std::string> write_corpus(const TempDir& dir, std::vector<std::string>* docs) {
  std::mt19937 rng(42);
  std::string txt, jsonl;
  for (int i = 0; i < 60; ++i) {
    docs->push_back(make_doc(rng));
    txt += docs->back() + "\n%\n";
  }
  for (int i = 0; i < 20; ++i) {
    docs->push_back(make_doc(rng));
    jsonl += nlohmann::json{{"text", docs->back()}}.dump() + "\n";
  }
  std::vector<std::string> paths = {dir.file("a.txt"), dir.file("b.jsonl")};
  io::write_file_atomic(paths[0], txt);
  io::write_file_atomic(paths[1], jsonl);
  return paths;
}

std::vector<int32_t> read_all(const std::string& path) {
  io::TokenShard s = io::TokenShard::open(path);
  std::vector<int32_t> t(static_cast<size_t>(s.size()));
  s.read(0, s.size(), t.data());
  return t;
}

PrepareOptions options(const std::vector<std::string>& inputs, const std::string& out) {
  PrepareOptions o;
  o.inputs = inputs;
  o.output_dir = out;
  o.vocab_size = 400;
  o.val_fraction = 0.2;
  o.seed = 7;
  return o;
}

TEST(DataPrepare, EndToEnd) {
  TempDir dir;
  std::vector<std::string> docs;
  const auto inputs = write_corpus(dir, &docs);
  const PrepareResult r = prepare_dataset(options(inputs, dir.file("out")));

  EXPECT_EQ(r.documents, 80);
  EXPECT_EQ(r.train_docs + r.val_docs, 80);
  EXPECT_GT(r.val_docs, 0);
  EXPECT_GT(r.train_docs, r.val_docs);
  EXPECT_EQ(r.vocab_size, 400);
  EXPECT_GE(r.seconds, 0);
  for (const auto& f : {r.tokenizer_path, r.train_path, r.val_path, dir.file("out/meta.json")}) {
    EXPECT_TRUE(fs::exists(f)) << f;
  }
  EXPECT_EQ(r.train_path, dir.file("out/train.bin"));

  const text::Tokenizer tok = text::Tokenizer::load(r.tokenizer_path);
  const std::vector<bool> is_val = split_validation(80, 0.2, 7);
  // Each split holds its documents in input order, framed BOS ... EOS.
  for (bool val : {false, true}) {
    const std::vector<int32_t> tokens = read_all(val ? r.val_path : r.train_path);
    EXPECT_EQ(static_cast<int64_t>(tokens.size()), val ? r.val_tokens : r.train_tokens);
    size_t pos = 0;
    int64_t ndocs = 0;
    for (size_t d = 0; d < docs.size(); ++d) {
      if (is_val[d] != val) continue;
      const std::vector<int32_t> ids = tok.encode(docs[d]);
      ASSERT_LE(pos + ids.size() + 2, tokens.size());
      EXPECT_EQ(tokens[pos], tok.bos_id());
      EXPECT_TRUE(std::equal(ids.begin(), ids.end(), tokens.begin() + pos + 1)) << d;
      EXPECT_EQ(tokens[pos + ids.size() + 1], tok.eos_id());
      EXPECT_EQ(tok.decode(std::vector<int32_t>(tokens.begin() + pos + 1,
                                                tokens.begin() + pos + 1 + ids.size())),
                docs[d]);
      pos += ids.size() + 2;
      ++ndocs;
    }
    EXPECT_EQ(pos, tokens.size());  // token counts add up
    EXPECT_EQ(ndocs, val ? r.val_docs : r.train_docs);
    EXPECT_EQ(std::count(tokens.begin(), tokens.end(), tok.bos_id()), ndocs);
    EXPECT_EQ(std::count(tokens.begin(), tokens.end(), tok.eos_id()), ndocs);
  }

  const auto meta = nlohmann::json::parse(io::read_file(dir.file("out/meta.json")));
  EXPECT_EQ(meta["documents"], 80);
  EXPECT_EQ(meta["train_docs"], r.train_docs);
  EXPECT_EQ(meta["val_docs"], r.val_docs);
  EXPECT_EQ(meta["train_tokens"], r.train_tokens);
  EXPECT_EQ(meta["val_tokens"], r.val_tokens);
  EXPECT_EQ(meta["vocab_size"], 400);
  EXPECT_EQ(meta["bos_id"], 1);
  EXPECT_EQ(meta["eos_id"], 2);
  EXPECT_EQ(meta["seed"], 7);
  EXPECT_EQ(meta["train"], "train.bin");
  EXPECT_EQ(meta["tokenizer"], "tokenizer.model");
}

TEST(DataPrepare, DeterministicPerSeed) {
  TempDir dir;
  std::vector<std::string> docs;
  const auto inputs = write_corpus(dir, &docs);
  const PrepareResult a = prepare_dataset(options(inputs, dir.file("a")));
  const PrepareResult b = prepare_dataset(options(inputs, dir.file("b")));
  for (const char* f : {"tokenizer.model", "train.bin", "val.bin", "meta.json"}) {
    EXPECT_EQ(io::read_file(dir.file(std::string("a/") + f)),
              io::read_file(dir.file(std::string("b/") + f)))
        << f;
  }
  PrepareOptions other = options(inputs, dir.file("c"));
  other.seed = 8;
  const PrepareResult c = prepare_dataset(other);
  EXPECT_NE(split_validation(80, 0.2, 7), split_validation(80, 0.2, 8));
  EXPECT_NE(io::read_file(a.val_path), io::read_file(c.val_path));
  EXPECT_EQ(c.documents, 80);
  EXPECT_EQ(c.train_docs + c.val_docs, 80);
}

TEST(DataPrepare, ExistingTokenizer) {
  TempDir dir;
  std::vector<std::string> docs;
  const auto inputs = write_corpus(dir, &docs);
  const PrepareResult a = prepare_dataset(options(inputs, dir.file("a")));
  PrepareOptions o = options(inputs, dir.file("b"));
  o.tokenizer_model = a.tokenizer_path;
  o.vocab_size = 12345;  // ignored with an existing tokenizer
  o.val_fraction = 0.5;
  const PrepareResult b = prepare_dataset(o);
  EXPECT_EQ(b.vocab_size, 400);
  EXPECT_EQ(io::read_file(b.tokenizer_path), io::read_file(a.tokenizer_path));
  EXPECT_EQ(b.train_tokens + b.val_tokens, a.train_tokens + a.val_tokens);
}

TEST(DataPrepare, SplitValidation) {
  EXPECT_EQ(split_validation(0, 0.1, 1).size(), 0u);
  EXPECT_EQ(split_validation(1, 0.5, 1), std::vector<bool>{false});
  EXPECT_EQ(split_validation(5, 0.0, 1), std::vector<bool>(5, false));
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const auto two = split_validation(2, 1e-9, seed);  // never an empty held-out split
    EXPECT_EQ(std::count(two.begin(), two.end(), true), 1);
    const auto most = split_validation(3, 0.999999, seed);  // ... nor an empty train split
    EXPECT_GE(std::count(most.begin(), most.end(), false), 1);
  }
  const auto big = split_validation(20000, 0.1, 3);
  const auto val = std::count(big.begin(), big.end(), true);
  EXPECT_GT(val, 1800);
  EXPECT_LT(val, 2200);
  // Per-document: growing the corpus does not move earlier documents.
  const auto prefix = split_validation(1000, 0.1, 3);
  EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), big.begin()));
  EXPECT_THROW(split_validation(10, 1.0, 1), Error);
  EXPECT_THROW(split_validation(10, -0.1, 1), Error);
}

TEST(DataPrepare, Errors) {
  TempDir dir;
  std::vector<std::string> docs;
  const auto inputs = write_corpus(dir, &docs);
  expect_error([&] { prepare_dataset(options({}, dir.file("o"))); }, {"no input"});
  PrepareOptions bad = options(inputs, dir.file("o"));
  bad.val_fraction = 1.5;
  expect_error([&] { prepare_dataset(bad); }, {"val_fraction"});
  const std::string missing = dir.file("missing.txt");
  expect_error([&] { prepare_dataset(options({missing}, dir.file("o"))); }, {missing});
  io::write_file_atomic(dir.file("empty.txt"), "\n%\n\n");
  expect_error([&] { prepare_dataset(options({dir.file("empty.txt")}, dir.file("o"))); },
               {"no documents", "empty.txt"});
  PrepareOptions no_model = options(inputs, dir.file("o"));
  no_model.tokenizer_model = dir.file("none.model");
  expect_error([&] { prepare_dataset(no_model); }, {"none.model"});
  PrepareOptions huge = options(inputs, dir.file("o"));
  huge.vocab_size = 20000;
  expect_error([&] { prepare_dataset(huge); }, {"20000"});
}

// `hyperion data ...` (src/cli/data_cmd.cc), called in-process.
TEST(DataCommand, PrepareJson) {
  TempDir dir;
  std::vector<std::string> docs;
  const auto inputs = write_corpus(dir, &docs);
  ::testing::internal::CaptureStdout();
  const int rc = cli::cmd_data_prepare({"--input", inputs[0], "--input", inputs[1], "--output",
                                dir.file("out"), "--vocab-size", "400", "--val-fraction", "0.25",
                                "--seed", "3", "--json"});
  const std::string out = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(rc, 0);
  const auto j = nlohmann::json::parse(out);
  for (const char* key : {"documents", "train_docs", "val_docs", "train_tokens", "val_tokens",
                          "vocab_size", "tokenizer", "train", "val", "seconds"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["documents"], 80);
  EXPECT_EQ(j["vocab_size"], 400);
  EXPECT_EQ(j["train"], dir.file("out/train.bin"));
  const auto meta = nlohmann::json::parse(io::read_file(dir.file("out/meta.json")));
  EXPECT_EQ(meta["seed"], 3);
  EXPECT_EQ(meta["val_fraction"], 0.25);

  ::testing::internal::CaptureStdout();
  EXPECT_EQ(cli::cmd_data_prepare({"--input", inputs[0], "--output", dir.file("out2"),
                           "--tokenizer", dir.file("out/tokenizer.model")}),
            0);
  const std::string human = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(human.find("documents"), std::string::npos) << human;
  EXPECT_NE(human.find("train.bin"), std::string::npos) << human;
}

TEST(DataCommand, UsageAndErrors) {
  // (`hyperion data` without a name, and the exit statuses: tests/cli/cli_conventions_test.cc)
  EXPECT_THROW(cli::cmd_data_prepare({"--input", "a.txt", "--bogus", "1"}), UsageError);
  expect_error([] { cli::cmd_data_prepare({"--input", "a.txt", "--bogus", "1"}); }, {"--bogus"});
  expect_error([] { cli::cmd_data_prepare({"--input"}); }, {"--input", "needs a value"});
  expect_error(
      [] {
        cli::cmd_data_prepare({"--input", "a.txt", "--vocab-size", "lots"});
      },
      {"--vocab-size", "lots"});
  expect_error(
      [] {
        cli::cmd_data_prepare({"--input", "a.txt", "--vocab-size", "1.5"});
      },
      {"--vocab-size"});
  expect_error(
      [] {
        cli::cmd_data_prepare({"--input", "a.txt", "--val-fraction", "1"});
      },
      {"--val-fraction"});
  expect_error([] { cli::cmd_data_prepare({"--input", "a.txt"}); }, {"--output"});
  expect_error([] { cli::cmd_data_prepare({"--output", "d"}); }, {"--input"});
}

}  // namespace
}  // namespace hyperion::train
