#include "serve/lora_registry.h"

#include "base/error.h"

namespace hyperion::serve {

LoraRegistry::LoraRegistry(int max_loras) : slots_(static_cast<size_t>(std::max(0, max_loras)) + 1) {}

LoraRef LoraRegistry::find(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<LoraRef> LoraRegistry::list() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<LoraRef> out;
  for (const auto& [name, ref] : by_name_) out.push_back(ref);
  return out;
}

int LoraRegistry::free_slot() const {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t s = 1; s < slots_.size(); ++s)
    if (slots_[s].expired()) return static_cast<int>(s);
  return 0;
}

LoraRef LoraRegistry::add(const std::string& name, const std::string& path, int slot, int64_t rank) {
  std::lock_guard<std::mutex> lock(mu_);
  HYP_CHECK(slot >= 1 && slot < static_cast<int>(slots_.size()) && slots_[static_cast<size_t>(slot)].expired(),
            "LoRA registry: slot {} is not free", slot);
  HYP_USAGE_CHECK(by_name_.count(name) == 0, "the LoRA adapter '{}' is already loaded", name);
  auto h = std::make_shared<LoraHandle>();
  h->name = name;
  h->path = path;
  h->slot = slot;
  h->rank = rank;
  // Distinct per load; odd, so never 0 (the base's root).
  h->cache_root = (++loads_ * 0x9e3779b97f4a7c15ull) | 1;
  slots_[static_cast<size_t>(slot)] = h;
  by_name_.emplace(name, h);
  return h;
}

bool LoraRegistry::remove(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  return by_name_.erase(name) > 0;
}

}  // namespace hyperion::serve
