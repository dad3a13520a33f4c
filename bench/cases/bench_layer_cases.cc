// Bench cases: RMSNorm, RoPE, SwiGLU, AdamW, global norm, the non-finite scan. Sizes
// are those of a 2048-token batch of a Llama-7B-width layer, beyond the last-level cache.
#include <array>

#include "cases/bench_registry.h"
#include "kernels/adamw.h"
#include "kernels/finite.h"
#include "kernels/gated_activation.h"
#include "kernels/global_norm.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"

namespace hyperion::bench {

std::vector<KernelBench> layer_benches() {
  std::vector<KernelBench> v;
  const int64_t tokens = 8192, hidden = 4096, ffn = 11008;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::string tag(dtype_name(dt));
    const double es = double(dtype_size(dt));
    const double act = double(tokens) * hidden * es;
    v.push_back({"rmsnorm_fwd_" + tag + "_8192x4096", Bound::kMemory, 0, 2 * act, [=] {
                   auto x = random_tensor(dt, {tokens, hidden}, 1);
                   auto w = random_tensor(DType::kF32, {hidden}, 2);
                   auto y = std::make_shared<Tensor>(dt, Shape{tokens, hidden});
                   auto rstd = std::make_shared<Tensor>(DType::kF32, Shape{tokens});
                   return make_state([=] { rmsnorm_forward(*x, *w, 1e-5f, *y, *rstd); });
                 }});
    // Backward reads dy and x, writes dx.
    v.push_back({"rmsnorm_bwd_" + tag + "_8192x4096", Bound::kMemory, 0, 3 * act, [=] {
                   auto x = random_tensor(dt, {tokens, hidden}, 1);
                   auto dy = random_tensor(dt, {tokens, hidden}, 3);
                   auto w = random_tensor(DType::kF32, {hidden}, 2);
                   auto rstd = random_tensor(DType::kF32, {tokens}, 4, 0.5f, 2.0f);
                   auto dx = std::make_shared<Tensor>(dt, Shape{tokens, hidden});
                   auto dw = std::make_shared<Tensor>(Tensor::zeros(DType::kF32, {hidden}));
                   return make_state([=] { rmsnorm_backward(*dy, *x, *w, *rstd, *dx, *dw); });
                 }});
    // RoPE on q of [1, 8192, 32, 128] in place: read + write.
    v.push_back({"rope_fwd_" + tag + "_8192x32x128", Bound::kMemory, 0, 2 * act, [=] {
                   auto x = random_tensor(dt, {1, tokens, 32, 128}, 5);
                   auto table = std::make_shared<RopeTable>(tokens, 128, 10000.0);
                   return make_state([=] { rope_forward(*x, *x, 0, *table); });
                 }});
    const double mlp = double(tokens) / 4 * ffn * es;  // 2048 tokens x 11008
    v.push_back({"swiglu_fwd_" + tag + "_2048x11008", Bound::kMemory, 0, 3 * mlp, [=] {
                   auto g = random_tensor(dt, {tokens / 4, ffn}, 6, -4, 4);
                   auto u = random_tensor(dt, {tokens / 4, ffn}, 7);
                   auto h = std::make_shared<Tensor>(dt, Shape{tokens / 4, ffn});
                   return make_state([=] { swiglu_forward(*g, *u, *h); });
                 }});
    // Backward reads dh, g, u and writes dg, du.
    v.push_back({"swiglu_bwd_" + tag + "_2048x11008", Bound::kMemory, 0, 5 * mlp, [=] {
                   auto g = random_tensor(dt, {tokens / 4, ffn}, 6, -4, 4);
                   auto u = random_tensor(dt, {tokens / 4, ffn}, 7);
                   auto dh = random_tensor(dt, {tokens / 4, ffn}, 8);
                   auto dg = std::make_shared<Tensor>(dt, Shape{tokens / 4, ffn});
                   auto du = std::make_shared<Tensor>(dt, Shape{tokens / 4, ffn});
                   return make_state([=] { swiglu_backward(*dh, *g, *u, *dg, *du); });
                 }});
  }
  // AdamW over 64 Mi parameters: read p, g, m, v; write p, m, v (+ bf16 copy).
  const int64_t params = int64_t(64) << 20;
  v.push_back({"adamw_f32_64M", Bound::kMemory, 0, double(params) * 4 * 7, [=] {
                 auto p = random_tensor(DType::kF32, {params}, 9);
                 auto g = random_tensor(DType::kF32, {params}, 10);
                 auto m = std::make_shared<Tensor>(Tensor::zeros(DType::kF32, {params}));
                 auto vv = std::make_shared<Tensor>(Tensor::zeros(DType::kF32, {params}));
                 return make_state([=] {
                   AdamWParams hp;
                   adamw_step(*p, *g, *m, *vv, hp);
                 });
               }});
  v.push_back(
      {"adamw_bf16grad_bf16copy_64M", Bound::kMemory, 0, double(params) * (4 * 6 + 2 + 2), [=] {
         auto p = random_tensor(DType::kF32, {params}, 9);
         auto g = random_tensor(DType::kBF16, {params}, 10);
         auto m = std::make_shared<Tensor>(Tensor::zeros(DType::kF32, {params}));
         auto vv = std::make_shared<Tensor>(Tensor::zeros(DType::kF32, {params}));
         auto pb = std::make_shared<Tensor>(DType::kBF16, Shape{params});
         return make_state([=] {
           AdamWParams hp;
           adamw_step(*p, *g, *m, *vv, hp, *pb);
         });
       }});
  v.push_back({"global_l2_norm_f32_64M", Bound::kMemory, 0, double(params) * 4, [=] {
                 auto g = random_tensor(DType::kF32, {params}, 11);
                 return make_state([=] {
                   std::array<TensorView, 1> bufs{g->view()};
                   volatile double n = global_l2_norm(bufs);
                   (void)n;
                 });
               }});
  // The non-finite scan every checkpoint load runs over the weights (read once).
  for (DType dt : {DType::kF32, DType::kBF16}) {
    v.push_back({"first_nonfinite_" + std::string(dtype_name(dt)) + "_64M", Bound::kMemory, 0,
                 double(params) * dtype_size(dt), [=] {
                   auto w = random_tensor(dt, {params}, 12);
                   return make_state([=] {
                     volatile int64_t at = first_nonfinite(*w);
                     (void)at;
                   });
                 }});
  }
  return v;
}

}  // namespace hyperion::bench
