// The pushdown automaton of a lowered Grammar (text/grammar/gbnf.h), byte by byte.
//
// A parse in progress is a set of stacks, each a chain of StackNodes in one arena: the
// top node's `pos` is the terminal element it waits for; every node below is a rule
// reference's return position in the frame that called it. Stacks share their lower
// nodes (a tree), so a step that copies a stack costs one node, not its depth. Advancing
// by a byte keeps the tops whose terminal allows it and "settles" each successor: the end
// of an alternative pops to the return position, a rule reference expands into its
// alternatives (with no frame when the reference is the last element of its run: tail
// calls, so `R ::= x R | ()` never deepens), until every path stops at a terminal or at
// the bottom.
//
// The bottom means one of two things:
//   - the grammar's end (a real parse: `end` is set when a path gets there);
//   - in the matcher's precomputation, a stack that starts at a single terminal, whose
//     callers are unknown: ending a rule there continues at the rule's one possible return
//     position when the grammar has a single one (unique_return), reaches the grammar's
//     end when the rule is root and nothing calls it, and otherwise sets `boundary`: what
//     follows depends on the stack below, which the precomputation does not know.
// The arena only grows; callers take marks and truncate to undo speculative steps.
#pragma once

#include <cstdint>
#include <vector>

#include "text/grammar/gbnf.h"

namespace hyperion::text {

struct StackNode {
  int32_t pos;     // element index (a top of a lazy rule: lazy_pos(rule))
  int32_t parent;  // node id of the frame below, -1 at the bottom
};

// unique_return values besides an element index.
inline constexpr int32_t kReturnsAnywhere = -1;  // several callers: the boundary
inline constexpr int32_t kReturnsToEnd = -2;     // root, called by no rule: the grammar's end

// Where each rule returns, for the precomputation's unknown bottom:
//   unique[r]      the element every way of reaching r returns to, else kReturnsAnywhere
//                  or kReturnsToEnd;
//   chain_unit[r]  when r always returns into a repetition chain of unit rule u (r is u
//                  or a rule u calls last; Grammar::chain_unit), u, else -1: ending r then
//                  either takes the unit again, counted (below), or leaves the chain,
//                  which depends on the stack (the boundary).
struct GrammarReturns {
  std::vector<int32_t> unique, chain_unit;
};
GrammarReturns grammar_returns(const Grammar& g);

// A bottom reached through a chain: node parent values -1 (no unit taken again yet) and
// -(2 + c) for c >= 1 units taken again, at most kMaxChainCount.
inline constexpr int32_t kMaxChainCount = 250;
inline int32_t chain_count(int32_t bottom) { return bottom == -1 ? 0 : -bottom - 2; }

class GrammarStacks {
 public:
  // `returns` null: the bottom is the grammar's end (a real parse).
  explicit GrammarStacks(const Grammar& g, const GrammarReturns* returns = nullptr)
      : g_(g), returns_(returns) {}

  // The tops of a parse that has read nothing (root's alternatives), appended to `out`.
  void start(std::vector<int32_t>& out);
  // The tops of a stack that starts at terminal `pos` over an unknown bottom.
  int32_t push(int32_t pos, int32_t parent);
  // Appends the tops after reading `byte` from tops[0, n).
  void advance_byte(const int32_t* tops, size_t n, uint8_t byte, std::vector<int32_t>& out);
  // The same for a token element (<[id]>) matching token `id`.
  void advance_token(const int32_t* tops, size_t n, int32_t token, std::vector<int32_t>& out);
  // Expands from element `pos` over frame `parent` into tops appended to `out`.
  void settle(int32_t pos, int32_t parent, std::vector<int32_t>& out);
  // The tops of rule `rule` called over frame `frame` (one lazy top for a lazy rule).
  void enter(int32_t rule, int32_t frame, std::vector<int32_t>& out);

  const StackNode& node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  // The units a stack took again through a chain below its bottom (see above).
  int32_t count_of(int32_t id) const {
    while (id >= 0) id = nodes_[static_cast<size_t>(id)].parent;
    return chain_count(id);
  }
  size_t size() const { return nodes_.size(); }
  void truncate(size_t n) { nodes_.resize(n); }
  void clear() { nodes_.clear(); }
  std::vector<StackNode>& nodes() { return nodes_; }

  // Flags of the steps since the last reset_flags().
  bool end = false;       // some path reached the grammar's end
  bool boundary = false;  // some path ended its rule over an unknown bottom
  bool plain_boundary = false;  // ... one not into a chain (not reset by reset_flags)
  int32_t boundary_count = kMaxChainCount + 1;  // the fewest chain units taken again there
  void reset_flags() {
    end = boundary = false;
    boundary_count = kMaxChainCount + 1;
  }

  // A grammar ambiguous enough to hold more stacks than this at once, or to expand more
  // nodes than kMaxExpansion in one step, is refused (GrammarError) rather than letting a
  // step cost unbounded time.
  static constexpr size_t kMaxTops = 4096;
  static constexpr size_t kMaxExpansion = 1 << 20;

 private:
  void check_budget();
  const Grammar& g_;
  const GrammarReturns* returns_;
  std::vector<StackNode> nodes_;
  size_t expansion_ = 0;  // settle steps in the current advance
};

}  // namespace hyperion::text
