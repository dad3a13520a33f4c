#include "kernels/hardware.h"

#include "base/error.h"
#include "base/system_memory.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

namespace hyperion {

Device parse_hardware(std::string_view value, std::string_view what) {
  if (value == "cpu") return Device::kHost;
  if (value == "gpu") return Device::kCuda;
  fail("{} must be cpu or gpu, got '{}'", what, value);
}

const char* hardware_name(Device device) {
  return device == Device::kCuda ? "gpu" : "cpu";
}

void require_hardware(Device device, std::string_view what) {
  if (device == Device::kHost) return;
  // A backend for the device: the CUDA one, or one a test registered.
  bool have = cuda_status().available;
  if (!have)
    for (KernelBackend* b : built_backends()) have = have || b->device() == device;
  HYP_CHECK(have, "{}=gpu: no usable GPU in this process: cuda {}", what, cuda_status().summary);
}

int64_t device_memory_bytes(Device device) {
  if (device != Device::kHost && cuda_status().available) return cuda_status().memory_bytes;
  return machine_memory_bytes();
}

std::string device_memory_name(Device device) {
  if (device != Device::kHost && cuda_status().available)
    return fmt::format("the GPU ({})", cuda_status().device);
  return "this machine";
}

}  // namespace hyperion
