#include "text/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "../test_files.h"
#include "base/error.h"
#include "io/atomic_file.h"

namespace hyperion::text {
namespace {

using namespace hyperion::testing_util;

namespace fs = std::filesystem;

// A small deterministic English-like corpus: documents of a few lines.
std::vector<std::string> make_corpus(int docs, uint32_t seed) {
  static const char* kWords[] = {
      "the",   "quick",   "brown",     "fox",  "jumps",   "over", "lazy",    "dog",     "a",
      "model", "learns",  "from",      "data", "tokens",  "are",  "small",   "pieces",  "of",
      "text",  "and",     "every",     "word", "matters", "when", "we",      "train",   "on",
      "plain", "english", "sentences", "with", "numbers", "like", "commas,", "periods."};
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  for (int d = 0; d < docs; ++d) {
    std::string s;
    const int n = 8 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      s += kWords[rng() % std::size(kWords)];
      if (i % 11 == 10) s += std::to_string(rng() % 2000);
      s += (i % 9 == 8 && i + 1 < n) ? "\n" : " ";
    }
    s += "End.";
    out.push_back(std::move(s));
  }
  return out;
}

TokenizerTrainOptions small_opts(int vocab) {
  TokenizerTrainOptions o;
  o.vocab_size = vocab;
  return o;
}

TEST(Tokenizer, TrainEncodeDecodeRoundTrip) {
  TempDir dir;
  const auto docs = make_corpus(200, 1);
  const std::string path = dir.file("tok.model");
  Tokenizer tok = Tokenizer::train(docs, path, small_opts(400));
  EXPECT_EQ(tok.vocab_size(), 400);
  EXPECT_EQ(tok.unk_id(), 0);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.pad_id(), -1);
  EXPECT_EQ(tok.id_to_piece(0), "<unk>");
  EXPECT_EQ(tok.id_to_piece(1), "<s>");
  EXPECT_EQ(tok.id_to_piece(2), "</s>");
  for (const auto& d : docs) {
    const auto ids = tok.encode(d);
    ASSERT_FALSE(ids.empty());
    for (int32_t id : ids) {
      ASSERT_TRUE(id >= 3 && id < 400) << id;  // no BOS/EOS/UNK added or produced
    }
    EXPECT_EQ(tok.decode(ids), d);
  }
  // Common words became pieces: the corpus compresses well below one token per byte.
  EXPECT_LT(tok.encode(docs[0]).size(), docs[0].size() / 2);

  // The written model loads to the same tokenizer; serialized() is the file.
  ASSERT_TRUE(fs::exists(path));
  Tokenizer loaded = Tokenizer::load(path);
  EXPECT_EQ(loaded.files().front().second, io::read_file(path));
  EXPECT_EQ(loaded.files().front().second, tok.files().front().second);
  EXPECT_EQ(loaded.origin(), path);
  for (const auto& d : docs) EXPECT_EQ(loaded.encode(d), tok.encode(d));
  Tokenizer copy = Tokenizer::from_serialized(tok.files().front().second, "memory");
  EXPECT_EQ(copy.encode(docs[3]), tok.encode(docs[3]));

  // Movable.
  Tokenizer moved = std::move(copy);
  EXPECT_EQ(moved.vocab_size(), 400);
}

TEST(Tokenizer, ByteFallbackAndWhitespace) {
  TempDir dir;
  Tokenizer tok = Tokenizer::train(make_corpus(150, 2), dir.file("t.model"), small_opts(320));
  // Characters never seen in training decode back exactly through byte tokens.
  for (const std::string s :
       {"emoji \xF0\x9F\x98\x80 here", "\xC3\xBC\xC3\xB1 \xE4\xB8\xAD\xE6\x96\x87", "tab\there",
        "two  spaces", "lines\n\nwith\nbreaks\n", "  leading", "x"}) {
    const auto ids = tok.encode(s);
    EXPECT_EQ(tok.decode(ids), s);
    for (int32_t id : ids) EXPECT_NE(id, tok.unk_id()) << s;
  }
  const auto ids = tok.encode("\xF0\x9F\x98\x80");
  bool saw_byte = false;
  for (int32_t id : ids) saw_byte |= tok.id_to_piece(id) == "<0xF0>";
  EXPECT_TRUE(saw_byte);
}

TEST(Tokenizer, SplitsDigits) {
  TempDir dir;
  Tokenizer tok = Tokenizer::train(make_corpus(200, 3), dir.file("t.model"), small_opts(400));
  int digits = 0;
  for (int32_t id : tok.encode("year 19841984")) {
    std::string p = tok.id_to_piece(id);
    if (!p.empty() && std::isdigit(static_cast<unsigned char>(p.back()))) {
      // One digit per piece, possibly after the word-boundary marker U+2581.
      EXPECT_TRUE(p.size() == 1 || (p.size() == 4 && p.rfind("\xE2\x96\x81", 0) == 0)) << p;
      ++digits;
    }
  }
  EXPECT_EQ(digits, 8);
}

TEST(Tokenizer, TrainingIsDeterministic) {
  TempDir dir;
  const auto docs = make_corpus(120, 4);
  Tokenizer a = Tokenizer::train(docs, dir.file("a.model"), small_opts(350));
  Tokenizer b = Tokenizer::train(docs, dir.file("b.model"), small_opts(350));
  EXPECT_EQ(a.files().front().second, b.files().front().second);
  EXPECT_EQ(io::read_file(dir.file("a.model")), io::read_file(dir.file("b.model")));
  // The sentence cap subsamples deterministically too.
  TokenizerTrainOptions capped = small_opts(300);
  capped.max_sentences = 200;
  Tokenizer c = Tokenizer::train(docs, dir.file("c.model"), capped);
  Tokenizer d = Tokenizer::train(docs, dir.file("d.model"), capped);
  EXPECT_EQ(c.files().front().second, d.files().front().second);
}

TEST(Tokenizer, UnigramModelAlsoWorks) {
  TempDir dir;
  TokenizerTrainOptions o = small_opts(300);
  o.model_type = "unigram";
  const auto docs = make_corpus(150, 5);
  Tokenizer tok = Tokenizer::train(docs, dir.file("u.model"), o);
  EXPECT_EQ(tok.vocab_size(), 300);
  EXPECT_EQ(tok.decode(tok.encode(docs[0])), docs[0]);
}

TEST(Tokenizer, LoadErrorsNameTheFile) {
  TempDir dir;
  const std::string missing = dir.file("missing.model");
  expect_error([&] { Tokenizer::load(missing); }, {missing});

  const std::string garbage = dir.file("garbage.model");
  io::write_file_atomic(garbage, "this is not a sentencepiece model at all \x01\x02\x03");
  expect_error([&] { Tokenizer::load(garbage); }, {garbage, "not a valid SentencePiece model"});

  const std::string empty = dir.file("empty.model");
  io::write_file_atomic(empty, "");
  expect_error([&] { Tokenizer::load(empty); }, {empty});

  Tokenizer tok = Tokenizer::train(make_corpus(100, 6), dir.file("ok.model"), small_opts(300));
  const std::string truncated = dir.file("truncated.model");
  io::write_file_atomic(
      truncated, tok.files().front().second.substr(0, tok.files().front().second.size() / 2));
  expect_error([&] { Tokenizer::load(truncated); }, {truncated});

  expect_error([&] { Tokenizer::from_serialized("junk", "ckpt.bin:tokenizer"); },
               {"ckpt.bin:tokenizer"});
  expect_error([&] { Tokenizer::load(dir.path.string()); }, {dir.path.string()});
}

TEST(Tokenizer, TrainingErrors) {
  TempDir dir;
  const auto docs = make_corpus(40, 7);
  // More pieces than this tiny corpus can support: the message names the size.
  expect_error([&] { Tokenizer::train(docs, dir.file("big.model"), small_opts(5000)); }, {"5000"});
  EXPECT_FALSE(fs::exists(dir.file("big.model")));
  expect_error([&] { Tokenizer::train(docs, dir.file("tiny.model"), small_opts(100)); },
               {"100", "byte fallback"});
  expect_error(
      [&] {
        Tokenizer::train({"", "  \n "}, dir.file("e.model"), small_opts(300));
      },
      {"no non-empty text"});
  TokenizerTrainOptions bad = small_opts(300);
  bad.model_type = "wordpiece";
  expect_error([&] { Tokenizer::train(docs, dir.file("w.model"), bad); }, {"wordpiece"});
}

TEST(Tokenizer, DecodeRejectsUnknownIds) {
  TempDir dir;
  Tokenizer tok = Tokenizer::train(make_corpus(100, 8), dir.file("t.model"), small_opts(300));
  expect_error([&] { tok.decode({5, 300}); }, {"300", "position 1"});
  expect_error([&] { tok.decode({-1}); }, {"-1"});
  expect_error([&] { tok.id_to_piece(1000); }, {"1000"});
}

}  // namespace
}  // namespace hyperion::text
