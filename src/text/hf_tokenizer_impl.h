// The parsed parts of a Hugging Face tokenizer (text/hf_tokenizer.h): built by
// hf_tokenizer_json.cc, used by hf_tokenizer.cc. Not part of the public interface.
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/bpe_model.h"
#include "text/hf_text_ops.h"
#include "text/hf_tokenizer.h"

namespace hyperion::text {

// Added tokens, matched leftmost-longest with a byte trie.
class AddedTokenMatcher {
 public:
  struct Token {
    std::string content;
    int32_t id;
    bool lstrip, rstrip;
  };
  void add(Token t);
  bool empty() const { return tokens_.empty(); }
  // The leftmost-longest match at or after `from`: returns false when there is none.
  // [*begin, *end) includes the whitespace lstrip/rstrip absorb; *id is the token.
  bool find(std::string_view text, size_t from, size_t* begin, size_t* end, int32_t* id) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
    int32_t token = -1;                                 // index into tokens_
  };
  int32_t child(int32_t node, uint8_t byte) const;
  std::vector<Node> nodes_{Node{}};
  std::vector<Token> tokens_;
  bool first_byte_[256] = {};
};

struct DecoderOp {
  enum class Kind { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip };
  Kind kind;
  std::string pattern, content;  // Replace (literal pattern), Strip (content)
  std::shared_ptr<Regex> regex;  // Replace with a Regex pattern
  size_t strip_start = 0, strip_stop = 0;
  std::string replacement;  // Metaspace
  bool metaspace_strip_first = true;
};

// What encode_with_special_tokens wraps around the sequence.
struct SpecialTemplate {
  std::vector<int32_t> before, after;
};

struct HfTokenizer::Impl {
  std::string origin;
  std::vector<NormalizerOp> normalizers;
  std::vector<PreTokenizerOp> pre_tokenizers;
  std::vector<DecoderOp> decoders;
  std::optional<BpeModel> model;
  AddedTokenMatcher raw_added, normalized_added;
  SpecialTemplate post;

  std::vector<std::string> pieces;  // id -> token text as written in the file
  std::vector<uint8_t> special;     // id -> is a special added token
  TokenMap added_ids;               // added token content -> id
  int32_t vocab_size = 0;
  size_t max_piece_bytes = 1;

  int32_t bos = -1, eos = -1, pad = -1, unk = -1;
  std::string bos_token, eos_token;
  std::vector<int32_t> end_ids;
  std::string chat_template;
};

// Fills `impl` from the sources (hf_tokenizer_json.cc).
void parse_hf_tokenizer(const HfTokenizerSource& src, HfTokenizer::Impl& impl);
// Then tokenizer_config.json and the end tokens, which look tokens up through `tok`.
void parse_hf_tokenizer_config(const HfTokenizerSource& src, HfTokenizer::Impl& impl,
                               HfTokenizer& tok);

}  // namespace hyperion::text
