// The pieces that make a tokenizer.json load fast: the one-pass reader that sends
// model.vocab and model.merges to flat tables (hf_tokenizer_json_sax.h), the flat token
// index (token_index.h) and BpeModel's batched merge insertion. Each is checked against
// the plain way of doing the same: nlohmann-json's document, std::unordered_map, and one
// merge at a time.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/error.h"
#include "text/bpe_model.h"
#include "text/hf_tokenizer_json_sax.h"
#include "text/token_index.h"

namespace hyperion::text {
namespace {

using nlohmann::json;
using Form = BpeTables::Merge::Form;

TEST(TokenizerJsonTables, VocabAndMergesGoToTablesAndTheRestToTheDocument) {
  const std::string text = R"({"version": "1.0", "added_tokens": [{"id": 3, "content": "<s>"}],
    "model": {"type": "BPE", "vocab": {"a": 0, "b\u00e9": 1, "ab\u00e9": 2, "q\"": 3},
              "merges": ["a b\u00e9", ["a", "b\u00e9"]], "fuse_unk": true},
    "decoder": {"type": "Fuse"}})";
  BpeTables t;
  const json doc = parse_tokenizer_json(text, "tok.json", t);
  json expected = json::parse(text);
  expected["model"].erase("vocab");
  expected["model"].erase("merges");
  EXPECT_EQ(doc, expected);  // everything else, as nlohmann-json reads it

  ASSERT_TRUE(t.has_vocab);
  ASSERT_EQ(t.vocab.size(), 4u);
  const json vocab = json::parse(text)["model"]["vocab"];
  for (const BpeTables::Token& tok : t.vocab)
    EXPECT_EQ(vocab.at(std::string(t.token_text(tok))).get<int64_t>(), tok.id);
  EXPECT_EQ(t.token_text(t.vocab[1]), "b\xC3\xA9");  // escapes undone, in file order
  EXPECT_EQ(t.token_text(t.vocab[3]), "q\"");

  ASSERT_TRUE(t.has_merges);
  ASSERT_EQ(t.merges.size(), 2u);
  EXPECT_EQ(t.merges[0].form, Form::kString);
  EXPECT_EQ(t.merge_text(t.merges[0]), "a b\xC3\xA9");
  EXPECT_EQ(t.merges[1].form, Form::kPair);
  EXPECT_EQ(t.merge_text(t.merges[1]), "ab\xC3\xA9");
  EXPECT_EQ(t.merges[1].left, 1u);
}

TEST(TokenizerJsonTables, ValuesOfTheWrongKindAreRecordedForTheReaderToName) {
  const std::string text = R"({"model": {
    "vocab": {"a": 1.5, "b": "x", "c": {"d": [1, 2]}, "e": -1, "f": 18446744073709551615, "g": 7},
    "merges": [3, {"x": "a", "y": "b"}, ["a"], ["a", "b", "c"], ["a", 1], [["a"], "b"], "a b", null]}})";
  BpeTables t;
  parse_tokenizer_json(text, "tok.json", t);
  ASSERT_EQ(t.vocab.size(), 6u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(t.vocab[i].id, BpeTables::kNotAnId) << i;
  EXPECT_EQ(t.vocab[3].id, -1);
  EXPECT_EQ(t.vocab[4].id, BpeTables::kNotAnId);  // past int64
  EXPECT_EQ(t.vocab[5].id, 7);
  EXPECT_EQ(t.token_text(t.vocab[5]), "g");  // the nested "d" key was not taken for a token
  ASSERT_EQ(t.merges.size(), 8u);
  for (size_t i : {0, 1, 2, 3, 4, 5, 7}) EXPECT_EQ(t.merges[i].form, Form::kOther) << i;
  EXPECT_EQ(t.merges[6].form, Form::kString);
  EXPECT_EQ(t.merge_text(t.merges[6]), "a b");
}

TEST(TokenizerJsonTables, OnlyRootModelIsCapturedAndARepeatedKeyReplacesTheEarlierValue) {
  BpeTables t;
  // A "vocab" elsewhere stays in the document.
  json doc = parse_tokenizer_json(R"({"x": {"vocab": {"a": 1}}, "model": {"merges": 5}})",
                                  "tok.json", t);
  EXPECT_FALSE(t.has_vocab);
  EXPECT_FALSE(t.has_merges);
  EXPECT_EQ(doc["x"]["vocab"]["a"], 1);
  EXPECT_EQ(doc["model"]["merges"], 5);  // not a list: left for the reader to refuse
  // As in nlohmann-json's document, the last of two equal keys wins.
  doc = parse_tokenizer_json(R"({"model": {"vocab": {"a": 1}, "vocab": 3}})", "tok.json", t);
  EXPECT_FALSE(t.has_vocab);
  EXPECT_EQ(doc["model"]["vocab"], 3);
  parse_tokenizer_json(R"({"model": {"vocab": {"a": 1}}, "model": {"vocab": {"b": 2, "c": 3}}})",
                       "tok.json", t);
  ASSERT_EQ(t.vocab.size(), 2u);
  EXPECT_EQ(t.token_text(t.vocab[0]), "b");
  doc = parse_tokenizer_json(R"({"model": {"vocab": {"a": 1}}, "model": null})", "tok.json", t);
  EXPECT_FALSE(t.has_vocab);
  EXPECT_TRUE(doc["model"].is_null());
}

TEST(TokenizerJsonTables, ASyntaxErrorNamesTheFileAndWhere) {
  BpeTables t;
  for (const char* bad : {R"({"model": {"vocab": {"a": 1,}}})", R"({"model": {"merges": ["a b")",
                          "", "[1, 2"}) {
    try {
      parse_tokenizer_json(bad, "dir/tokenizer.json", t);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("dir/tokenizer.json: not valid JSON"), std::string::npos) << msg;
      EXPECT_NE(msg.find("parse error at line"), std::string::npos) << msg;
    }
  }
}

// Deep nesting is parsed without recursion, as nlohmann-json's own parser does.
TEST(TokenizerJsonTables, DeepNestingInsideAndOutsideTheTables) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  BpeTables t;
  const json doc = parse_tokenizer_json(
      R"({"x": )" + deep + R"(, "model": {"merges": [)" + deep + R"(, "a b"]}})", "t.json", t);
  EXPECT_TRUE(doc["x"].is_array());
  ASSERT_EQ(t.merges.size(), 2u);
  EXPECT_EQ(t.merges[0].form, Form::kOther);
  EXPECT_EQ(t.merges[1].form, Form::kString);
}

TEST(TokenIndex, AgreesWithAnUnorderedMapOnRandomTexts) {
  std::mt19937 rng(3);
  TokenIndex index;
  std::unordered_map<std::string, int32_t> plain;
  std::vector<std::string> texts;
  for (int32_t id = 0; id < 20000; ++id) {
    std::string s(1 + rng() % 12, ' ');
    for (char& c : s) c = static_cast<char>(rng() % 6 == 0 ? rng() % 256 : 'a' + rng() % 3);
    texts.push_back(s);
    const auto it = plain.find(s);
    // A text already present keeps its id, which insert returns.
    EXPECT_EQ(index.insert(s, id), it == plain.end() ? -1 : it->second);
    plain.emplace(s, id);
  }
  EXPECT_EQ(index.size(), plain.size());
  for (const std::string& s : texts) EXPECT_EQ(index.find(s), plain.at(s));
  for (int i = 0; i < 2000; ++i) {
    const std::string s = texts[rng() % texts.size()] + "z";
    const auto it = plain.find(s);
    EXPECT_EQ(index.find(s), it == plain.end() ? -1 : it->second);
  }
  EXPECT_EQ(index.find(""), -1);
  size_t seen = 0;
  index.for_each([&](std::string_view text, int32_t id) {
    EXPECT_EQ(plain.at(std::string(text)), id);
    ++seen;
  });
  EXPECT_EQ(seen, plain.size());
  EXPECT_EQ(TokenIndex().find("a"), -1);
  const TokenIndex small{{"", 4}, {"x", 5}};
  EXPECT_EQ(small.find(""), 4);
  EXPECT_EQ(small.find("x"), 5);
}

// Merges added in batches (as the reader does) give the same model as one at a time,
// and a bad merge in a later group is named by its place in the batch.
TEST(BpeModel, BatchedMergesEqualOneAtATime) {
  std::mt19937 rng(11);
  std::vector<std::string> tokens = {"a", "b", "c", "d"};
  std::vector<std::pair<std::string, std::string>> merges;
  while (merges.size() < 300) {
    const std::string l = tokens[rng() % tokens.size()], r = tokens[rng() % tokens.size()];
    if (l.size() + r.size() > 8 || std::find(tokens.begin(), tokens.end(), l + r) != tokens.end())
      continue;
    tokens.push_back(l + r);
    merges.emplace_back(l, r);
  }
  auto vocab = [&] {
    TokenIndex v;
    for (size_t i = 0; i < tokens.size(); ++i) v.insert(tokens[i], static_cast<int32_t>(i));
    return v;
  };
  BpeModel one(BpeModelSpec{}, vocab()), batched(BpeModelSpec{}, vocab());
  std::string text;
  std::vector<BpeModel::MergeText> batch;
  for (size_t r = 0; r < merges.size(); ++r) {
    ASSERT_EQ(one.add_merge(merges[r].first, merges[r].second, static_cast<int32_t>(r)), "");
    batch.push_back({static_cast<uint32_t>(text.size()),
                     static_cast<uint32_t>(merges[r].first.size()),
                     static_cast<uint32_t>(merges[r].second.size()), static_cast<int32_t>(r)});
    text += merges[r].first + merges[r].second;
  }
  std::string why;
  ASSERT_EQ(batched.add_merges(text, batch, &why), batch.size()) << why;
  EXPECT_EQ(batched.merge_count(), one.merge_count());
  for (int w = 0; w < 200; ++w) {
    std::string word;
    for (size_t n = 1 + rng() % 30; n > 0; --n) word += static_cast<char>('a' + rng() % 4);
    std::vector<int32_t> a, b;
    one.encode_word(word, a);
    batched.encode_word(word, b);
    EXPECT_EQ(a, b) << word;
  }
  // The 41st merge (in the third group of 16) has a left part the vocabulary lacks.
  batch.resize(45);
  text[batch[40].offset] = 'z';
  BpeModel bad(BpeModelSpec{}, vocab());
  EXPECT_EQ(bad.add_merges(text, batch, &why), 40u);
  EXPECT_NE(why.find("is not in the vocabulary"), std::string::npos) << why;
}

}  // namespace
}  // namespace hyperion::text
