// How much memory this machine (or this container's cgroup) gives the process, and the
// up-front check every large allocation makes against it: a model, KV cache or training
// run that cannot fit fails at once with an error naming what needs the bytes and the
// config keys that size it, instead of in the allocator or the OOM killer.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

namespace hyperion {

// Byte counts computed from user-given sizes (per_device_batch_size=1e12, kv_pages=2e9)
// saturate at INT64_MAX instead of wrapping, so an absurd size fails the memory check
// below rather than wrapping to a small number that passes it. For non-negative operands.
inline constexpr int64_t kSaturatedBytes = std::numeric_limits<int64_t>::max();
inline int64_t sat_mul(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? kSaturatedBytes : r;
}
inline int64_t sat_add(int64_t a, int64_t b) {
  int64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? kSaturatedBytes : r;
}

// Physical memory, or the cgroup's memory limit (v2 memory.max, v1
// memory.limit_in_bytes) when that is lower. HYPERION_MEMORY_LIMIT (bytes, or with a
// K/M/G/T suffix) overrides both, for tests and for sharing a machine.
int64_t machine_memory_bytes();

// Memory that can be committed now without swapping or reclaiming much: the kernel's
// MemAvailable, lowered to what the cgroup's limit leaves beside its current usage, and
// to machine_memory_bytes(). -1 when none of these can be read.
int64_t available_memory_bytes();

// "12.3 GiB" / "512.0 MiB" / "4.0 KiB".
std::string format_bytes(int64_t bytes);

// Throws hyperion::Error when `bytes` exceed machine_memory_bytes(): "`what` needs
// 26.1 GiB but this machine has 23.4 GiB; `hint`". A saturated (or negative, i.e.
// wrapped) count is refused as more than 64 bits can count.
void check_fits_in_memory(int64_t bytes, const std::string& what, const std::string& hint);
// The same against `have` bytes of the memory `where` names ("the GPU (NVIDIA H100)").
void check_fits_in_memory(int64_t bytes, int64_t have, const std::string& where,
                          const std::string& what, const std::string& hint);

}  // namespace hyperion
