// A simulated accelerator for tests: a KernelBackend that says it is Device::kCuda, runs
// the host kernels, and keeps its memory unreadable to the host except inside its own ops.
// Every allocation is its own mapping, PROT_NONE between ops; each op (and upload,
// download) opens all of them, runs, and closes them again. Host code that reads or
// writes "device" memory directly, which on a GPU would read garbage or crash, crashes
// here on the spot (SIGSEGV at the offending line), so the model and training code's
// device discipline is checked on machines without a GPU. Results equal the host
// backend's bit for bit (the same kernels).
//
// Registered for Device::kCuda only where no real CUDA backend is usable (the first
// registered backend of a device wins); `simulated_device()` returns it, or nullptr
// when a real GPU took the device.
#pragma once

#include "kernels/backend.h"

namespace hyperion::testing_util {

KernelBackend* simulated_device();

}  // namespace hyperion::testing_util
