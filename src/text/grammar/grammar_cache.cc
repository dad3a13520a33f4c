#include "text/grammar/grammar_cache.h"

#include "base/threads.h"

namespace hyperion::text {

std::shared_ptr<const CompiledGrammar> GrammarCache::get(const std::string& source) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = entries_.find(source);
    if (it != entries_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.at);
      return it->second.grammar;
    }
  }
  // Compiled outside the lock: a slow grammar does not hold up the cached ones.
  auto compiled = CompiledGrammar::compile(parse_gbnf(source), vocab_);
  // The compile ran its walks on this thread's OpenMP team. A server's request threads
  // then each keep one, and libgomp, once its workers outnumber the cores, stops
  // spin-waiting at the engine's barriers (base/threads.h): end it here.
  release_thread_pool();
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = entries_.find(source);
  if (it != entries_.end()) return it->second.grammar;
  lru_.push_front(source);
  entries_[source] = {compiled, lru_.begin()};
  while (entries_.size() > capacity_) {
    entries_.erase(lru_.back());
    lru_.pop_back();
  }
  return compiled;
}

}  // namespace hyperion::text
