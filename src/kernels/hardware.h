// MaxText's `hardware` key: the device a run places its model on (cpu or gpu), and the
// check that it can, made before any work starts so a run fails at once with the reason.
#pragma once

#include <cstdint>
#include <string_view>

#include "base/allocator.h"

namespace hyperion {

// "cpu" -> kHost, "gpu" -> kCuda; anything else throws naming `what` (e.g. "config key
// hardware") and the accepted values.
Device parse_hardware(std::string_view value, std::string_view what);
const char* hardware_name(Device device);  // "cpu", "gpu"

// What a run does on the device: training is wired to the device backend; serving
// (the engine's paged KV pool and batched decode) is not yet.
enum class HardwareUse : uint8_t { kTraining, kServing };

// Throws a hyperion::Error naming `what` unless a run of kind `use` can place its model
// on `device` in this process: a GPU needs a kernel backend for it (the CUDA backend with
// a usable device; tests register a simulated one) and a wired `use`.
void require_hardware(Device device, std::string_view what, HardwareUse use);

}  // namespace hyperion
