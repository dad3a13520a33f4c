// MaxText's `hardware` key: the device a run places its model on (cpu or gpu), and the
// check that it can, made before any work starts so a run fails at once with the reason.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/allocator.h"

namespace hyperion {

// "cpu" -> kHost, "gpu" -> kCuda; anything else throws naming `what` (e.g. "config key
// hardware") and the accepted values.
Device parse_hardware(std::string_view value, std::string_view what);
const char* hardware_name(Device device);  // "cpu", "gpu"

// Throws a hyperion::Error naming `what` unless a run can place its model on `device` in
// this process: a GPU needs a kernel backend for it (the CUDA backend with a usable
// device; tests register a simulated one). Training and serving both run there.
void require_hardware(Device device, std::string_view what);

// The memory a model placed on `device` can use in all, in bytes: the machine's (or its
// cgroup's) for the host, the GPU's for a CUDA device (the machine's for a simulated one).
int64_t device_memory_bytes(Device device);
// "this machine" or the GPU's name, for messages about that memory.
std::string device_memory_name(Device device);

}  // namespace hyperion
