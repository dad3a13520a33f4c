#include "cases/bench_registry.h"

namespace hyperion::bench {

std::vector<KernelBench> all_kernel_benches() {
  std::vector<KernelBench> all;
  for (auto* group :
       {&gemm_benches, &gemm_train_benches, &quantized_linear_benches, &moe_benches, &loss_benches,
        &layer_benches, &attention_benches, &paged_attention_benches}) {
    auto cases = (*group)();
    all.insert(all.end(), std::make_move_iterator(cases.begin()),
               std::make_move_iterator(cases.end()));
  }
  return all;
}

}  // namespace hyperion::bench
