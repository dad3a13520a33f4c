#include "text/clip_tokenizer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "base/error.h"
#include "text/bpe_model.h"

namespace hyperion::text {
namespace {

// A vocabulary built the way CLIP builds its own (simple_tokenizer.py): the 256 byte
// characters, the same with "</w>", one token per merge, then the two special tokens.
struct Files {
  std::string vocab, merges;
};

Files clip_like_files(const std::vector<std::string>& merges) {
  // bytes_to_unicode's order: the printable bytes ('!' first), then the others.
  std::vector<int> order;
  for (int b = 0; b < 256; ++b)
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) order.push_back(b);
  for (int b = 0; b < 256; ++b)
    if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) order.push_back(b);
  std::vector<std::string> vocab;
  for (int b : order) vocab.push_back(byte_level_char(uint8_t(b)));
  for (int b : order) vocab.push_back(byte_level_char(uint8_t(b)) + "</w>");
  std::string merges_txt = "#version: 0.2\n";
  for (const std::string& m : merges) {
    const size_t sp = m.find(' ');
    vocab.push_back(m.substr(0, sp) + m.substr(sp + 1));
    merges_txt += m + "\n";
  }
  vocab.push_back("<|startoftext|>");
  vocab.push_back("<|endoftext|>");
  nlohmann::json j = nlohmann::json::object();
  for (size_t i = 0; i < vocab.size(); ++i) j[vocab[i]] = i;
  return {j.dump(), merges_txt};
}

const std::vector<std::string> kMerges = {"o f</w>", "c a", "ca t</w>", "p h", "ph o", "t o</w>", "pho to</w>"
                                          };

ClipTokenizer tiny() {
  const Files f = clip_like_files(kMerges);
  return ClipTokenizer::from_files(f.vocab, f.merges, "tiny");
}

int32_t merged_id(size_t merge_index) {
  return int32_t(512 + merge_index);
}

TEST(ClipTokenizer, MergesWordsWithTheEndOfWordMark) {
  const ClipTokenizer t = tiny();
  EXPECT_EQ(t.bos_id(), 512 + int32_t(kMerges.size()));
  EXPECT_EQ(t.eos_id(), t.bos_id() + 1);
  // "a" alone is the byte token "a</w>" (256 + 'a' position in the byte alphabet).
  const std::vector<int32_t> ids = t.encode("A  Photo\tof a CAT");
  const int32_t a_end = t.encode("a")[0];
  EXPECT_EQ(t.piece(a_end), "a</w>");
  EXPECT_EQ(ids, (std::vector<int32_t>{a_end, merged_id(6), merged_id(0), a_end, merged_id(2)}));
  EXPECT_EQ(t.decode(ids), "a photo of a cat");
  // An unmerged word keeps its byte symbols, the last with "</w>".
  const std::vector<int32_t> dog = t.encode("dog");
  ASSERT_EQ(dog.size(), 3u);
  EXPECT_EQ(t.piece(dog[0]), "d");
  EXPECT_EQ(t.piece(dog[2]), "g</w>");
  // Punctuation runs and single digits are their own pieces; contractions split off.
  EXPECT_EQ(t.decode(t.encode("cat's 42!!")), "cat 's 4 2 !!");
}

TEST(ClipTokenizer, EncodesForTheModelWithTruncationAndPadding) {
  const Files f = clip_like_files(kMerges);
  const ClipTokenizer t = ClipTokenizer::from_files(f.vocab, f.merges, "tiny", "!", 8);
  int64_t dropped = -1;
  std::vector<int32_t> ids = t.encode_for_model("a cat", &dropped);
  EXPECT_EQ(dropped, 0);
  const int32_t bang = t.encode("!")[0] - 256;  // "!" without </w>: id 0
  EXPECT_EQ(bang, 0);
  EXPECT_EQ(ids, (std::vector<int32_t>{t.bos_id(), t.encode("a")[0], merged_id(2), t.eos_id(), 0, 0, 0, 0}));
  ids = t.encode_for_model("a a a a a a a a", &dropped);
  EXPECT_EQ(dropped, 2);
  ASSERT_EQ(ids.size(), 8u);
  EXPECT_EQ(ids.back(), t.eos_id());
  // The default pad is <|endoftext|> (SD 1.x's CLIP).
  const ClipTokenizer sd1 = ClipTokenizer::from_files(f.vocab, f.merges, "tiny");
  EXPECT_EQ(sd1.encode_for_model("cat").back(), sd1.eos_id());
  EXPECT_EQ(sd1.encode_for_model("cat").size(), 77u);
}

TEST(ClipTokenizer, NonAsciiTextIsSpelledInBytes) {
  const ClipTokenizer t = tiny();
  const std::vector<int32_t> ids = t.encode("Café");
  EXPECT_EQ(t.decode(ids), "café");
  EXPECT_EQ(ids.size(), 4u);  // "ca", "f" and the two bytes of é, the last with </w>
}

TEST(ClipTokenizer, RefusesBrokenFilesNamingThem) {
  const Files f = clip_like_files(kMerges);
  auto error = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error([&] { ClipTokenizer::from_files("[1]", f.merges, "dir"); }).find("dir/vocab.json"),
            std::string::npos);
  EXPECT_NE(error([&] { ClipTokenizer::from_files(f.vocab, "#version\nab\n", "dir"); })
                .find("dir/merges.txt: line 2 is not two symbols"),
            std::string::npos);
  EXPECT_NE(error([&] { ClipTokenizer::from_files(R"({"a": 0})", "", "dir"); }).find("no <|startoftext|> token"),
            std::string::npos);
  EXPECT_NE(error([&] { ClipTokenizer::from_files(f.vocab, f.merges, "dir", "<pad>"); }).find("no <pad> token"),
            std::string::npos);
  EXPECT_NE(error([&] { tiny().encode("\xff"); }).find("not valid UTF-8 at byte 0"), std::string::npos);
  EXPECT_NE(error([&] { ClipTokenizer::load("/nonexistent"); }).find("needs vocab.json"), std::string::npos);
}

}  // namespace
}  // namespace hyperion::text
