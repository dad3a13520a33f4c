// Bench cases: flash attention forward and forward+backward, T = 1024, 8 heads of 64,
// causal. FLOPs count each visible (query, key) pair once: forward 2 products
// (4 * D per pair), backward 5 products (10 * D per pair).
#include "cases/bench_registry.h"
#include "kernels/attention.h"

namespace hyperion::bench {

std::vector<KernelBench> attention_benches() {
  std::vector<KernelBench> v;
  const int64_t b = 1, t = 1024, h = 8, d = 64;
  const double pairs = double(attention_visible_pairs(t, t, true)) * b * h;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::string tag(dtype_name(dt));
    const Bound bound = dt == DType::kF32 ? Bound::kF32 : Bound::kBF16;
    auto make = [=](bool backward) {
      return [=] {
        auto q = random_tensor(dt, {b, t, h, d}, 1), k = random_tensor(dt, {b, t, h, d}, 2);
        auto vv = random_tensor(dt, {b, t, h, d}, 3), dout = random_tensor(dt, {b, t, h, d}, 4);
        auto out = std::make_shared<Tensor>(dt, Shape{b, t, h, d});
        auto lse = std::make_shared<Tensor>(DType::kF32, Shape{b, h, t});
        auto dq = std::make_shared<Tensor>(dt, Shape{b, t, h, d});
        auto dk = std::make_shared<Tensor>(dt, Shape{b, t, h, d});
        auto dv = std::make_shared<Tensor>(dt, Shape{b, t, h, d});
        return make_state([=] {
          attention_forward(*q, *k, *vv, *out, *lse);
          if (backward) attention_backward(*q, *k, *vv, *out, *dout, *lse, *dq, *dk, *dv);
        });
      };
    };
    v.push_back({"attention_fwd_" + tag + "_T1024_H8_D64", bound, 4.0 * d * pairs, 0, make(false)});
    v.push_back(
        {"attention_fwd_bwd_" + tag + "_T1024_H8_D64", bound, 14.0 * d * pairs, 0, make(true)});
  }
  return v;
}

}  // namespace hyperion::bench
