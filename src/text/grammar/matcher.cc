#include "text/grammar/matcher.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <unordered_map>

#include "base/threads.h"

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
  c->returns_ = grammar_returns(c->g_);
  const Grammar& g = c->g_;
  c->class_of_.assign(g.elements.size(), -1);
  // The first elements of a lazy rule's alternatives are never tops (the rule is).
  std::vector<uint8_t> never_top(g.elements.size(), 0);
  c->class_of_lazy_.assign(static_cast<size_t>(g.rule_count()), -1);
  // A walk depends only on the elements it can read before its bottom rule ends and on
  // where that rule returns: terminals with the same of both (x+'s first copy and its
  // loop's unit, a class repeated in several places) share their classes.
  std::unordered_map<std::string, int32_t> seen;
  auto walk_key = [&](char kind, size_t rule, size_t from, size_t to) {
    std::string key(1, kind);
    auto put = [&](int32_t x) { key.append(reinterpret_cast<const char*>(&x), sizeof x); };
    put(c->returns_.unique[rule]);
    put(c->returns_.chain_unit[rule]);
    for (size_t e = from; e < to; ++e) {
      put(g.elements[e].kind);
      put(g.elements[e].value);
      // (a rule reference that returns here: its place may be a chain's)
      put(g.chain_unit[e]);
      put(g.chain_level[e]);
    }
    return key;
  };
  // The walks to make, by class: the terminal each starts at.
  std::vector<int32_t> walk_from;
  auto classes_for = [&](int32_t pos, std::string key) {
    const auto [it, fresh] = seen.emplace(std::move(key), static_cast<int32_t>(walk_from.size()));
    if (fresh) walk_from.push_back(pos);
    return it->second;
  };
  for (int32_t r = 0; r < g.rule_count(); ++r) {
    const auto ru = static_cast<size_t>(r);
    if (!g.lazy[ru]) continue;
    for (int32_t k = g.rule_alt_begin[ru]; k < g.rule_alt_begin[ru + 1]; ++k)
      never_top[static_cast<size_t>(g.alt_starts[static_cast<size_t>(k)])] = 1;
    const auto from = static_cast<size_t>(g.alt_starts[static_cast<size_t>(g.rule_alt_begin[ru])]);
    const size_t to = ru + 1 < static_cast<size_t>(g.rule_count())
                          ? static_cast<size_t>(g.alt_starts[static_cast<size_t>(g.rule_alt_begin[ru + 1])])
                          : g.elements.size();
    c->class_of_lazy_[ru] = classes_for(lazy_pos(r), walk_key('L', ru, from, to));
  }
  for (size_t p = 0; p < g.elements.size(); ++p) {
    const auto kind = g.elements[p].kind;
    if ((kind != GrammarElement::kBytes && kind != GrammarElement::kToken) || never_top[p]) continue;
    size_t end = p;
    while (g.elements[end].kind != GrammarElement::kEnd) ++end;
    c->class_of_[p] = classes_for(static_cast<int32_t>(p), walk_key('T', static_cast<size_t>(g.rule_of[p]), p, end));
  }
  // The walks are independent (each its own stacks), so they run on the pool; their
  // costs are uneven (a JSON string's characters walk most of the trie, a literal's
  // first byte a few hundred nodes), hence the dynamic schedule. As XGrammar's compiler
  // does with its max_threads.
  c->classes_.resize(walk_from.size());
  std::mutex failure_mu;
  std::exception_ptr failure;
  parallel_for_dynamic(static_cast<int64_t>(walk_from.size()), [&](int64_t k) {
    try {
      GrammarStacks stacks(g, &c->returns_);
      c->precompute(walk_from[static_cast<size_t>(k)], c->classes_[static_cast<size_t>(k)], stacks);
    } catch (...) {  // (an exception must not leave a parallel region)
      std::lock_guard<std::mutex> lock(failure_mu);
      if (!failure) failure = std::current_exception();
    }
  });
  if (failure) std::rethrow_exception(failure);
  c->compile_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return c;
}

void CompiledGrammar::precompute(int32_t pos, Classes& out, GrammarStacks& stacks) {
  if (pos >= 0 && g_.elements[static_cast<size_t>(pos)].kind == GrammarElement::kToken) {
    out.accepted.push_back(g_.elements[static_cast<size_t>(pos)].value);  // itself, nothing else
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
  stacks.plain_boundary = false;
  std::vector<int32_t> tops{stacks.push(pos, -1)}, next;
  level[0] = {0, 1, stacks.size(), false};
  std::vector<int32_t> accepted;
  std::vector<uint8_t> need;  // beside accepted
  // (token, need) of the accepted tokens of need > 0 with a boundary on the way: below
  // their need, leaving the chain within them may still read them.
  std::vector<std::pair<int32_t, uint8_t>> also_uncertain;
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
    // The tokens ending here: read whole if a stack is alive after them (with the units it
    // took again), or if a path ended its bottom rule with this very byte (whatever lies
    // below then goes on without reading more: every rule has an alternative).
    const bool ends_here = v.node_tokens_begin(i) < v.node_tokens_begin(i + 1);
    if (ends_here) {
      int32_t need_here = stacks.boundary ? stacks.boundary_count : kMaxChainCount + 1;
      for (const int32_t t : next) need_here = std::min(need_here, stacks.count_of(t));
      if (need_here <= kMaxChainCount) {
        const size_t before = accepted.size();
        add_range(accepted, i, i + 1);
        need.resize(accepted.size(), static_cast<uint8_t>(need_here));
        if (need_here > 0 && boundary)
          for (size_t k = before; k < accepted.size(); ++k)
            also_uncertain.emplace_back(accepted[k], static_cast<uint8_t>(need_here));
      }
      // One that ended the grammar (a path whose count is not kept), or that no path read
      // but one reached the bottom on the way, is checked at run time.
      if (stacks.end || (need_here > kMaxChainCount && boundary)) add_range(out.uncertain, i, i + 1);
    }
    if (next.empty()) {  // nothing reads further: longer tokens hang on the stack below, if anything
      const auto skip = static_cast<size_t>(v.node_skip(i));
      if (boundary) add_range(out.uncertain, i + 1, skip);
      i = skip;
      continue;
    }
    const size_t b = tops.size();
    tops.insert(tops.end(), next.begin(), next.end());
    level[d] = {b, tops.size(), stacks.size(), boundary};
    ++i;
  }
  stacks.clear();
  uint8_t max_need = 0;
  for (const uint8_t n_ : need) max_need = std::max(max_need, n_);
  if (max_need > 0) {
    // Counted: the chain whose unit the walk took again. Which one it is follows from P's
    // rule (grammar_returns), the same for every path.
    out.chain_unit = c_unit_of(pos);
    out.exits_only_by_chain = !stacks.plain_boundary;
    // (also_uncertain is in byte order: the walk visits tokens in that order.)
    out.uncertain_over_need.resize(max_need);
    out.over_need.assign(static_cast<size_t>(v.size()), 0);
    for (const auto& [t, tn] : also_uncertain) {
      for (size_t j = 0; j < tn; ++j) out.uncertain_over_need[j].push_back(t);
      out.over_need[static_cast<size_t>(t)] = tn;
    }
    for (const int32_t t : out.uncertain) out.over_need[static_cast<size_t>(t)] = kAlwaysUncertain;
  }
  if (accepted.size() > kBitsAbove) {
    out.accepted_bits.assign(static_cast<size_t>(max_need) + 1, std::vector<uint64_t>(v.mask_words(), 0));
    for (size_t k = 0; k < accepted.size(); ++k) set_bit(out.accepted_bits[need[k]].data(), accepted[k]);
    for (size_t j = 1; j <= max_need; ++j)  // cumulative: need <= j
      for (size_t w = 0; w < v.mask_words(); ++w) out.accepted_bits[j][w] |= out.accepted_bits[j - 1][w];
  } else {
    out.accepted = std::move(accepted);
    if (max_need > 0) out.need = std::move(need);
  }
}

// The unit rule of the chain a stack starting at `pos` enters when its bottom rule ends:
// follow the bottom's unique returns to the first rule that returns into a chain.
int32_t CompiledGrammar::c_unit_of(int32_t pos) const {
  for (int guard = 0; guard < 1 << 20; ++guard) {
    const auto rule = static_cast<size_t>(pos < 0 ? lazy_rule_of(pos) : g_.rule_of[static_cast<size_t>(pos)]);
    if (returns_.unique[rule] >= 0) {
      pos = returns_.unique[rule];
      continue;
    }
    return returns_.chain_unit[rule];
  }
  return -1;
}

size_t CompiledGrammar::memory_bytes() const {
  size_t b = 0;
  for (const Classes& c : classes_) {
    b += (c.accepted.size() + c.uncertain.size()) * sizeof(int32_t) + c.need.size();
    for (const auto& list : c.uncertain_over_need) b += list.size() * sizeof(int32_t);
    b += c.over_need.size();
    for (const auto& bits : c.accepted_bits) b += bits.size() * sizeof(uint64_t);
  }
  return b + g_.elements.size() * sizeof(GrammarElement);
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
    if (get_bit(mask, id)) {  // allowed already (outright, or by an earlier list)
      ++i;
      continue;
    }
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

int32_t GrammarMatcher::chain_frame_of(int32_t t, int32_t unit) const {
  const Grammar& g = g_->grammar();
  for (int32_t x = stacks_.node(t).parent; x >= 0; x = stacks_.node(x).parent)
    if (g.chain_unit[static_cast<size_t>(stacks_.node(x).pos)] == unit) return x;
  return -1;
}

int32_t GrammarMatcher::chain_level_of(int32_t t, int32_t unit) const {
  const int32_t x = chain_frame_of(t, unit);
  // (-1 is not reached: a counted terminal is always inside its chain's unit)
  return x < 0 ? 0 : g_->grammar().chain_level[static_cast<size_t>(stacks_.node(x).pos)];
}

bool GrammarMatcher::exit_bytes(int32_t frame, bool* bytes) {
  // Leaving the chain: its rules reach the place by tail calls, so what follows is where
  // the chain place's own frame returns to.
  const Grammar& g = g_->grammar();
  const int32_t below = stacks_.node(frame).parent;
  if (below < 0) return true;  // the chain ends the grammar: no byte follows
  const size_t mark = stacks_.size();
  next_.clear();
  stacks_.reset_flags();
  stacks_.settle(stacks_.node(below).pos, stacks_.node(below).parent, next_);
  int count = 0;
  for (const int32_t t : next_) {
    const int32_t pos = stacks_.node(t).pos;
    auto add_set = [&](const ByteSet& s) {
      for (int b = 0; b < 256; ++b)
        if (s.has(static_cast<uint8_t>(b)) && !bytes[b]) bytes[b] = true, ++count;
    };
    if (pos < 0) {
      const auto r = static_cast<size_t>(lazy_rule_of(pos));
      for (int32_t k = g.rule_alt_begin[r]; k < g.rule_alt_begin[r + 1]; ++k)
        add_set(g.byte_sets[static_cast<size_t>(g.elements[static_cast<size_t>(g.alt_starts[static_cast<size_t>(k)])].value)]);
    } else if (g.elements[static_cast<size_t>(pos)].kind == GrammarElement::kBytes) {
      add_set(g.byte_sets[static_cast<size_t>(g.elements[static_cast<size_t>(pos)].value)]);
    } else {
      count = 1000;  // a token element: text cannot tell
    }
  }
  stacks_.truncate(mark);
  return count <= 8;
}

int64_t GrammarMatcher::count(const uint64_t* mask, size_t words) {
  int64_t n = 0;
  for (size_t w = 0; w < words; ++w) n += __builtin_popcountll(mask[w]);
  return n;
}

bool GrammarMatcher::fill_mask(uint64_t* mask) {
  const TokenVocabulary& v = g_->vocab();
  const size_t words = v.mask_words();
  std::fill(mask, mask + words, 0);
  if (!ended_) {
    // The distinct (position, chain level) of the tops: usually one to a handful.
    keys_.clear();
    for (const int32_t t : tops_) {
      const int32_t pos = stacks_.node(t).pos;
      const CompiledGrammar::Classes* c = g_->classes(pos);
      keys_.push_back({pos, c != nullptr && c->chain_unit >= 0 ? chain_level_of(t, c->chain_unit) : 0, t});
    }
    std::sort(keys_.begin(), keys_.end());
    uncertain_lists_.clear();
    size_t exit_lists = 0;
    // (uncertain_lists_ points into exit_lists_: it must not grow while they are in use)
    if (exit_lists_.size() < keys_.size()) exit_lists_.resize(keys_.size());
    int32_t last_pos = -1;
    for (size_t i = 0; i < keys_.size();) {
      const int32_t pos = keys_[i].pos, level = keys_[i].level;
      size_t group_end = i;
      while (group_end < keys_.size() && keys_[group_end].pos == pos && keys_[group_end].level == level) ++group_end;
      const size_t group = i;
      i = group_end;
      const CompiledGrammar::Classes* c = g_->classes(pos);
      if (c == nullptr) continue;
      if (c->need.empty()) {
        for (const int32_t t : c->accepted) set_bit(mask, t);
      } else {
        for (size_t k = 0; k < c->accepted.size(); ++k)
          if (c->need[k] <= level) set_bit(mask, c->accepted[k]);
      }
      if (!c->accepted_bits.empty()) {
        const auto j = static_cast<size_t>(std::min<int64_t>(level, static_cast<int64_t>(c->accepted_bits.size()) - 1));
        const uint64_t* bits = c->accepted_bits[j].data();
        for (size_t w = 0; w < words; ++w) mask[w] |= bits[w];
      }
      // Each list is in byte order, so that tokens sharing a prefix share its steps.
      bool few = false;
      bool follow[256] = {};
      if (c->chain_unit >= 0 && c->exits_only_by_chain) {
        // Inside a repetition's unit, a token the chain does not read whole (one longer
        // than the chain allows here, or one that meets a byte the unit cannot read) is
        // read only by leaving the chain within it, so it holds a byte that may follow
        // the chain. When those bytes are few (a JSON string's closing quote), only the
        // tokens holding one are checked.
        few = true;
        for (size_t k = group; k < group_end && few; ++k) {
          const int32_t frame = chain_frame_of(keys_[k].top, c->chain_unit);
          few = frame >= 0 && exit_bytes(frame, follow);
        }
      }
      if (!few) {
        if (pos != last_pos && !c->uncertain.empty()) uncertain_lists_.push_back(&c->uncertain);
        if (level < static_cast<int64_t>(c->uncertain_over_need.size()))
          uncertain_lists_.push_back(&c->uncertain_over_need[static_cast<size_t>(level)]);
      } else {
        {
          std::vector<int32_t>& list = exit_lists_[exit_lists++];
          list.clear();
          for (int b = 0; b < 256; ++b) {
            if (!follow[b]) continue;
            for (const int32_t t : v.tokens_with_later_byte(static_cast<uint8_t>(b)))
              if (const uint8_t on = c->over_need[static_cast<size_t>(t)];
                  on == CompiledGrammar::kAlwaysUncertain || on > level)
                list.push_back(t);
          }
          std::sort(list.begin(), list.end(), [&](int32_t a, int32_t b) { return v.rank(a) < v.rank(b); });
          list.erase(std::unique(list.begin(), list.end()), list.end());
          uncertain_lists_.push_back(&list);
        }
      }
      last_pos = pos;
    }
    // (after every accepted set: a token some top accepts outright is not checked)
    for (const std::vector<int32_t>* list : uncertain_lists_) check_uncertain(*list, mask);
    if (can_end_)
      for (const int32_t e : v.end_ids())
        if (e >= 0 && e < v.size()) set_bit(mask, e);
  }
  uint64_t any = 0;
  for (size_t w = 0; w < words; ++w) any |= mask[w];
  return any != 0;
}

bool GrammarMatcher::accept(int32_t token) {
  const TokenVocabulary& v = g_->vocab();
  if (ended_ || token < 0 || token >= v.size()) return false;
  const auto& ends = v.end_ids();
  const bool is_end = std::find(ends.begin(), ends.end(), token) != ends.end();
  if (is_end && can_end_) {
    ended_ = true;
    return true;
  }
  const size_t mark = stacks_.size();
  const std::string_view bytes = v.bytes(token);
  // Read as a token element (<[id]>) and, when it has text, as its bytes: the union.
  std::vector<int32_t> cur;
  stacks_.reset_flags();
  stacks_.advance_token(tops_.data(), tops_.size(), token, cur);
  bool end = stacks_.end;
  if (!bytes.empty()) {
    std::vector<int32_t> by_bytes = tops_;
    for (const char c : bytes) {
      next_.clear();
      stacks_.reset_flags();
      stacks_.advance_byte(by_bytes.data(), by_bytes.size(), static_cast<uint8_t>(c), next_);
      by_bytes.swap(next_);
      if (by_bytes.empty() && !stacks_.end) break;
    }
    end = end || stacks_.end;
    cur.insert(cur.end(), by_bytes.begin(), by_bytes.end());
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
