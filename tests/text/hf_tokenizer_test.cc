// The tokenizer.json reader and encoder on small tokenizers written here. The real
// Llama 3 / Qwen3 / Gemma 3 / Llama 2 tokenizers are checked id for id against an
// independent implementation by tests/js/tokenizer_reference.mjs (CTest
// tokenizer_reference).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../test_files.h"
#include "base/error.h"
#include "text/bpe_model.h"
#include "text/tokenizer.h"

namespace hyperion::text {
namespace {

using namespace hyperion::testing_util;
using nlohmann::json;

std::string error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The plain reference: repeatedly merge the leftmost pair of lowest rank (O(n^2)).
std::vector<std::string> reference_bpe(
    const std::vector<std::string>& symbols,
    const std::vector<std::pair<std::string, std::string>>& merges) {
  std::vector<std::string> s = symbols;
  for (;;) {
    size_t best = s.size();
    size_t best_rank = merges.size();
    for (size_t i = 0; i + 1 < s.size(); ++i)
      for (size_t r = 0; r < best_rank; ++r)
        if (merges[r].first == s[i] && merges[r].second == s[i + 1]) {
          best = i, best_rank = r;
          break;
        }
    if (best == s.size()) return s;
    s[best] += s[best + 1];
    s.erase(s.begin() + static_cast<ptrdiff_t>(best) + 1);
  }
}

// A character-level BPE: `tokens` (ids in order; `merges` among them), then 30 tries at
// merging two random tokens, drawn from the first `pick` (0: all so far); a result
// already a token, or longer than `max_len` (0: any), is skipped.
struct RandomBpe {
  std::vector<std::string> tokens;
  std::vector<std::pair<std::string, std::string>> merges;
  std::unique_ptr<BpeModel> model;
};
RandomBpe random_bpe(std::mt19937& rng, std::vector<std::string> tokens,
                     std::vector<std::pair<std::string, std::string>> merges, size_t pick,
                     size_t max_len, size_t split_symbols = BpeModelSpec{}.split_symbols) {
  TokenIndex vocab;
  for (size_t i = 0; i < tokens.size(); ++i) vocab.insert(tokens[i], static_cast<int32_t>(i));
  for (int m = 0; m < 30; ++m) {
    const size_t from = pick ? pick : tokens.size();
    const std::string l = tokens[rng() % from], r = tokens[rng() % from];
    if ((max_len && l.size() + r.size() > max_len) || vocab.contains(l + r)) continue;
    vocab.insert(l + r, static_cast<int32_t>(tokens.size()));
    tokens.push_back(l + r);
    merges.emplace_back(l, r);
  }
  BpeModelSpec spec;
  spec.split_symbols = split_symbols;
  auto model = std::make_unique<BpeModel>(spec, std::move(vocab));
  for (size_t r = 0; r < merges.size(); ++r)
    EXPECT_EQ(model->add_merge(merges[r].first, merges[r].second, static_cast<int32_t>(r)), "");
  return {std::move(tokens), std::move(merges), std::move(model)};
}

// A character-level BPE over {a, b, c} with random merges, against the reference.
TEST(BpeModel, MergesMatchThePlainReferenceOnRandomWords) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    const RandomBpe bpe = random_bpe(rng, {"a", "b", "c"}, {}, 0, 6);
    const BpeModel& model = *bpe.model;
    const auto& tokens = bpe.tokens;
    const auto& merges = bpe.merges;
    for (int w = 0; w < 50; ++w) {
      std::string word;
      std::vector<std::string> chars;
      for (size_t n = 1 + rng() % 40; n > 0; --n) {
        chars.emplace_back(1, static_cast<char>('a' + rng() % 3));
        word += chars.back();
      }
      std::vector<int32_t> ids;
      model.encode_word(word, ids);
      std::vector<std::string> got;
      for (int32_t id : ids) got.push_back(tokens[id]);
      EXPECT_EQ(got, reference_bpe(chars, merges)) << "word " << word;
    }
  }
}

TEST(BpeModel, ADuplicateMergeTakesItsLastRank) {
  // As the `tokenizers` library's HashMap of merges: the later duplicate's rank wins, so
  // here "b c" (rank 1) now comes before "a b" (rank 2) in "abc".
  BpeModel model(BpeModelSpec{}, {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}});
  ASSERT_EQ(model.add_merge("a", "b", 0), "");
  ASSERT_EQ(model.add_merge("b", "c", 1), "");
  ASSERT_EQ(model.add_merge("a", "b", 2), "");
  std::vector<int32_t> ids;
  model.encode_word("abc", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 4}));
}

TEST(BpeModel, AMillionCopiesOfOneCharacterMergeInOneWord) {
  // "a" -> "aa" -> "aaaa": a naive merge loop is quadratic here.
  BpeModel model(BpeModelSpec{}, {{"a", 0}, {"aa", 1}, {"aaaa", 2}});
  ASSERT_EQ(model.add_merge("a", "a", 0), "");
  ASSERT_EQ(model.add_merge("aa", "aa", 1), "");
  std::vector<int32_t> ids;
  model.encode_word(std::string(1 << 20, 'a'), ids);
  ASSERT_EQ(ids.size(), size_t{1} << 18);
  for (int32_t id : ids) ASSERT_EQ(id, 2);
}

TEST(BpeModel, AHugeWordIsCutOnlyWhereNoMergeJoins) {
  // Random merges over {a, b, c} plus "c d": a word of 200,000 characters (past
  // split_symbols, so merged a stretch at a time) must equal the plain reference run on
  // its pieces split after each 'd' (no merge joins anything after a d).
  std::mt19937 rng(11);
  for (int trial = 0; trial < 3; ++trial) {
    const RandomBpe bpe =
        random_bpe(rng, {"a", "b", "c", "d", "cd"}, {{"c", "d"}}, 3, 0, size_t{1} << 16);
    const BpeModel& model = *bpe.model;
    const auto& tokens = bpe.tokens;
    const auto& merges = bpe.merges;
    std::string word;
    std::vector<std::string> expected, piece;
    while (word.size() < 200000) {
      const char c = rng() % 40 == 0 ? 'd' : static_cast<char>('a' + rng() % 3);
      word += c;
      piece.emplace_back(1, c);
      if (c == 'd') {
        for (const std::string& t : reference_bpe(piece, merges)) expected.push_back(t);
        piece.clear();
      }
    }
    for (const std::string& t : reference_bpe(piece, merges)) expected.push_back(t);
    ASSERT_GT(word.size(), model.spec().split_symbols * 2);
    std::vector<int32_t> ids;
    model.encode_word(word, ids);
    std::vector<std::string> got;
    for (int32_t id : ids) got.push_back(tokens[static_cast<size_t>(id)]);
    ASSERT_EQ(got.size(), expected.size());
    EXPECT_EQ(got, expected);
  }
}

TEST(BpeModel, ByteLevelAlphabetRoundTripsEveryByte) {
  for (int b = 0; b < 256; ++b) {
    std::string raw;
    ASSERT_TRUE(byte_level_decode(byte_level_char(static_cast<uint8_t>(b)), &raw));
    ASSERT_EQ(raw, std::string(1, static_cast<char>(b)));
  }
  EXPECT_EQ(byte_level_char(' '), "\xC4\xA0");   // Ġ
  EXPECT_EQ(byte_level_char('\n'), "\xC4\x8A");  // Ċ
  std::string raw;
  EXPECT_FALSE(byte_level_decode("\xE4\xB8\xAD", &raw));  // 中 stands for no byte
}

// A byte-level tokenizer.json (GPT-2 style) over a few words.
json byte_level_tokenizer() {
  json vocab = json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) vocab[byte_level_char(static_cast<uint8_t>(b))] = id++;
  for (const char* t : {"he", "ll", "llo", "hello", "\xC4\xA0w", "\xC4\xA0wor", "\xC4\xA0world"})
    vocab[t] = id++;
  json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = json::array(
      {{{"id", id}, {"content", "<|end|>"}, {"special", true}, {"normalized", false}},
       {{"id", id + 1}, {"content", "<|end|>x"}, {"special", false}, {"normalized", false}}});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"},
                {"vocab", vocab},
                {"merges", json::array({"h e", "l l", "ll o", "he llo", "\xC4\xA0 w",
                                        "\xC4\xA0w or", "\xC4\xA0wor ld"})}};
  // "or" and "ld" are needed for the merges above.
  j["model"]["vocab"]["or"] = id + 2;
  j["model"]["vocab"]["ld"] = id + 3;
  j["model"]["merges"].insert(j["model"]["merges"].begin(), {"o r", "l d"});
  return j;
}

Tokenizer load_json(const TempDir& dir, const json& tok, const json& config = nullptr) {
  dir.write("tokenizer.json", tok.dump());
  if (!config.is_null()) dir.write("tokenizer_config.json", config.dump());
  return Tokenizer::load(dir.path.string());
}

TEST(HfTokenizer, ByteLevelEncodesDecodesAndFindsAddedTokensFirst) {
  TempDir dir;
  const Tokenizer tok = load_json(dir, byte_level_tokenizer());
  EXPECT_STREQ(tok.format(), "tokenizer.json");
  const std::vector<int32_t> ids = tok.encode("hello world<|end|>x<|end|>");
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(tok.id_to_piece(id));
  // The longest added token wins ("<|end|>x" over "<|end|>"); added tokens are never split.
  EXPECT_EQ(pieces, (std::vector<std::string>{"hello", "\xC4\xA0world", "<|end|>x", "<|end|>"}));
  EXPECT_EQ(tok.decode(ids, false), "hello world<|end|>x<|end|>");
  // Special tokens are left out by default; the non-special added token stays.
  EXPECT_EQ(tok.decode(ids), "hello world<|end|>x");
  // Bytes outside the merges still encode (one token per byte) and round-trip.
  const std::string odd = "\xE2\x82\xAC \t\n\xF0\x9F\x98\x80";
  EXPECT_EQ(tok.decode(tok.encode(odd)), odd);
  // A byte-level token sequence that cuts a character decodes to U+FFFD, never invalid UTF-8.
  const std::vector<int32_t> euro = tok.encode("\xE2\x82\xAC");
  ASSERT_EQ(euro.size(), 3u);
  EXPECT_EQ(tok.decode({euro[0], euro[1]}), "\xEF\xBF\xBD");
  // A model's padded rows past the tokenizer decode to nothing (Hugging Face skips them);
  // a negative id is an error.
  EXPECT_EQ(tok.decode({ids[0], tok.vocab_size() + 5, ids[1]}), "hello world");
  expect_error([&] { tok.decode({-1}); }, {"negative"});
}

TEST(HfTokenizer, ConfigNamesSpecialTokensTemplateAndEndTokens) {
  TempDir dir;
  const json config = {{"bos_token", nullptr},
                       {"eos_token", {{"content", "<|end|>"}}},
                       {"add_bos_token", false},
                       {"chat_template", json::array({{{"name", "tool_use"}, {"template", "T"}},
                                                      {{"name", "default"}, {"template", "D"}}})}};
  const Tokenizer tok = load_json(dir, byte_level_tokenizer(), config);
  EXPECT_EQ(tok.bos_id(), -1);
  EXPECT_EQ(tok.eos_id(), tok.token_id("<|end|>"));
  EXPECT_TRUE(tok.is_end(tok.eos_id()));
  EXPECT_EQ(tok.chat_template(), "D");
  EXPECT_EQ(tok.encode_with_special_tokens("hello"), tok.encode("hello"));
  ASSERT_EQ(tok.files().size(), 2u);
  EXPECT_EQ(tok.files()[0].first, "tokenizer.json");
  EXPECT_EQ(tok.files()[1].first, "tokenizer_config.json");
  EXPECT_TRUE(tok.fits_model_vocab(tok.vocab_size() + 100));
  EXPECT_FALSE(tok.fits_model_vocab(tok.vocab_size() - 1));
}

// generation_config.json's eos_token_id list names end-of-turn tokens, and the file travels
// with the tokenizer (into prepared datasets and checkpoints).
TEST(HfTokenizer, GenerationConfigIsReadAndCarried) {
  TempDir dir;
  const Tokenizer plain = load_json(dir, byte_level_tokenizer());
  const int32_t end = plain.token_id("<|end|>"), hello = plain.token_id("hello");
  dir.write("generation_config.json", json{{"eos_token_id", {hello, end}}}.dump());
  const Tokenizer tok = Tokenizer::load(dir.path.string());
  EXPECT_TRUE(tok.is_end(hello));
  EXPECT_TRUE(tok.is_end(end));
  ASSERT_EQ(tok.files().size(), 2u);
  EXPECT_EQ(tok.files()[1].first, "generation_config.json");
}

// A malformed companion file is an error naming it and the value, never ignored:
// eos_token_id as a string, float or bool, an id of -1 or 10^15, a file that is not a JSON
// object, tokenizer_config.json as a directory.
TEST(HfTokenizer, MalformedCompanionFilesAreNamed) {
  TempDir dir;
  load_json(dir, byte_level_tokenizer());
  const std::string path = dir.path.string() + "/generation_config.json";
  for (const auto& [value, expect] : std::vector<std::pair<json, std::string>>{
           {json("7"), "eos_token_id must be an integer token id, got \"7\""},
           {json(7.5), "eos_token_id must be an integer token id, got 7.5"},
           {json(true), "eos_token_id must be an integer token id, got true"},
           {json::array({1, -1}), "eos_token_id[1] is -1, not a token id"},
           {json::array({int64_t{1000000000000000}}),
            "eos_token_id[0] is 1000000000000000, not a token id"}}) {
    dir.write("generation_config.json", json{{"eos_token_id", value}}.dump());
    const std::string msg = error_message([&] { Tokenizer::load(dir.path.string()); });
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(expect), std::string::npos) << msg;
  }
  dir.write("generation_config.json", "[1, 2]");
  EXPECT_NE(error_message([&] { Tokenizer::load(dir.path.string()); }).find("not a JSON object"),
            std::string::npos);
  std::filesystem::remove(path);
  std::filesystem::create_directory(dir.path / "tokenizer_config.json");
  const std::string msg = error_message([&] { Tokenizer::load(dir.path.string()); });
  EXPECT_NE(msg.find("tokenizer_config.json': it is a directory"), std::string::npos) << msg;
}

// Expansion bombs: a normalizer or decoder chain that could multiply its input (forty
// Replace "a" -> "aa", a regex Replace inserting kilobytes between characters) is refused
// at load, naming the stage; a chain within the bound still cannot make one request's
// text more than 64 times its size (an error naming the sizes, not gigabytes).
TEST(HfTokenizer, ExpansionBombsAreRefused) {
  TempDir dir;
  const json a_to_aa = {{"type", "Replace"}, {"pattern", {{"String", "a"}}}, {"content", "aa"}};
  json bomb = byte_level_tokenizer();
  bomb["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array()}};
  for (int i = 0; i < 40; ++i) bomb["normalizer"]["normalizers"].push_back(a_to_aa);
  std::string msg = error_message([&] { load_json(dir, bomb); });
  EXPECT_NE(msg.find("normalizer: its steps could grow a text"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expansion bomb"), std::string::npos) << msg;

  json dbomb = byte_level_tokenizer();
  dbomb["decoder"] = {{"type", "Sequence"}, {"decoders", json::array()}};
  for (int i = 0; i < 40; ++i) dbomb["decoder"]["decoders"].push_back(a_to_aa);
  msg = error_message([&] { load_json(dir, dbomb); });
  EXPECT_NE(msg.find("decoder: its steps could grow a text"), std::string::npos) << msg;

  json prepends = byte_level_tokenizer();
  prepends["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array()}};
  for (int i = 0; i < 1000; ++i)
    prepends["normalizer"]["normalizers"].push_back(
        {{"type", "Prepend"}, {"prepend", std::string(1000, 'x')}});
  msg = error_message([&] { load_json(dir, prepends); });
  EXPECT_NE(msg.find("normalizer: its steps could grow a text"), std::string::npos) << msg;

  // Within the bound (a regex that matches between characters, inserting 100 bytes:
  // 101-fold at most), an ordinary text encodes and a hostile one is stopped by name.
  json wide = byte_level_tokenizer();
  wide["normalizer"] = {
      {"type", "Replace"}, {"pattern", {{"Regex", "(?=b)"}}}, {"content", std::string(100, 'c')}};
  const Tokenizer tok = load_json(dir, wide);
  EXPECT_FALSE(tok.encode("hello").empty());
  msg = error_message([&] { tok.encode(std::string(20000, 'b')); });
  EXPECT_NE(msg.find("more than the"), std::string::npos) << msg;
}

// Two tokens with one id, or one added token with two ids, would make decoding no longer
// invert encoding: refused at load naming the ids. A special listed both in the vocabulary
// and in added_tokens with the same id (Llama 2, Gemma) is fine.
TEST(HfTokenizer, DuplicateIdsAreRefused) {
  TempDir dir;
  json twice = byte_level_tokenizer();
  twice["model"]["vocab"]["dup"] = twice["model"]["vocab"]["he"];
  std::string msg = error_message([&] { load_json(dir, twice); });
  EXPECT_NE(msg.find("is also the id of"), std::string::npos) << msg;
  json added = byte_level_tokenizer();
  added["added_tokens"].push_back(
      {{"id", added["added_tokens"][0]["id"]}, {"content", "<|other|>"}, {"special", true}});
  msg = error_message([&] { load_json(dir, added); });
  EXPECT_NE(msg.find("is also added_tokens' '<|end|>'"), std::string::npos) << msg;
  json two_ids = byte_level_tokenizer();
  two_ids["added_tokens"].push_back(
      {{"id", 300}, {"content", "<|end|>"}, {"special", true}, {"normalized", false}});
  msg = error_message([&] { load_json(dir, two_ids); });
  EXPECT_NE(msg.find("'<|end|>' is added twice"), std::string::npos) << msg;
  json repeat = byte_level_tokenizer();
  repeat["added_tokens"].push_back(repeat["added_tokens"][0]);
  EXPECT_NO_THROW(load_json(dir, repeat));
}

// A SentencePiece-style BPE (Llama 2, Gemma): ▁ for spaces, byte fallback, BOS added.
json metaspace_tokenizer() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  int id = 3;
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = id++;
  for (const char* t : {"\xE2\x96\x81", "h", "i", "\xE2\x96\x81h", "\xE2\x96\x81hi", "\xC3\xA9"})
    vocab[t] = id++;
  json j;
  j["added_tokens"] =
      json::array({{{"id", 0}, {"content", "<unk>"}, {"special", true}, {"normalized", false}},
                   {{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
                   {{"id", 2}, {"content", "</s>"}, {"special", true}, {"normalized", false}}});
  j["normalizer"] = {
      {"type", "Sequence"},
      {"normalizers",
       json::array(
           {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
            {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}})}};
  j["pre_tokenizer"] = nullptr;
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"pair", json::array()},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}};
  j["decoder"] = {
      {"type", "Sequence"},
      {"decoders",
       json::array(
           {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
            {{"type", "ByteFallback"}},
            {{"type", "Fuse"}},
            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  j["model"] = {
      {"type", "BPE"},         {"vocab", vocab},
      {"unk_token", "<unk>"},  {"fuse_unk", true},
      {"byte_fallback", true}, {"merges", json::array({"\xE2\x96\x81 h", "\xE2\x96\x81h i"})}};
  return j;
}

TEST(HfTokenizer, MetaspaceWithByteFallbackAndTemplateProcessing) {
  TempDir dir;
  const Tokenizer tok = load_json(dir, metaspace_tokenizer());
  const std::vector<int32_t> ids = tok.encode("hi h\xE2\x82\xAC\xC3\xA9");
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(tok.id_to_piece(id));
  // € is not in the vocabulary: its three bytes; é is.
  EXPECT_EQ(pieces, (std::vector<std::string>{"\xE2\x96\x81hi", "\xE2\x96\x81h", "<0xE2>", "<0x82>",
                                              "<0xAC>", "\xC3\xA9"}));
  EXPECT_EQ(tok.decode(ids), "hi h\xE2\x82\xAC\xC3\xA9");
  // A byte run that is not UTF-8: one U+FFFD per byte, as Hugging Face's ByteFallback.
  EXPECT_EQ(tok.decode({ids[2], ids[3]}), "\xEF\xBF\xBD\xEF\xBF\xBD");
  const std::vector<int32_t> with = tok.encode_with_special_tokens("hi");
  ASSERT_EQ(with.size(), 2u);
  EXPECT_EQ(with[0], 1);
  EXPECT_TRUE(tok.encode("").empty());
}

// The `tokenizers` library's Metaspace decoder drops every replacement character of the
// first token (a prefix was prepended at encode) and turns the others into spaces.
TEST(HfTokenizer, MetaspaceDecoderDropsTheFirstTokensMarks) {
  TempDir dir;
  json j = metaspace_tokenizer();
  j["model"]["vocab"]["\xE2\x96\x81\xE2\x96\x81"] = 400;
  j["decoder"] = {
      {"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}};
  const Tokenizer tok = load_json(dir, j);
  const int32_t two = 400, hi = tok.token_id("\xE2\x96\x81hi");
  EXPECT_EQ(tok.decode({two, hi, two}), " hi  ");
  EXPECT_EQ(tok.decode({hi, two, hi}), "hi   hi");
}

TEST(HfTokenizer, UnknownCharactersWithoutByteFallbackFuseIntoOneUnk) {
  TempDir dir;
  json j = metaspace_tokenizer();
  j["model"]["byte_fallback"] = false;
  const Tokenizer tok = load_json(dir, j);
  EXPECT_EQ(
      tok.encode("hi \xE2\x82\xAC\xE2\x82\xAC"),
      (std::vector<int32_t>{tok.token_id("\xE2\x96\x81hi"), tok.token_id("\xE2\x96\x81"), 0}));
}

TEST(HfTokenizer, MalformedOrUnsupportedFilesNameTheFileAndKey) {
  TempDir dir;
  const std::string path = dir.file("tokenizer.json");
  auto load_text = [&](const std::string& text) {
    dir.write("tokenizer.json", text);
    return Tokenizer::load(path);
  };
  const std::string good = byte_level_tokenizer().dump();
  expect_error([&] { load_text(good.substr(0, good.size() / 2)); }, {path, "not valid JSON"});
  expect_error([&] { load_text("[1, 2]"); }, {path, "expected an object"});
  json j = byte_level_tokenizer();
  j["model"]["type"] = "Unigram";
  expect_error([&] { load_text(j.dump()); }, {path, "model.type", "'Unigram' is not supported"});
  j = byte_level_tokenizer();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", json::array({{{"type", "BertPreTokenizer"}}})}};
  expect_error([&] { load_text(j.dump()); },
               {path, "pre_tokenizer.pretokenizers[0].type", "BertPreTokenizer"});
  j = byte_level_tokenizer();
  j["model"]["merges"].push_back("zz q");
  expect_error([&] { load_text(j.dump()); }, {path, "model.merges[9]", "'zz'"});
  j = byte_level_tokenizer();
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  expect_error([&] { load_text(j.dump()); }, {path, "pre_tokenizer.pattern", "invalid regex"});
  j = byte_level_tokenizer();
  j["model"]["vocab"]["huge"] = 2000000000;
  expect_error([&] { load_text(j.dump()); }, {path, "model.vocab.huge"});
  for (const json& not_an_id : {json(1.5), json("7"), json::object(), json::array({1}), json(-3)}) {
    j = byte_level_tokenizer();
    j["model"]["vocab"]["odd"] = not_an_id;
    expect_error([&] { load_text(j.dump()); }, {path, "model.vocab.odd", "expected an id"});
  }
  for (const json& not_a_merge : {json(3), json::array({"h"}), json::array({"h", "e", "l"}),
                                  json::array({"h", 1}), json({{"h", "e"}}), json("h  e")}) {
    j = byte_level_tokenizer();
    j["model"]["merges"].push_back(not_a_merge);
    expect_error([&] { load_text(j.dump()); }, {path, "model.merges[9]"});
  }
  // A token written twice (the document of nlohmann-json would keep one of them).
  std::string twice = byte_level_tokenizer().dump();
  twice.replace(twice.find("\"vocab\":{") + 9, 0, "\"ll\":300,");
  expect_error([&] { load_text(twice); }, {path, "model.vocab.ll", "listed twice"});
  j = byte_level_tokenizer();
  j["model"]["vocab"] = json::array();
  expect_error([&] { load_text(j.dump()); }, {path, "model.vocab", "expected an object"});
  j["model"].erase("vocab");
  expect_error([&] { load_text(j.dump()); }, {path, "model.vocab", "missing"});
  j = byte_level_tokenizer();
  j["model"]["merges"] = "h e";
  expect_error([&] { load_text(j.dump()); }, {path, "model.merges", "expected a list"});
  j["model"].erase("merges");
  expect_error([&] { load_text(j.dump()); }, {path, "model.merges", "missing"});
  j = byte_level_tokenizer();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers", json::array({{{"type", "ByteLevel"}}, {{"type", "Digits"}}})}};
  expect_error([&] { load_text(j.dump()); },
               {path, "pre_tokenizer.pretokenizers[1].type", "after a ByteLevel"});
  j = metaspace_tokenizer();
  j["decoder"] = {{"type", "Strip"}, {"content", ""}, {"start", 1000000}, {"stop", 0}};
  expect_error([&] { load_text(j.dump()); }, {path, "decoder.content", "one character"});
  j = byte_level_tokenizer();
  j["added_tokens"][0]["single_word"] = true;
  expect_error([&] { load_text(j.dump()); }, {path, "added_tokens[0].single_word"});
  // A config that names a token the vocabulary lacks.
  dir.write("tokenizer.json", good);
  dir.write("tokenizer_config.json", R"({"eos_token": "<missing>"})");
  expect_error([&] { Tokenizer::load(path); },
               {dir.file("tokenizer_config.json"), "eos_token", "<missing>"});
}

// encode is const and shared by the data-prepare threads and the server's HTTP threads:
// the word cache under concurrent misses and hits gives every thread the serial result.
TEST(HfTokenizer, ConcurrentEncodesAgreeWithSerialOnes) {
  TempDir dir;
  const Tokenizer tok = load_json(dir, byte_level_tokenizer());
  std::vector<std::string> texts;
  std::mt19937 rng(3);
  const char* words[] = {"hello", "world", "he", "llo", "wor", "ld", "x", "\xE2\x82\xAC"};
  for (int t = 0; t < 64; ++t) {
    std::string s;
    for (int w = 0; w < 40; ++w) s += std::string(words[rng() % 8]) + (rng() % 3 ? " " : "");
    texts.push_back(s);
  }
  std::vector<std::vector<int32_t>> serial;
  {
    TempDir other;
    const Tokenizer fresh = load_json(other, byte_level_tokenizer());
    for (const std::string& t : texts) serial.push_back(fresh.encode(t));
  }
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (int round = 0; round < 20; ++round)
        for (size_t i = 0; i < texts.size(); ++i)
          mismatches[k] +=
              tok.encode(texts[(i + k * 7) % texts.size()]) != serial[(i + k * 7) % texts.size()];
    });
  for (std::thread& t : threads) t.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

TEST(HfTokenizer, InvalidUtf8TextIsAnErrorNamingTheOffset) {
  TempDir dir;
  const Tokenizer tok = load_json(dir, byte_level_tokenizer());
  expect_error([&] { tok.encode("ok\xFF"); }, {"not valid UTF-8", "byte offset 2"});
}

TEST(HfTokenizer, SplitBehaviorsAndDigits) {
  TempDir dir;
  json j = metaspace_tokenizer();
  j["normalizer"] = nullptr;
  j["model"]["vocab"]["1"] = 300;
  j["model"]["vocab"]["2"] = 301;
  j["model"]["vocab"]["-"] = 302;
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Removed"}},
                    {{"type", "Digits"}, {"individual_digits", true}}})}};
  const Tokenizer tok = load_json(dir, j);
  EXPECT_EQ(tok.encode("12-hi"),
            (std::vector<int32_t>{300, 301, tok.token_id("h"), tok.token_id("i")}));
}

}  // namespace
}  // namespace hyperion::text
