// Compiled grammars by their GBNF text, for one vocabulary: a schema that many requests
// send (an agent's tool parameters, an application's response format) is compiled once.
// Thread-safe; least recently used entries go first when `capacity` is reached. A compile
// runs on the calling thread's OpenMP team, which is ended afterwards (a request thread
// of the server is not the engine's compute thread).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "text/grammar/matcher.h"

namespace hyperion::text {

class GrammarCache {
 public:
  explicit GrammarCache(std::shared_ptr<const TokenVocabulary> vocab, size_t capacity = 64)
      : vocab_(std::move(vocab)), capacity_(capacity) {}

  // The compiled grammar of GBNF `source`; throws GrammarError (text/grammar/gbnf.h).
  // Two threads asking for the same new text may both compile it; one result is kept.
  std::shared_ptr<const CompiledGrammar> get(const std::string& source);

  const TokenVocabulary& vocab() const { return *vocab_; }

 private:
  std::shared_ptr<const TokenVocabulary> vocab_;
  size_t capacity_;
  std::mutex mu_;
  std::list<std::string> lru_;  // most recent first
  struct Entry {
    std::shared_ptr<const CompiledGrammar> grammar;
    std::list<std::string>::iterator at;
  };
  std::unordered_map<std::string, Entry> entries_;
};

}  // namespace hyperion::text
