// Greedy decoding's pick: the index of each row's largest value. A serving step that
// samples greedily asks the device for these ids alone rather than downloading its rows
// of logits (4 bytes x vocabulary each).
//
// x: f32 [rows, n] contiguous; out: i32 [rows]. Ties go to the lowest index (as the
// sampler's greedy pick, model/sampler.h). A row holding a NaN, or nothing above -inf,
// gives -1, which the caller reports (the sampler refuses such logits too).
#pragma once

#include "tensor/tensor.h"

namespace hyperion {

void argmax_rows(const TensorView& x, const TensorView& out);

namespace ref {
void argmax_rows(const TensorView& x, const TensorView& out);
}  // namespace ref

}  // namespace hyperion
