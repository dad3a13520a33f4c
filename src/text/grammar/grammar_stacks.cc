#include "text/grammar/grammar_stacks.h"

#include <algorithm>

namespace hyperion::text {

namespace {
constexpr int32_t kUnset = -3;
int32_t merge_return(int32_t current, int32_t v) {
  if (current == kUnset) return v;
  return current == v ? current : kReturnsAnywhere;
}
}  // namespace

GrammarReturns grammar_returns(const Grammar& g) {
  const auto rules = static_cast<size_t>(g.rule_count());
  std::vector<int32_t> ret(rules, kUnset), unit(rules, kUnset);
  ret[static_cast<size_t>(g.root)] = kReturnsToEnd;
  unit[static_cast<size_t>(g.root)] = -1;  // root may end the grammar
  // Monotone (unset -> one value -> several), so this ends within a few passes.
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t s = 0; s < g.elements.size(); ++s) {
      const GrammarElement& e = g.elements[s];
      if (e.kind != GrammarElement::kRule) continue;
      int32_t v = static_cast<int32_t>(s) + 1, u = g.chain_unit[s + 1];
      if (g.elements[s + 1].kind == GrammarElement::kEnd) {
        // A tail call returns where its caller does.
        v = ret[static_cast<size_t>(g.rule_of[s])];
        u = unit[static_cast<size_t>(g.rule_of[s])];
        if (v == kUnset) continue;
      }
      int32_t& r = ret[static_cast<size_t>(e.value)];
      const int32_t merged = merge_return(r, v);
      if (merged != r) r = merged, changed = true;
      int32_t& cu = unit[static_cast<size_t>(e.value)];
      const int32_t merged_unit = cu == kUnset ? u : cu == u ? cu : -1;
      if (merged_unit != cu) cu = merged_unit, changed = true;
    }
  }
  for (int32_t& r : ret)
    if (r == kUnset) r = kReturnsAnywhere;
  for (int32_t& u : unit)
    if (u == kUnset) u = -1;
  return {std::move(ret), std::move(unit)};
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
      if (returns_ == nullptr) {
        end = true;
        return;
      }
      const auto rule = static_cast<size_t>(g_.rule_of[static_cast<size_t>(pos)]);
      const int32_t q = returns_->unique[rule];
      if (q >= 0) {  // the one place it returns to: go on there, over the same bottom
        pos = q;
        continue;
      }
      if (q == kReturnsToEnd) {
        end = true;
        return;
      }
      boundary = true;  // leaving (or ending at) the place it returns to depends on the stack
      boundary_count = std::min(boundary_count, chain_count(parent));
      const int32_t unit = returns_->chain_unit[rule];
      if (unit < 0) plain_boundary = true;
      const int32_t count = chain_count(parent) + 1;
      if (unit >= 0 && count <= kMaxChainCount) enter(unit, -(2 + count), out);  // the unit again, counted
      return;
    }
    if (e.kind == GrammarElement::kRule) {
      const int32_t ret = pos + 1;
      const int32_t frame =
          g_.elements[static_cast<size_t>(ret)].kind == GrammarElement::kEnd ? parent
                                                                             : push(ret, parent);
      enter(e.value, frame, out);
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

void GrammarStacks::enter(int32_t rule, int32_t frame, std::vector<int32_t>& out) {
  const auto r = static_cast<size_t>(rule);
  if (g_.lazy[r]) {
    check_budget();
    const int32_t pos = lazy_pos(rule);
    for (size_t i = out.size(); i-- > 0;) {
      const StackNode& t = nodes_[static_cast<size_t>(out[i])];
      if (t.pos == pos && t.parent == frame) return;
    }
    if (out.size() >= kMaxTops)
      throw GrammarError("", "the grammar is too ambiguous: more than " + std::to_string(kMaxTops) +
                                 " parses are open at once");
    out.push_back(push(pos, frame));
    return;
  }
  for (int32_t k = g_.rule_alt_begin[r]; k < g_.rule_alt_begin[r + 1]; ++k)
    settle(g_.alt_starts[static_cast<size_t>(k)], frame, out);
}

void GrammarStacks::start(std::vector<int32_t>& out) {
  expansion_ = 0;
  enter(g_.root, -1, out);
}

void GrammarStacks::advance_byte(const int32_t* tops, size_t n, uint8_t byte,
                                 std::vector<int32_t>& out) {
  expansion_ = 0;
  for (size_t i = 0; i < n; ++i) {
    const StackNode t = nodes_[static_cast<size_t>(tops[i])];
    if (t.pos < 0) {  // a lazy rule: the alternatives this byte starts
      const auto at = static_cast<size_t>(g_.lazy_begin[static_cast<size_t>(lazy_rule_of(t.pos))] + byte);
      for (int32_t k = g_.alt_by_byte_begin[at]; k < g_.alt_by_byte_begin[at + 1]; ++k)
        settle(g_.alt_starts[static_cast<size_t>(g_.alt_by_byte[static_cast<size_t>(k)])] + 1, t.parent, out);
      continue;
    }
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
    if (t.pos < 0) continue;  // a lazy rule starts with bytes
    const GrammarElement& e = g_.elements[static_cast<size_t>(t.pos)];
    if (e.kind == GrammarElement::kToken && e.value == token) settle(t.pos + 1, t.parent, out);
  }
}

}  // namespace hyperion::text
