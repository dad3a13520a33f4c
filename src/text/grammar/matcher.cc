#include "text/grammar/matcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

namespace hyperion::text {

namespace {

inline void set_bit(uint64_t* m, int32_t t) {
  m[static_cast<size_t>(t) >> 6] |= uint64_t{1} << (static_cast<unsigned>(t) & 63);
}
inline bool get_bit(const uint64_t* m, int32_t t) {
  return (m[static_cast<size_t>(t) >> 6] >> (static_cast<unsigned>(t) & 63)) & 1;
}

// Accepted lists above this many tokens are kept as a vocabulary mask.
constexpr size_t kBitsAbove = 2048;

}  // namespace

std::shared_ptr<const CompiledGrammar> CompiledGrammar::compile(
    Grammar grammar, std::shared_ptr<const TokenVocabulary> vocab) {
  const auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<CompiledGrammar> c(new CompiledGrammar());
  c->vocab_ = std::move(vocab);
  for (GrammarElement& e : grammar.elements) {
    if (e.kind == GrammarElement::kTokenText) {
      const std::string& text = grammar.token_texts[static_cast<size_t>(e.value)];
      const int32_t id = c->vocab_->find_token(text);
      if (id < 0 || id >= c->vocab_->size())
        throw GrammarError("token " + text, "the tokenizer has no single token with this text");
      e = {GrammarElement::kToken, id};
    } else if (e.kind == GrammarElement::kToken &&
               (e.value < 0 || e.value >= c->vocab_->size())) {
      throw GrammarError(fmt::format("token <[{}]>", e.value),
                         fmt::format("outside the vocabulary [0, {})", c->vocab_->size()));
    }
  }
  c->g_ = std::move(grammar);
  c->unique_return_ = unique_returns(c->g_);
  const Grammar& g = c->g_;
  c->class_of_.assign(g.elements.size(), -1);
  GrammarStacks stacks(g, c->unique_return_.data());
  for (size_t p = 0; p < g.elements.size(); ++p) {
    const auto kind = g.elements[p].kind;
    if (kind != GrammarElement::kBytes && kind != GrammarElement::kToken) continue;
    c->class_of_[p] = static_cast<int32_t>(c->classes_.size());
    c->classes_.emplace_back();
    c->precompute(static_cast<int32_t>(p), c->classes_.back(), stacks);
  }
  c->compile_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return c;
}

void CompiledGrammar::precompute(int32_t pos, Classes& out, GrammarStacks& stacks) {
  const GrammarElement& el = g_.elements[static_cast<size_t>(pos)];
  if (el.kind == GrammarElement::kToken) {  // a special token: itself, nothing else
    out.accepted.push_back(el.value);
    return;
  }
  const TokenVocabulary& v = *vocab_;
  const std::vector<int32_t>& order = v.order();
  stacks.clear();
  // Per depth: the tops (a range of `tops`), the arena size after them, and whether a path
  // reached the unknown bottom on the way.
  struct Level {
    size_t begin, end, mark;
    bool boundary;
  };
  std::vector<Level> level(static_cast<size_t>(v.max_depth()) + 1);
  std::vector<int32_t> tops{stacks.push(pos, -1)}, next;
  level[0] = {0, 1, stacks.size(), false};
  std::vector<int32_t> accepted;
  auto add_range = [&](std::vector<int32_t>& to, size_t node_from, size_t node_to) {
    for (int32_t r = v.node_tokens_begin(node_from); r < v.node_tokens_begin(node_to); ++r)
      to.push_back(order[static_cast<size_t>(r)]);
  };
  const size_t n = v.trie_nodes();
  for (size_t i = 1; i < n;) {
    const auto d = static_cast<size_t>(v.node_depth(i));
    const Level& up = level[d - 1];
    stacks.truncate(up.mark);
    tops.resize(up.end);
    next.clear();
    stacks.reset_flags();
    stacks.advance_byte(tops.data() + up.begin, up.end - up.begin, v.node_byte(i), next);
    const bool boundary = up.boundary || stacks.boundary;
    if (next.empty()) {
      // Nothing reads further. The tokens ending here are allowed if a path ended the
      // grammar with this byte; the longer ones, and these otherwise, hang on the stack
      // below when a path reached it.
      const auto skip = static_cast<size_t>(v.node_skip(i));
      if (stacks.end)
        add_range(accepted, i, i + 1);
      else if (boundary)
        add_range(out.uncertain, i, i + 1);
      if (boundary) add_range(out.uncertain, i + 1, skip);
      i = skip;
      continue;
    }
    add_range(accepted, i, i + 1);
    const size_t b = tops.size();
    tops.insert(tops.end(), next.begin(), next.end());
    level[d] = {b, tops.size(), stacks.size(), boundary};
    ++i;
  }
  stacks.clear();
  if (accepted.size() > kBitsAbove) {
    out.accepted_bits.assign(v.mask_words(), 0);
    for (const int32_t t : accepted) set_bit(out.accepted_bits.data(), t);
  } else {
    out.accepted = std::move(accepted);
  }
}

size_t CompiledGrammar::memory_bytes() const {
  size_t b = 0;
  for (const Classes& c : classes_)
    b += (c.accepted.size() + c.uncertain.size()) * sizeof(int32_t) +
         c.accepted_bits.size() * sizeof(uint64_t);
  return b + g_.elements.size() * sizeof(GrammarElement);
}

size_t CompiledGrammar::accepted_total() const {
  size_t n = 0;
  for (const Classes& c : classes_) {
    n += c.accepted.size();
    for (const uint64_t w : c.accepted_bits) n += static_cast<size_t>(__builtin_popcountll(w));
  }
  return n;
}

size_t CompiledGrammar::uncertain_total() const {
  size_t n = 0;
  for (const Classes& c : classes_) n += c.uncertain.size();
  return n;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : g_(std::move(grammar)), stacks_(g_->grammar()) {
  stacks_.start(tops_);
  can_end_ = stacks_.end;
}

void GrammarMatcher::check_uncertain(const std::vector<int32_t>& list, uint64_t* mask) {
  const TokenVocabulary& v = g_->vocab();
  const size_t base_mark = stacks_.size();
  const auto depth = static_cast<size_t>(v.max_depth()) + 1;
  level_begin_.assign(depth, 0);
  level_end_.assign(depth, 0);
  level_mark_.assign(depth, 0);
  level_tops_ = tops_;
  level_begin_[0] = 0, level_end_[0] = tops_.size(), level_mark_[0] = base_mark;
  std::string_view prev;
  size_t dead = std::numeric_limits<size_t>::max();  // prev's path died at this depth
  bool dead_ended = false;  // ... having ended the grammar with its last byte
  for (size_t i = 0; i < list.size();) {
    const int32_t id = list[i];
    const std::string_view t = v.bytes(id);
    size_t l = 0;
    while (l < prev.size() && l < t.size() && prev[l] == t[l]) ++l;
    if (dead <= l) {  // shares the dead prefix: skip every token that starts with it
      const std::string_view dead_prefix = t.substr(0, dead);
      // (but one spelling exactly a prefix that ended the grammar is allowed: these come
      // first, as a prefix sorts before its extensions)
      for (; dead_ended && i < list.size() && v.bytes(list[i]) == dead_prefix; ++i)
        set_bit(mask, list[i]);
      i = static_cast<size_t>(
          std::partition_point(list.begin() + static_cast<std::ptrdiff_t>(i), list.end(),
                               [&](int32_t x) { return v.bytes(x).substr(0, dead) <= dead_prefix; }) -
          list.begin());
      continue;
    }
    dead = std::numeric_limits<size_t>::max();
    dead_ended = false;
    for (size_t k = l; k < t.size(); ++k) {
      stacks_.truncate(level_mark_[k]);
      level_tops_.resize(level_end_[k]);
      next_.clear();
      stacks_.reset_flags();
      stacks_.advance_byte(level_tops_.data() + level_begin_[k], level_end_[k] - level_begin_[k],
                           static_cast<uint8_t>(t[k]), next_);
      if (next_.empty()) {
        dead = k + 1;
        // A token that ends the grammar with its last byte is allowed (its extensions not).
        dead_ended = k + 1 == t.size() && stacks_.end;
        if (dead_ended) set_bit(mask, id);
        break;
      }
      level_begin_[k + 1] = level_tops_.size();
      level_tops_.insert(level_tops_.end(), next_.begin(), next_.end());
      level_end_[k + 1] = level_tops_.size();
      level_mark_[k + 1] = stacks_.size();
    }
    if (dead == std::numeric_limits<size_t>::max()) set_bit(mask, id);
    prev = t;
    ++i;
  }
  stacks_.truncate(base_mark);
}

int64_t GrammarMatcher::fill_mask(uint64_t* mask) {
  const TokenVocabulary& v = g_->vocab();
  const size_t words = v.mask_words();
  std::fill(mask, mask + words, 0);
  if (!ended_) {
    // The distinct positions of the tops (usually one to a handful).
    merged_.clear();
    for (const int32_t t : tops_) merged_.push_back(stacks_.node(t).pos);
    std::sort(merged_.begin(), merged_.end());
    merged_.erase(std::unique(merged_.begin(), merged_.end()), merged_.end());
    const std::vector<int32_t>* only_uncertain = nullptr;
    std::vector<int32_t> uncertain;
    size_t lists = 0;
    for (const int32_t pos : merged_) {
      const CompiledGrammar::Classes* c = g_->classes(pos);
      if (c == nullptr) continue;
      for (const int32_t t : c->accepted) set_bit(mask, t);
      if (!c->accepted_bits.empty())
        for (size_t w = 0; w < words; ++w) mask[w] |= c->accepted_bits[w];
      if (!c->uncertain.empty()) {
        ++lists;
        only_uncertain = &c->uncertain;
        uncertain.insert(uncertain.end(), c->uncertain.begin(), c->uncertain.end());
      }
    }
    if (lists > 1) {
      std::sort(uncertain.begin(), uncertain.end(),
                [&](int32_t a, int32_t b) { return v.rank(a) < v.rank(b); });
      uncertain.erase(std::unique(uncertain.begin(), uncertain.end()), uncertain.end());
      only_uncertain = &uncertain;
    }
    if (only_uncertain != nullptr) {
      // Already allowed outright by another top: no need to check.
      std::vector<int32_t> todo;
      todo.reserve(only_uncertain->size());
      for (const int32_t t : *only_uncertain)
        if (!get_bit(mask, t)) todo.push_back(t);
      check_uncertain(todo, mask);
    }
    if (can_end_)
      for (const int32_t e : v.end_ids())
        if (e >= 0 && e < v.size()) set_bit(mask, e);
  }
  int64_t count = 0;
  for (size_t w = 0; w < words; ++w) count += __builtin_popcountll(mask[w]);
  return count;
}

bool GrammarMatcher::accept(int32_t token) {
  const TokenVocabulary& v = g_->vocab();
  if (ended_ || token < 0 || token >= v.size()) return false;
  const auto& ends = v.end_ids();
  if (std::find(ends.begin(), ends.end(), token) != ends.end()) {
    if (!can_end_) return false;
    ended_ = true;
    return true;
  }
  const size_t mark = stacks_.size();
  const std::string_view bytes = v.bytes(token);
  std::vector<int32_t> cur = tops_;
  bool end = false;
  if (bytes.empty()) {
    next_.clear();
    stacks_.reset_flags();
    stacks_.advance_token(cur.data(), cur.size(), token, next_);
    cur.swap(next_);
    end = stacks_.end;
  } else {
    for (const char c : bytes) {
      next_.clear();
      stacks_.reset_flags();
      stacks_.advance_byte(cur.data(), cur.size(), static_cast<uint8_t>(c), next_);
      cur.swap(next_);
      if (cur.empty() && !stacks_.end) break;
    }
    end = stacks_.end;
  }
  if (cur.empty() && !end) {
    stacks_.truncate(mark);
    return false;
  }
  tops_.swap(cur);
  can_end_ = end;
  if (stacks_.size() > (size_t{1} << 16)) compact();
  return true;
}

// Copies the nodes the live tops reach into a fresh arena (the rest is garbage from
// earlier steps).
void GrammarMatcher::compact() {
  std::vector<StackNode>& old = stacks_.nodes();
  std::vector<int32_t> remap(old.size(), -1);
  std::vector<StackNode> fresh;
  auto copy = [&](int32_t id) {
    std::vector<int32_t> chain;
    for (int32_t x = id; x >= 0 && remap[static_cast<size_t>(x)] < 0; x = old[static_cast<size_t>(x)].parent)
      chain.push_back(x);
    for (size_t k = chain.size(); k-- > 0;) {
      const StackNode n = old[static_cast<size_t>(chain[k])];
      const int32_t parent = n.parent < 0 ? -1 : remap[static_cast<size_t>(n.parent)];
      fresh.push_back({n.pos, parent});
      remap[static_cast<size_t>(chain[k])] = static_cast<int32_t>(fresh.size() - 1);
    }
    return remap[static_cast<size_t>(id)];
  };
  for (int32_t& t : tops_) t = copy(t);
  old.swap(fresh);
}

void GrammarMatcher::apply_mask(const uint64_t* mask, float* logits, int64_t vocab) {
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t w = 0; w * 64 < vocab; ++w) {
    const uint64_t bits = mask[w];
    if (bits == ~uint64_t{0}) continue;
    const int64_t end = std::min<int64_t>(64, vocab - w * 64);
    for (int64_t b = 0; b < end; ++b)
      if (!((bits >> b) & 1)) logits[w * 64 + b] = ninf;
  }
}

}  // namespace hyperion::text
