// Grouped GEMM (dropless MoE) cases: the same FLOPs as one dense GEMM, split over 8
// experts with balanced routing and with one expert taking half the rows, so the report
// compares grouped and dense throughput in one run.
#include <memory>
#include <string>
#include <vector>

#include "cases/bench_registry.h"
#include "kernels/gemm.h"
#include "kernels/grouped_gemm.h"

namespace hyperion::bench {
namespace {

constexpr int64_t kRows = 8192, kIn = 512, kOut = 1408, kExperts = 8;

KernelBench grouped(const std::string& name, std::vector<int64_t> sizes) {
  KernelBench kb;
  kb.name = name;
  kb.bound = Bound::kBF16;
  kb.flops = 2.0 * kRows * kIn * kOut;
  kb.setup = [sizes] {
    const int64_t g = static_cast<int64_t>(sizes.size());
    auto a = random_tensor(DType::kBF16, {kRows, kIn}, 7);
    auto w = random_tensor(DType::kBF16, {g, kOut, kIn}, 8);
    auto c = std::make_shared<Tensor>(DType::kBF16, Shape{kRows, kOut});
    return make_state([=] { grouped_gemm(*a, *w, sizes, *c); });
  };
  return kb;
}

// The reference: the same FLOPs as one dense GEMM call, [kRows, kIn] x [kOut, kIn]^T.
KernelBench dense(const std::string& name) {
  KernelBench kb;
  kb.name = name;
  kb.bound = Bound::kBF16;
  kb.flops = 2.0 * kRows * kIn * kOut;
  kb.setup = [] {
    auto a = random_tensor(DType::kBF16, {kRows, kIn}, 7);
    auto w = random_tensor(DType::kBF16, {kOut, kIn}, 8);
    auto c = std::make_shared<Tensor>(DType::kBF16, Shape{kRows, kOut});
    return make_state([=] {
      gemm_contiguous(Trans::kN, Trans::kT, kRows, kOut, kIn, a->data(), DType::kBF16, w->data(),
                      DType::kBF16, c->data(), DType::kBF16);
    });
  };
  return kb;
}

}  // namespace

std::vector<KernelBench> moe_benches() {
  std::vector<int64_t> skewed(kExperts, kRows / 2 / (kExperts - 1));
  skewed[0] = kRows - (kExperts - 1) * skewed[1];  // one expert takes half the rows
  return {
      // One dense GEMM call: the reference rate.
      dense("gmm_dense_bf16_8192x1408x512"),
      // One group holding every row (run in 512-row chunks).
      grouped("gmm_one_group_bf16_8192x1408x512", {kRows}),
      grouped("gmm_balanced_bf16_e8_8192x1408x512",
              std::vector<int64_t>(kExperts, kRows / kExperts)),
      grouped("gmm_skewed_bf16_e8_8192x1408x512", skewed),
  };
}

}  // namespace hyperion::bench
