// Elementwise and reduction steps of a plain MLP and of DCNv2's cross layers (the dense
// half of a recommender; GEMMs are kernels/gemm.h), each with a scalar reference:
//   add_to            y += x
//   relu_forward      x = max(x, 0) in place
//   relu_backward     dy *= (y > 0), y the ReLU's output
//   column_sums       db[j] (+)= sum_i dy[i, j]     (a bias gradient)
//   cross_forward     out = x0 * z + x               (DCNv2: x_{l+1} = x0 ⊙ (W x_l + b) + x_l)
//   cross_backward    dz = dout * x0;  dx0 += dout * z   (dx_l = dout, the caller's copy)
//   adagrad_update    s += g * g;  w -= lr * g / (sqrt(s) + eps)   (the dense layers'
//                     optimizer in DLRM-V2; the same rule as the sparse one)
//   bce_with_logits   mean binary cross-entropy of logits against 0/1 labels, and its
//                     gradient: dlogit = scale * (sigmoid(x) - y); numerically stable for
//                     any |x| (log1p(exp(-|x|))).
// All arrays are contiguous f32.
#pragma once

#include <cstdint>

namespace hyperion {

void add_to(float* y, const float* x, int64_t n);
void relu_forward(float* x, int64_t n);
void relu_backward(const float* y, float* dy, int64_t n);
// dy [rows, cols] row-major; db [cols]; accumulate adds to db instead of overwriting.
void column_sums(const float* dy, int64_t rows, int64_t cols, float* db, bool accumulate);
void cross_forward(const float* x0, const float* z, const float* x, float* out, int64_t n);
void cross_backward(const float* dout, const float* x0, const float* z, float* dz, float* dx0,
                    int64_t n);
void adagrad_update(float* w, float* state, const float* g, int64_t n, float lr, float eps);
// Returns the summed loss (not the mean); dlogits may be null (loss only).
double bce_with_logits(const float* logits, const float* labels, int64_t n, float* dlogits,
                       float scale);

namespace ref {
void add_to(float* y, const float* x, int64_t n);
void relu_forward(float* x, int64_t n);
void relu_backward(const float* y, float* dy, int64_t n);
void column_sums(const float* dy, int64_t rows, int64_t cols, float* db, bool accumulate);
void cross_forward(const float* x0, const float* z, const float* x, float* out, int64_t n);
void cross_backward(const float* dout, const float* x0, const float* z, float* dz, float* dx0,
                    int64_t n);
void adagrad_update(float* w, float* state, const float* g, int64_t n, float lr, float eps);
double bce_with_logits(const float* logits, const float* labels, int64_t n, float* dlogits,
                       float scale);
}  // namespace ref

}  // namespace hyperion
