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
  // Resolves <text> tokens through the vocabulary (a GrammarError names one that is not a
  // single token) and precomputes every terminal's token classes.
  static std::shared_ptr<const CompiledGrammar> compile(Grammar grammar,
                                                        std::shared_ptr<const TokenVocabulary> vocab);

  const Grammar& grammar() const { return g_; }
  const TokenVocabulary& vocab() const { return *vocab_; }
  const std::vector<int32_t>& unique_return() const { return unique_return_; }
  double compile_seconds() const { return compile_seconds_; }
  size_t memory_bytes() const;  // the precomputed classes
  // Totals over the terminals (for benchmarks and tests).
  size_t accepted_total() const, uncertain_total() const;

  struct Classes {
    std::vector<int32_t> accepted;     // token ids, when few
    std::vector<uint64_t> accepted_bits;  // a vocabulary mask, when many
    std::vector<int32_t> uncertain;    // token ids in byte order
  };
  // The classes of terminal element `pos` (null for an element that is not a terminal).
  const Classes* classes(int32_t pos) const {
    const int32_t k = class_of_[static_cast<size_t>(pos)];
    return k < 0 ? nullptr : &classes_[static_cast<size_t>(k)];
  }

 private:
  CompiledGrammar() = default;
  void precompute(int32_t pos, Classes& out, GrammarStacks& stacks);

  Grammar g_;
  std::shared_ptr<const TokenVocabulary> vocab_;
  std::vector<int32_t> unique_return_;
  std::vector<int32_t> class_of_;  // element -> index into classes_, -1 for non-terminals
  std::vector<Classes> classes_;
  double compile_seconds_ = 0.0;
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Sets bit t of mask[vocab().mask_words()] for every token allowed next (end tokens
  // where the grammar may end) and clears the others. Returns how many are set.
  int64_t fill_mask(uint64_t* mask);
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

  std::shared_ptr<const CompiledGrammar> g_;
  GrammarStacks stacks_;
  std::vector<int32_t> tops_;
  bool can_end_ = false, ended_ = false;
  // Scratch for fill_mask and accept.
  std::vector<int32_t> next_, merged_, level_tops_;
  std::vector<size_t> level_begin_, level_end_, level_mark_;
};

}  // namespace hyperion::text
