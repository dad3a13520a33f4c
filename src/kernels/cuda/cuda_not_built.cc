// The CUDA backend's entry points in a build without CUDA (-DHYPERION_CUDA=OFF, or no
// toolkit found by AUTO): never available, and the status says how to get it.
#include "kernels/cuda/cuda_backend.h"

namespace hyperion {

const CudaStatus& cuda_status() {
  static const CudaStatus status = [] {
    CudaStatus s;
    s.summary =
        "not built (this binary was configured without CUDA: install the CUDA toolkit and "
        "configure with -DHYPERION_CUDA=ON or AUTO)";
    return s;
  }();
  return status;
}

KernelBackend* cuda_backend() {
  return nullptr;
}

void cuda_op_profile_restart() {}

}  // namespace hyperion
