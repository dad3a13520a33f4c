// Constrained decoding: which tokens a grammar allows next, as a bit mask over the model's
// vocabulary, in microseconds per step.
//
// CompiledGrammar (once per grammar and vocabulary; immutable, shared by requests): for
// every terminal element P of the grammar, the vocabulary is walked through the byte trie
// from a stack that holds P alone (text/grammar/grammar_stacks.h: a rule that ends there
// returns to its one possible caller when it has one), and each token is classified:
//   accepted   some path reads all its bytes without needing the stack below P: allowed
//              whenever P is a top, whatever lies below (XGrammar's context-independent
//              tokens);
//   uncertain  no path reads it whole inside P's context, but one ended P's rule with an
//              unknown caller below: it depends on the stack;
//   rejected   every path fails: never allowed at P.
// A JSON string's characters are one rule called from the string rule only, so inside a
// string almost every token is accepted outright; tokens that close the string and go on
// (`",`) are the uncertain ones.
//
// GrammarMatcher (one per request): the live stacks. fill_mask ORs the accepted tokens of
// every top's position, then checks only the uncertain ones against the real stacks,
// sorted by bytes so that tokens sharing a prefix share its steps, and skipping every
// token under a prefix found dead. End tokens are allowed where the grammar may end.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "text/grammar/gbnf.h"
#include "text/grammar/grammar_stacks.h"
#include "text/grammar/token_vocabulary.h"

namespace hyperion::text {

class CompiledGrammar {
 public:
  static constexpr uint8_t kAlwaysUncertain = 255;
  // Resolves <text> tokens through the vocabulary (a GrammarError names one that is not a
  // single token) and precomputes every terminal's token classes.
  static std::shared_ptr<const CompiledGrammar> compile(Grammar grammar,
                                                        std::shared_ptr<const TokenVocabulary> vocab);

  const Grammar& grammar() const { return g_; }
  const TokenVocabulary& vocab() const { return *vocab_; }
  const GrammarReturns& returns() const { return returns_; }
  double compile_seconds() const { return compile_seconds_; }
  size_t memory_bytes() const;  // the precomputed classes
  // Uncertain tokens over all terminals (for benchmarks).
  size_t uncertain_total() const;

  // A terminal inside the unit of a repetition chain (a JSON string's character in
  // char{0,40}) reads most tokens by taking the unit again, as often as the token has
  // characters less one; whether the chain still allows that many is known only at run
  // time, from the level of the chain place below (Grammar::chain_level). Such a
  // terminal's accepted tokens carry that count ("need"): a token is accepted where the
  // level is at least its need.
  struct Classes {
    std::vector<int32_t> accepted;  // token ids, when few
    std::vector<uint8_t> need;      // beside `accepted` when chain_unit >= 0
    // When many: vocabulary masks, [j] holding the tokens of need <= j (one mask when
    // chain_unit < 0).
    std::vector<std::vector<uint64_t>> accepted_bits;
    std::vector<int32_t> uncertain;  // token ids in byte order
    // [j]: the accepted tokens of need > j that may also be read by leaving the chain
    // (which depends on the stack), in byte order: checked at run time at level j.
    std::vector<std::vector<int32_t>> uncertain_over_need;
    // The same by token: its need when it is in those lists, kAlwaysUncertain for the
    // tokens of `uncertain`, else 0 (vocabulary-sized; counted terminals only).
    std::vector<uint8_t> over_need;
    int32_t chain_unit = -1;         // the chain's unit rule, when needs are counted
    // Every boundary of the walk was a way out of that chain (no rule inside the unit
    // returns elsewhere), so a token read only by leaving the chain holds a byte that may
    // follow it: fill_mask may check only those.
    bool exits_only_by_chain = false;
  };
  // The classes of terminal element `pos`, or of a lazy rule's top (pos < 0); null for
  // an element that is never a top.
  const Classes* classes(int32_t pos) const {
    const int32_t k = pos < 0 ? class_of_lazy_[static_cast<size_t>(lazy_rule_of(pos))]
                              : class_of_[static_cast<size_t>(pos)];
    return k < 0 ? nullptr : &classes_[static_cast<size_t>(k)];
  }

 private:
  CompiledGrammar() = default;
  void precompute(int32_t pos, Classes& out, GrammarStacks& stacks);
  int32_t c_unit_of(int32_t pos) const;

  Grammar g_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  GrammarReturns returns_;
  std::vector<int32_t> class_of_;  // element -> index into classes_, -1 for non-terminals
  std::vector<int32_t> class_of_lazy_;  // rule -> index into classes_, -1 unless lazy
  std::vector<Classes> classes_;
  double compile_seconds_ = 0.0;
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Sets bit t of mask[vocab().mask_words()] for every token allowed next (end tokens
  // where the grammar may end) and clears the others. Returns whether any is set.
  bool fill_mask(uint64_t* mask);
  // How many bits of a mask are set.
  static int64_t count(const uint64_t* mask, size_t words);
  // Takes `token` (false, with nothing changed, when the grammar does not allow it).
  bool accept(int32_t token);
  // The text read so far is a whole sentence of the grammar.
  bool can_end() const { return can_end_; }
  // Nothing can follow: the grammar has ended (or an end token was accepted).
  bool finished() const { return tops_.empty() || ended_; }
  const CompiledGrammar& compiled() const { return *g_; }

  // Sets logits[t] = -inf wherever the mask's bit t is clear (t < vocab).
  static void apply_mask(const uint64_t* mask, float* logits, int64_t vocab);

 private:
  void compact();
  // The uncertain tokens in `list` (byte order) that the live stacks accept, set in mask.
  void check_uncertain(const std::vector<int32_t>& list, uint64_t* mask);
  // The chain place (a node) of unit `unit` below top `t`, -1 if none; and its level:
  // the units the chain still allows.
  int32_t chain_frame_of(int32_t t, int32_t unit) const;
  int32_t chain_level_of(int32_t t, int32_t unit) const;
  // The bytes the text after chain place `frame` may start with once the chain is left
  // (into `bytes`, 256 flags); false when that is more than a few, or unknown.
  bool exit_bytes(int32_t frame, bool* bytes);

  std::shared_ptr<const CompiledGrammar> g_;
  GrammarStacks stacks_;
  std::vector<int32_t> tops_;
  bool can_end_ = false, ended_ = false;
  // Scratch for fill_mask and accept.
  std::vector<int32_t> next_, level_tops_;
  std::vector<const std::vector<int32_t>*> uncertain_lists_;
  struct Key {
    int32_t pos, level, top;
    bool operator<(const Key& o) const {
      return pos != o.pos ? pos < o.pos : level != o.level ? level < o.level : top < o.top;
    }
  };
  std::vector<Key> keys_;  // the tops by (position, chain level)
  std::vector<std::vector<int32_t>> exit_lists_;  // candidates found through exit bytes
  std::vector<size_t> level_begin_, level_end_, level_mark_;
};

}  // namespace hyperion::text
