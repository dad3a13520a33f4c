#include "kernels/hardware.h"

#include "base/error.h"
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
  const CudaStatus& s = cuda_status();
  HYP_CHECK(s.available, "{}=gpu: no usable GPU in this process: cuda {}", what, s.summary);
  // The kernels pass through the backend, but the trainer's optimizer state, the data
  // path, checkpoints and the serving engine's cache are still host memory: refuse
  // rather than hand device pointers to host code.
  fail(
      "{}=gpu: {} and the CUDA kernels are usable, but training and decoding are not wired "
      "to the GPU yet (the optimizer state, batches, checkpoints and the serving cache are "
      "host memory); see docs/GPU.md",
      what, s.device);
}

}  // namespace hyperion
