// libFuzzer: the token shard reader (header, token width, vocabulary bound, size) and
// reads of every token it accepts.
#include <cstdint>
#include <vector>

#include "base/error.h"
#include "fuzz_util.h"
#include "io/token_shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hyperion;
  fuzz::MemoryFile file(data, size);
  try {
    const io::TokenShard shard = io::TokenShard::open(file.path());
    if (shard.size() > static_cast<int64_t>(size)) __builtin_trap();  // tokens come from bytes
    std::vector<int32_t> tokens(static_cast<size_t>(shard.size()));
    shard.read(0, shard.size(), tokens.data());
    for (const int32_t t : tokens)
      if (t < 0 || t >= shard.vocab_size()) __builtin_trap();  // validated on open
    try {
      shard.read(shard.size(), 1, tokens.data());  // past the end: an error, not a read
      __builtin_trap();
    } catch (const Error&) {
    }
  } catch (const Error&) {
  }
  return 0;
}
