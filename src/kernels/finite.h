// Finding non-finite values (NaN, +-Inf) in a tensor: loading a checkpoint or exporting
// one refuses weights that would silently turn every output into NaN.
//
// x: any shape, contiguous, f32 or bf16. The scan runs in fixed chunks over the thread
// pool; the result (the lowest offending index) does not depend on the thread count.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace hyperion {

// Index (in element order) of the first NaN or infinity in x, or -1 when every element
// is finite.
int64_t first_nonfinite(const TensorView& x);

namespace ref {
int64_t first_nonfinite(const TensorView& x);
}  // namespace ref

}  // namespace hyperion
