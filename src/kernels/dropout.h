// Inverted dropout with a counter-based mask: which elements are dropped is a hash of a
// 64-bit key and the element's index, so nothing is stored between the forward and the
// backward (the backward, or a rematerialised forward, passes the same key and gets the
// same mask), every device computes the same mask bit for bit, and a resumed run that
// derives its keys from the step repeats its masks.
//
//   dropout_apply   y = D(x), or y += D(x) with `accumulate`, over the same number of
//                   elements; D(x)[i] = keeps(i) ? x[i] * (1 / (1 - p)) : 0
//
// D is linear and its own adjoint for a fixed mask: the gradient of y = D(x) is
// dx = D(dy) with the same key. x and y are f32 or bf16 (any pair; y may alias x when
// both match and accumulate is off). keeps(i): the hash's top 24 bits >= p * 2^24, so p is
// honoured to 6e-8. An element's index is its offset in x (at most 2^32 elements).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/dropout_hash.h"
#include "tensor/tensor.h"

namespace hyperion {

// A mask's parameters, derived once per call from (p, key).
struct DropoutMask {
  uint32_t k0 = 0, k1 = 0;
  uint32_t threshold = 0;  // drop when hash < threshold (of 2^24)
  float scale = 1.0f;      // 1 / (1 - p)
};

inline DropoutMask dropout_mask(float p, uint64_t key) {
  DropoutMask m;
  m.k0 = static_cast<uint32_t>(key);
  m.k1 = static_cast<uint32_t>(key >> 32);
  m.threshold = static_cast<uint32_t>(std::lround(static_cast<double>(p) * double(1 << 24)));
  m.scale = 1.0f / (1.0f - p);
  return m;
}

inline bool dropout_keeps(const DropoutMask& m, uint32_t i) {
  return dropout_hash(m.k0, m.k1, i) >= m.threshold;
}

// A key for one use of a mask: `base` (a run's seed, step, micro-batch ...) mixed with
// `salt` (which matrix), so that masks of different uses are independent.
uint64_t dropout_key(uint64_t base, uint64_t salt);

// Throws naming `op` unless x and y are contiguous f32 or bf16 of one size (at most 2^32
// elements), p is in [0, 1) and y aliases x only as dropout_apply allows (every backend's
// check).
void check_dropout(const char* op, const TensorView& x, const TensorView& y, float p, bool accumulate);

// p in [0, 1); throws naming the op on bad shapes, dtypes or p.
void dropout_apply(const TensorView& x, const TensorView& y, float p, uint64_t key, bool accumulate);

namespace ref {
void dropout_apply(const TensorView& x, const TensorView& y, float p, uint64_t key, bool accumulate);
}  // namespace ref

}  // namespace hyperion
