// The LoRA adapters a server has loaded, by name (vLLM's multi-LoRA serving): what a
// request's `model` field resolves to, what /v1/models lists, and which of the engine's
// adapter slots (model/lora_bank.h) each one occupies.
//
// A request holds its adapter's handle (a shared pointer) from the moment its name is
// resolved until the request is destroyed, so unloading an adapter only removes its name:
// requests already holding it finish with it, and its slot is reused only once the last
// of them is gone (the registry keeps weak pointers per slot). A fresh load gets a fresh
// prefix-cache root, so no request ever reuses KV computed under another adapter, even one
// that had the same slot or name before.
//
// Thread-safe: HTTP threads resolve and list while the engine thread adds and removes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace hyperion::serve {

struct LoraHandle {
  std::string name;
  std::string path;  // where it was loaded from (for /v1/models)
  int slot = 0;      // 1..max_loras in the engine's bank
  int64_t rank = 0;
  uint64_t cache_root = 0;  // prefix-cache root of its sequences (never 0)
};
using LoraRef = std::shared_ptr<const LoraHandle>;

class LoraRegistry {
 public:
  explicit LoraRegistry(int max_loras);

  // The loaded adapter called `name`, or null.
  LoraRef find(const std::string& name) const;
  // Every loaded adapter, by name.
  std::vector<LoraRef> list() const;
  // A slot no loaded adapter and no request holds, or 0 when every one is taken.
  int free_slot() const;
  // Registers `name` in `slot` (from free_slot). Throws when the name is taken.
  LoraRef add(const std::string& name, const std::string& path, int slot, int64_t rank);
  // Forgets `name` (requests holding it keep it); false when it is not loaded.
  bool remove(const std::string& name);

 private:
  mutable std::mutex mu_;
  std::map<std::string, LoraRef> by_name_;
  std::vector<std::weak_ptr<const LoraHandle>> slots_;  // [0] unused: no adapter
  uint64_t loads_ = 0;
};

}  // namespace hyperion::serve
