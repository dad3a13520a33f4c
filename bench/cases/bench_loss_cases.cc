// Bench cases: softmax, fused cross-entropy, embedding. Working sets exceed the
// last-level cache so the figures are DRAM bandwidth, not cache bandwidth.
#include "cases/bench_registry.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/softmax.h"

namespace hyperion::bench {

std::vector<KernelBench> loss_benches() {
  std::vector<KernelBench> v;
  const int64_t rows = 2048, vocab = 32000;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const double bytes = double(rows) * vocab * dtype_size(dt);
    const std::string tag(dtype_name(dt));
    v.push_back({"softmax_fwd_" + tag + "_2048x32000", Bound::kMemory, 0, 2 * bytes, [=] {
                   auto x = random_tensor(dt, {rows, vocab}, 1, -5, 5);
                   auto y = std::make_shared<Tensor>(dt, Shape{rows, vocab});
                   return make_state([=] { softmax_forward(*x, *y); });
                 }});
    // In place (dlogits aliases logits): one compulsory read and one write per element.
    v.push_back({"cross_entropy_fused_" + tag + "_2048x32000", Bound::kMemory, 0, 2 * bytes, [=] {
                   auto logits = random_tensor(dt, {rows, vocab}, 2, -5, 5);
                   auto targets = random_tensor(DType::kI32, {rows}, 3, 0, float(vocab));
                   return make_state([=] { cross_entropy_fused(*logits, *targets, *logits); });
                 }});
  }
  const int64_t tokens = 16384, hidden = 2048, table_rows = 32000;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::string tag(dtype_name(dt));
    const double row_bytes = double(hidden) * dtype_size(dt);
    v.push_back(
        {"embedding_fwd_" + tag + "_16384x2048", Bound::kMemory, 0, 2 * tokens * row_bytes, [=] {
           auto table = random_tensor(dt, {table_rows, hidden}, 4);
           auto ids = random_tensor(DType::kI32, {tokens}, 5, 0, float(table_rows));
           auto out = std::make_shared<Tensor>(dt, Shape{tokens, hidden});
           return make_state([=] { embedding_forward(*table, *ids, *out); });
         }});
  }
  // Backward: read dout (f32), read-modify-write one f32 gradient row per token.
  v.push_back(
      {"embedding_bwd_f32_16384x2048", Bound::kMemory, 0, 3.0 * tokens * hidden * 4, [=] {
         auto dout = random_tensor(DType::kF32, {tokens, hidden}, 6);
         auto ids = random_tensor(DType::kI32, {tokens}, 7, 0, float(table_rows));
         auto dtable = std::make_shared<Tensor>(Tensor::zeros(DType::kF32, {table_rows, hidden}));
         return make_state([=] { embedding_backward(*ids, *dout, *dtable); });
       }});
  return v;
}

}  // namespace hyperion::bench
