// MaxText's `hardware` key: the device a run places its model on (cpu or gpu), and the
// check that it can, made before any work starts so a run fails at once with the reason.
#pragma once

#include <string_view>

#include "base/allocator.h"

namespace hyperion {

// "cpu" -> kHost, "gpu" -> kCuda; anything else throws naming `what` (e.g. "config key
// hardware") and the accepted values.
Device parse_hardware(std::string_view value, std::string_view what);
const char* hardware_name(Device device);  // "cpu", "gpu"

// Throws a hyperion::Error naming `what` unless a run can place its model on `device` in
// this process (a GPU needs a CUDA build, a device, and the wiring of docs/GPU.md).
void require_hardware(Device device, std::string_view what);

}  // namespace hyperion
