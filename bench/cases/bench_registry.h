// The kernel benchmark cases behind `hyperion bench kernels`. Each case allocates its
// inputs once (setup) and then times run(); flops or bytes give the achieved rate.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace hyperion::bench {

enum class Bound { kF32, kBF16, kInt8, kMemory };
inline const char* bound_name(Bound b) {
  switch (b) {
    case Bound::kF32:
      return "f32";
    case Bound::kBF16:
      return "bf16";
    case Bound::kInt8:
      return "int8";
    case Bound::kMemory:
      return "memory";
  }
  return "?";
}

struct BenchState {
  virtual ~BenchState() = default;
  virtual void run() = 0;
};

// Adapts a lambda that owns its buffers into a BenchState.
template <typename Fn>
struct LambdaState : BenchState {
  explicit LambdaState(Fn f) : fn(std::move(f)) {}
  void run() override { fn(); }
  Fn fn;
};
template <typename Fn>
std::unique_ptr<BenchState> make_state(Fn f) {
  return std::make_unique<LambdaState<Fn>>(std::move(f));
}

struct KernelBench {
  std::string name;
  Bound bound;
  double flops = 0;  // per run, for compute-bound cases
  double bytes = 0;  // per run, for memory-bound cases (compulsory traffic)
  // Returns nullptr when this machine cannot run the case (an AMX kernel without AMX):
  // it is listed as not run rather than timed as an empty call.
  std::function<std::unique_ptr<BenchState>()> setup;
};

std::vector<KernelBench> gemm_benches();
std::vector<KernelBench> gemm_train_benches();
std::vector<KernelBench> quantized_linear_benches();
std::vector<KernelBench> moe_benches();
std::vector<KernelBench> all_kernel_benches();

}  // namespace hyperion::bench

// Shared helpers for the cases.
#include "tensor/tensor.h"

namespace hyperion::bench {

// A tensor of uniform random values in [lo, hi) (any float dtype; integer dtypes get
// integers in [lo, hi)). Large tensors repeat a random block so set-up stays fast.
std::shared_ptr<Tensor> random_tensor(DType dtype, Shape shape, unsigned seed, float lo = -1.0f,
                                      float hi = 1.0f);

std::vector<KernelBench> loss_benches();             // softmax, cross-entropy, embedding
std::vector<KernelBench> layer_benches();            // rmsnorm, rope, swiglu, adamw, global norm
std::vector<KernelBench> attention_benches();        // flash attention
std::vector<KernelBench> paged_attention_benches();  // serving decode over the paged KV cache

}  // namespace hyperion::bench
