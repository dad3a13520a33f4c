// How much memory this machine (or this container's cgroup) gives the process, and the
// up-front check every large allocation makes against it: a model, KV cache or training
// run that cannot fit fails at once with an error naming what needs the bytes and the
// config keys that size it, instead of in the allocator or the OOM killer.
#pragma once

#include <cstdint>
#include <string>

namespace hyperion {

// Physical memory, or the cgroup's memory limit (v2 memory.max, v1
// memory.limit_in_bytes) when that is lower. HYPERION_MEMORY_LIMIT (bytes, or with a
// K/M/G/T suffix) overrides both, for tests and for sharing a machine.
int64_t machine_memory_bytes();

// "12.3 GiB" / "512.0 MiB" / "4.0 KiB".
std::string format_bytes(int64_t bytes);

// Throws hyperion::Error when `bytes` exceed machine_memory_bytes(): "`what` needs
// 26.1 GiB but this machine has 23.4 GiB; `hint`".
void check_fits_in_memory(int64_t bytes, const std::string& what, const std::string& hint);

}  // namespace hyperion
