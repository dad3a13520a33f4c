// The CUDA backend's entry points for the rest of the kernels layer: whether this binary
// has it, whether a device is usable, and the backend itself. The kernel registry
// (kernels/host_backend.cc) adds it when a device is there; `hyperion info` prints the
// status line; a `hardware=gpu` run that cannot have it fails with that line.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/backend.h"

namespace hyperion {

struct CudaStatus {
  bool built = false;          // this binary has the CUDA backend (-DHYPERION_CUDA)
  bool available = false;      // ...and device 0 and cuBLASLt are usable
  std::string summary;         // one line: the device, or why there is none
  std::string device;          // "NVIDIA H100 80GB HBM3" (available only)
  int compute_capability = 0;  // 90 for sm_90
  int64_t memory_bytes = 0;
  std::string cuda_version;  // toolkit the backend was built with ("13.0.88")
  std::string archs;         // compiled architectures ("80;90")
};

// Probed once (the first call), thread-safe.
const CudaStatus& cuda_status();
// The backend when cuda_status().available, else nullptr.
KernelBackend* cuda_backend();
// With HYPERION_CUDA_OP_TIMES set (kernels/cuda/op_profiler.h): forgets the op times
// gathered so far, so that the table covers what follows (a benchmark's timed steps, not
// its set-up). A no-op otherwise.
void cuda_op_profile_restart();

}  // namespace hyperion
