// One training Linear (forward, input gradient, weight gradient) at the trainer's shapes,
// in bf16 and through the quantised matmuls (int8 on the AMX kernel where present, and on
// oneDNN alone: "int8-onednn") (model/quantized_matmul.h): the int8 and
// fp8 cases include every quantisation they run (activations, gradients with stochastic
// rounding, the weights' once-per-pass quantisation), so their rate against the bf16
// case is what `quantization` gains on the Linear layers of a step. FLOPs: 6 rows in out.
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cases/bench_registry.h"
#include "kernels/backend.h"
#include "model/linear.h"
#include "model/param_store.h"
#include "model/quantized_matmul.h"

namespace hyperion::bench {
namespace {

// A one-layer store whose MLP gate is the [out, in] matrix.
DecoderConfig linear_config(int64_t out, int64_t in) {
  DecoderConfig c;
  c.vocab_size = 64;
  c.dim = in;
  c.n_layers = 1;
  c.n_heads = 1;
  c.n_kv_heads = 1;
  c.head_dim = in;
  c.ffn_dim = out;
  c.max_seq_len = 64;
  return c;
}

KernelBench linear_case(QuantMode mode, int64_t rows, int64_t out, int64_t in, bool amx = true) {
  KernelBench kb;
  const std::string tag = mode == QuantMode::kOff
                              ? std::string("bf16")
                              : std::string(quant_mode_name(mode)) + (amx ? "" : "-onednn");
  kb.name = std::string("linear_train_") + tag + "_" + std::to_string(rows) + "x" +
            std::to_string(out) + "x" + std::to_string(in);
  kb.bound = Bound::kBF16;  // the ratio is to the bf16 peak: EMFU
  kb.flops = 6.0 * double(rows) * double(out) * double(in);
  kb.setup = [=] {
    struct State {
      std::unique_ptr<ParamStore> ps;
      std::unique_ptr<QuantizedMatmuls> q;
      std::shared_ptr<Tensor> x, y, dy, dx;
    };
    auto s = std::make_shared<State>();
    s->ps = std::make_unique<ParamStore>(linear_config(out, in), true);
    s->ps->init(1, 0.02);
    if (mode != QuantMode::kOff) {
      QuantOptions o;
      o.mode = mode;
      o.use_amx = amx;
      s->q = std::make_unique<QuantizedMatmuls>(*s->ps, o, rows);
    }
    s->x = random_tensor(DType::kBF16, {rows, in}, 3);
    s->dy = random_tensor(DType::kBF16, {rows, out}, 4);
    s->y = std::make_shared<Tensor>(DType::kBF16, Shape{rows, out});
    s->dx = std::make_shared<Tensor>(DType::kF32, Shape{rows, in});
    const int idx = s->ps->layer(0).gate;
    return make_state([s, idx, rows] {
      ParamStore& ps = *s->ps;
      if (s->q) {
        // One pass per optimizer step (no accumulation): the weights are quantised anew.
        s->q->weights_changed();
        s->q->begin_pass(true);
        s->q->forward(idx, s->q->slot(0, 2), s->x->data(), s->y->data(), DType::kBF16, rows, 0.0f);
        s->q->backward(idx, s->q->slot(0, 2), s->dy->data(), s->dx->data(), DType::kF32, rows,
                       0.0f);
        return;
      }
      KernelBackend& k = host_backend();
      const TensorView w = ps.compute_weight(idx);
      linear::forward(k, s->x->data(), DType::kBF16, w, s->y->data(), DType::kBF16, rows);
      linear::backward_input(k, s->dy->data(), DType::kBF16, w, s->dx->data(), DType::kF32, rows);
      linear::backward_weight(k, s->dy->data(), s->x->data(), DType::kBF16, ps.grad(idx), rows);
    });
  };
  return kb;
}

}  // namespace

std::vector<KernelBench> quantized_linear_benches() {
  std::vector<KernelBench> v;
  for (auto [rows, out, in] : {std::tuple<int64_t, int64_t, int64_t>{4096, 1408, 512},
                               {4096, 512, 512},
                               {4096, 2048, 768}})
    for (QuantMode m : {QuantMode::kOff, QuantMode::kInt8, QuantMode::kFp8}) {
      v.push_back(linear_case(m, rows, out, in));
      // int8 with oneDNN alone (no AMX kernel): the two int8 GEMM paths side by side.
      if (m == QuantMode::kInt8) v.push_back(linear_case(m, rows, out, in, false));
    }
  return v;
}

}  // namespace hyperion::bench
