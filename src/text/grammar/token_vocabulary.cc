#include "text/grammar/token_vocabulary.h"

#include <algorithm>
#include <numeric>

#include "text/tokenizer.h"

namespace hyperion::text {

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes, int32_t vocab_size,
                                 std::vector<int32_t> end_ids,
                                 std::function<int32_t(std::string_view)> token_id)
    : vocab_size_(vocab_size), end_ids_(std::move(end_ids)), token_id_(std::move(token_id)) {
  const auto n = static_cast<size_t>(vocab_size);
  token_bytes.resize(std::min(token_bytes.size(), n));
  for (const int32_t e : end_ids_)  // an end token is never text
    if (e >= 0 && static_cast<size_t>(e) < token_bytes.size()) token_bytes[static_cast<size_t>(e)].clear();
  offset_.assign(n + 1, 0);
  for (size_t id = 0; id < n; ++id) {
    offset_[id] = blob_.size();
    if (id < token_bytes.size()) blob_ += token_bytes[id];
  }
  offset_[n] = blob_.size();
  for (size_t id = 0; id < n; ++id)
    if (offset_[id + 1] > offset_[id]) order_.push_back(static_cast<int32_t>(id));
  std::stable_sort(order_.begin(), order_.end(),
                   [&](int32_t a, int32_t b) { return bytes(a) < bytes(b); });
  later_byte_.assign(256, {});
  for (const int32_t id : order_) {
    bool seen[256] = {};
    const std::string_view t = bytes(id);
    for (size_t k = 1; k < t.size(); ++k) {
      const auto b = static_cast<uint8_t>(t[k]);
      if (!seen[b]) seen[b] = true, later_byte_[b].push_back(id);
    }
  }
  rank_.assign(n, -1);
  for (size_t r = 0; r < order_.size(); ++r) rank_[static_cast<size_t>(order_[r])] = static_cast<int32_t>(r);

  // The trie in preorder: each token in sorted order adds the nodes past its common prefix
  // with the previous one; a node's subtree ends when a later token leaves its prefix.
  node_byte_.push_back(0);
  node_depth_.push_back(0);
  node_skip_.push_back(0);
  node_tok_.push_back(0);
  std::vector<int32_t> path{0};  // node at each depth of the current token
  std::string_view prev;
  for (size_t r = 0; r < order_.size(); ++r) {
    const std::string_view t = bytes(order_[r]);
    size_t l = 0;
    while (l < prev.size() && l < t.size() && prev[l] == t[l]) ++l;
    while (path.size() > l + 1) {
      node_skip_[static_cast<size_t>(path.back())] = static_cast<int32_t>(node_byte_.size());
      path.pop_back();
    }
    for (size_t k = l; k < t.size(); ++k) {
      path.push_back(static_cast<int32_t>(node_byte_.size()));
      node_byte_.push_back(static_cast<uint8_t>(t[k]));
      node_depth_.push_back(static_cast<int32_t>(k + 1));
      node_skip_.push_back(0);
      node_tok_.push_back(static_cast<int32_t>(r));
    }
    max_depth_ = std::max(max_depth_, static_cast<int32_t>(t.size()));
    prev = t;
  }
  const auto end = static_cast<int32_t>(node_byte_.size());
  for (const int32_t p : path) node_skip_[static_cast<size_t>(p)] = end;
  // node_tok_[i] is where node i's tokens begin in order_: the first token that created or
  // passes through it is the first whose bytes end there, if any do (sorted order puts a
  // prefix before its extensions). Turn it into a CSR of the tokens ending at each node.
  std::vector<int32_t> begin(node_byte_.size() + 1, 0);
  std::vector<int32_t> ends_at(order_.size());
  {
    // Walk again: the node each token ends at is the deepest on its path.
    std::vector<int32_t> stack{0};
    size_t node = 1;
    prev = {};
    for (size_t r = 0; r < order_.size(); ++r) {
      const std::string_view t = bytes(order_[r]);
      size_t l = 0;
      while (l < prev.size() && l < t.size() && prev[l] == t[l]) ++l;
      stack.resize(l + 1);
      for (size_t k = l; k < t.size(); ++k) stack.push_back(static_cast<int32_t>(node++));
      ends_at[r] = stack.back();
      prev = t;
    }
  }
  for (const int32_t e : ends_at) ++begin[static_cast<size_t>(e) + 1];
  std::partial_sum(begin.begin(), begin.end(), begin.begin());
  node_tok_ = std::move(begin);  // tokens ending at a node are consecutive in order_
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::from_tokenizer(const Tokenizer& tok,
                                                                       int64_t model_vocab) {
  std::vector<int32_t> ends = tok.end_ids();
  if (tok.eos_id() >= 0 && std::find(ends.begin(), ends.end(), tok.eos_id()) == ends.end())
    ends.push_back(tok.eos_id());
  return std::make_shared<TokenVocabulary>(
      tok.token_bytes(), static_cast<int32_t>(model_vocab), std::move(ends),
      [&tok](std::string_view text) { return tok.token_id(text); });
}

}  // namespace hyperion::text
