#include "text/grammar/grammar_stacks.h"

namespace hyperion::text {

namespace {
constexpr int32_t kUnset = -3;
int32_t merge_return(int32_t current, int32_t v) {
  if (current == kUnset) return v;
  return current == v ? current : kReturnsAnywhere;
}
}  // namespace

std::vector<int32_t> unique_returns(const Grammar& g) {
  std::vector<int32_t> ret(static_cast<size_t>(g.rule_count()), kUnset);
  ret[static_cast<size_t>(g.root)] = kReturnsToEnd;
  // Monotone (unset -> one position -> anywhere), so this ends within a few passes.
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t s = 0; s < g.elements.size(); ++s) {
      const GrammarElement& e = g.elements[s];
      if (e.kind != GrammarElement::kRule) continue;
      int32_t v = static_cast<int32_t>(s) + 1;
      if (g.elements[s + 1].kind == GrammarElement::kEnd) {
        v = ret[static_cast<size_t>(g.rule_of[s])];  // a tail call returns where its caller does
        if (v == kUnset) continue;
      }
      int32_t& r = ret[static_cast<size_t>(e.value)];
      const int32_t merged = merge_return(r, v);
      if (merged != r) r = merged, changed = true;
    }
  }
  for (int32_t& r : ret)
    if (r == kUnset) r = kReturnsAnywhere;
  return ret;
}

int32_t GrammarStacks::push(int32_t pos, int32_t parent) {
  nodes_.push_back({pos, parent});
  return static_cast<int32_t>(nodes_.size() - 1);
}

void GrammarStacks::check_budget() {
  if (++expansion_ > kMaxExpansion)
    throw GrammarError("", "the grammar is too ambiguous: one step expands more than " +
                               std::to_string(kMaxExpansion) + " rule references");
}

void GrammarStacks::settle(int32_t pos, int32_t parent, std::vector<int32_t>& out) {
  for (;;) {
    check_budget();
    const GrammarElement& e = g_.elements[static_cast<size_t>(pos)];
    if (e.kind == GrammarElement::kEnd) {
      if (parent >= 0) {
        const StackNode n = nodes_[static_cast<size_t>(parent)];
        pos = n.pos, parent = n.parent;
        continue;
      }
      if (unique_return_ == nullptr) {
        end = true;
        return;
      }
      const int32_t q = unique_return_[g_.rule_of[static_cast<size_t>(pos)]];
      if (q >= 0) {
        pos = q;
        continue;
      }
      if (q == kReturnsToEnd)
        end = true;
      else
        boundary = true;
      return;
    }
    if (e.kind == GrammarElement::kRule) {
      const int32_t ret = pos + 1;
      const int32_t frame =
          g_.elements[static_cast<size_t>(ret)].kind == GrammarElement::kEnd ? parent
                                                                             : push(ret, parent);
      const size_t rule = static_cast<size_t>(e.value);
      for (int32_t k = g_.rule_alt_begin[rule]; k < g_.rule_alt_begin[rule + 1]; ++k)
        settle(g_.alt_starts[static_cast<size_t>(k)], frame, out);
      return;
    }
    // A terminal: a top, unless the same (pos, parent) is one already.
    for (size_t i = out.size(); i-- > 0;) {
      const StackNode& t = nodes_[static_cast<size_t>(out[i])];
      if (t.pos == pos && t.parent == parent) return;
    }
    if (out.size() >= kMaxTops)
      throw GrammarError("", "the grammar is too ambiguous: more than " +
                                 std::to_string(kMaxTops) + " parses are open at once");
    out.push_back(push(pos, parent));
    return;
  }
}

void GrammarStacks::start(std::vector<int32_t>& out) {
  expansion_ = 0;
  const size_t rule = static_cast<size_t>(g_.root);
  for (int32_t k = g_.rule_alt_begin[rule]; k < g_.rule_alt_begin[rule + 1]; ++k)
    settle(g_.alt_starts[static_cast<size_t>(k)], -1, out);
}

void GrammarStacks::advance_byte(const int32_t* tops, size_t n, uint8_t byte,
                                 std::vector<int32_t>& out) {
  expansion_ = 0;
  for (size_t i = 0; i < n; ++i) {
    const StackNode t = nodes_[static_cast<size_t>(tops[i])];
    const GrammarElement& e = g_.elements[static_cast<size_t>(t.pos)];
    if (e.kind == GrammarElement::kBytes && g_.byte_sets[static_cast<size_t>(e.value)].has(byte))
      settle(t.pos + 1, t.parent, out);
  }
}

void GrammarStacks::advance_token(const int32_t* tops, size_t n, int32_t token,
                                  std::vector<int32_t>& out) {
  expansion_ = 0;
  for (size_t i = 0; i < n; ++i) {
    const StackNode t = nodes_[static_cast<size_t>(tops[i])];
    const GrammarElement& e = g_.elements[static_cast<size_t>(t.pos)];
    if (e.kind == GrammarElement::kToken && e.value == token) settle(t.pos + 1, t.parent, out);
  }
}

}  // namespace hyperion::text
