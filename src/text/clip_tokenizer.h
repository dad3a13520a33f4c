// The CLIP tokenizer of a Stable Diffusion text encoder (transformers' CLIPTokenizer,
// OpenAI's simple_tokenizer), read from a diffusers `tokenizer/` directory's vocab.json
// and merges.txt:
//
//   text -> HTML entities unescaped -> whitespace runs collapsed to one space, trimmed ->
//   lowercased -> split by CLIP's pattern ('s 't 're 've 'm 'll 'd, letter runs, single
//   digits, runs of other non-space characters; case-insensitive) -> each piece's UTF-8
//   bytes spelled in the GPT-2 byte alphabet, "</w>" appended to its last symbol -> BPE:
//   repeatedly merge every occurrence of the adjacent pair of lowest rank.
//
// encode_for_model() gives what a pipeline feeds the text encoder: <|startoftext|>, the
// tokens, <|endoftext|>, truncated to max_length (77) and padded with the pad token
// (<|endoftext|> for SD 1.x's CLIP, "!" for SD 2.x's and SDXL's second OpenCLIP one, as
// special_tokens_map.json / tokenizer_config.json say). ftfy's mojibake repair is not
// applied (transformers skips it too when ftfy is not installed).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace hyperion::text {

class ClipTokenizer {
 public:
  // Reads vocab.json and merges.txt (and the pad token and model_max_length from
  // special_tokens_map.json / tokenizer_config.json when present) from dir. Errors name
  // the file and the entry at fault.
  static ClipTokenizer load(const std::string& dir);
  // From the files' contents; origin names them in errors. pad_token empty: <|endoftext|>.
  static ClipTokenizer from_files(const std::string& vocab_json, const std::string& merges_txt,
                                  const std::string& origin, const std::string& pad_token = "",
                                  int64_t max_length = 77);

  // A CLIP-format tokenizer with CLIP's byte alphabet (512 tokens: bytes, and bytes ending
  // a word) plus merges that spell each of `words` (lowercase) as one token, then the
  // start and end tokens: a small vocabulary for a model trained from scratch on a fixed
  // set of captions (sd-tiny's "a photo of a NAME").
  static ClipTokenizer for_words(const std::vector<std::string>& words, int64_t max_length = 77);

  // The BPE ids of the text, no start/end tokens. The text must be valid UTF-8 (an error
  // names the offset).
  std::vector<int32_t> encode(std::string_view text) const;
  // max_length ids: start, tokens, end, pads. `dropped` (may be null) gets the number of
  // tokens truncation removed (a caller warns, as diffusers does).
  std::vector<int32_t> encode_for_model(std::string_view text, int64_t* dropped = nullptr) const;
  std::string decode(const std::vector<int32_t>& ids) const;

  int32_t bos_id() const { return bos_; }
  int32_t eos_id() const { return eos_; }
  int32_t pad_id() const { return pad_; }
  int64_t max_length() const { return max_length_; }
  int32_t vocab_size() const { return int32_t(pieces_.size()); }
  const std::string& piece(int32_t id) const { return pieces_.at(size_t(id)); }
  const std::string& origin() const { return origin_; }
  // The files it was read from, rebuilt (a pipeline saves its tokenizer with them).
  std::string vocab_json() const;
  std::string merges_txt() const;
  // Writes vocab.json, merges.txt and special_tokens_map.json / tokenizer_config.json
  // (the pad token, model_max_length) into dir, atomically.
  void save(const std::string& dir) const;

 private:
  void bpe(const std::string& word, std::vector<int32_t>& out) const;

  std::string origin_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> pieces_;
  std::unordered_map<std::string, int32_t> ranks_;  // "left right" -> rank
  int32_t bos_ = -1, eos_ = -1, pad_ = -1;
  int64_t max_length_ = 77;
  std::shared_ptr<const void> regex_;  // text::Regex, kept opaque
};

}  // namespace hyperion::text
