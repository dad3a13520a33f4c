// A model's vocabulary as the grammar matcher sees it: each token's bytes
// (Tokenizer::token_bytes), the tokens that end a generation, and a byte trie of the
// tokens in preorder, built once per tokenizer and shared by every grammar compiled for it.
//
// The trie is flat: node i has the byte on the edge into it, its depth, and skip[i], the
// first node after its subtree, so a walk that finds a prefix dead jumps over every token
// that starts with it. Nodes are in lexicographic order of their bytes, so the tokens of
// any subtree are a contiguous range of `order` (tokens sorted by bytes).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace hyperion::text {

class Tokenizer;

class TokenVocabulary {
 public:
  // `token_bytes[id]` for ids below `vocab_size` (the model's logits; ids past the list
  // are never allowed); "" for a token text never matches (special tokens). `end_ids`
  // end a generation; `token_id` finds a token by its text (for a grammar's <text>
  // tokens; may be empty).
  TokenVocabulary(std::vector<std::string> token_bytes, int32_t vocab_size,
                  std::vector<int32_t> end_ids,
                  std::function<int32_t(std::string_view)> token_id = {});
  // From a tokenizer, for a model with `model_vocab` logits.
  static std::shared_ptr<const TokenVocabulary> from_tokenizer(const Tokenizer& tok,
                                                               int64_t model_vocab);

  int32_t size() const { return vocab_size_; }
  size_t mask_words() const { return (static_cast<size_t>(vocab_size_) + 63) / 64; }
  std::string_view bytes(int32_t id) const {
    return {blob_.data() + offset_[static_cast<size_t>(id)],
            offset_[static_cast<size_t>(id) + 1] - offset_[static_cast<size_t>(id)]};
  }
  const std::vector<int32_t>& end_ids() const { return end_ids_; }
  // The id of a token by its text, -1 when there is none.
  int32_t find_token(std::string_view text) const { return token_id_ ? token_id_(text) : -1; }

  // The trie (node 0 is the empty prefix).
  size_t trie_nodes() const { return node_byte_.size(); }
  uint8_t node_byte(size_t i) const { return node_byte_[i]; }
  int32_t node_depth(size_t i) const { return node_depth_[i]; }
  int32_t node_skip(size_t i) const { return node_skip_[i]; }
  // Tokens whose bytes end at node i: order[node_tokens_begin(i) .. node_tokens_begin(i + 1)).
  int32_t node_tokens_begin(size_t i) const { return node_tok_[i]; }
  const std::vector<int32_t>& order() const { return order_; }  // text tokens by bytes
  int32_t rank(int32_t id) const { return rank_[static_cast<size_t>(id)]; }  // -1: not in trie
  int32_t max_depth() const { return max_depth_; }
  // The text tokens holding byte b somewhere after their first byte, in byte order.
  const std::vector<int32_t>& tokens_with_later_byte(uint8_t b) const { return later_byte_[b]; }

 private:
  int32_t vocab_size_;
  std::string blob_;
  std::vector<size_t> offset_;
  std::vector<int32_t> end_ids_;
  std::function<int32_t(std::string_view)> token_id_;
  std::vector<uint8_t> node_byte_;
  std::vector<int32_t> node_depth_, node_skip_, node_tok_;
  std::vector<int32_t> order_, rank_;
  std::vector<std::vector<int32_t>> later_byte_;
  int32_t max_depth_ = 0;
};

}  // namespace hyperion::text
