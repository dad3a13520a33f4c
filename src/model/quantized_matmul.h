// Quantised training matmuls (`quantization: int8 | fp8`), in the manner of MaxText's AQT
// (int8) and of fp8 training with delayed scaling. The decoder routes the Linear layers
// this object covers (attention q/k/v/o and the dense MLP's gate/up/down; the LM head
// only with quantize_logits) through it; attention's QK^T and PV, the router and the
// norms stay in bf16. Master weights, gradients and the optimizer stay f32.
//
// int8 (symmetric absmax, int8 x int8 -> int32 GEMMs, scales in the GEMM epilogue; on
// kernels/amx_int8_gemm.h where the CPU has AMX-INT8, oneDNN otherwise: bit-equal):
//   forward   y  = (q_x q_W^T) * s_x[row] * s_W[out]    x per token, W per output channel
//   dx        dx = (q_dy q_Wc) * s_dy[row] * s_Wc[in]   dy per token (stochastic rounding),
//                                                       W per input channel
//   dW        dW += (q_g^T q_x) * s_g[out]              g = dy * s_x[row] per output
//                                                       channel (stochastic rounding), q_x
//                                                       the forward's int8 x, reused as is
//   The straight-through estimator: the backward treats the quantisers as the identity.
//   Rounding draws are seeded by (quant_seed, training pass, parameter index): the same
//   at any thread count and after a resume (the pass counter is checkpointed).
//
// fp8 (emulated on the CPU: the GEMM runs on the fp8 values, exactly representable in
// bf16, with f32 accumulation, and the two per-tensor scales as its alpha):
//   forward operands e4m3 (x, W), gradients e5m2 (dy); one scale per tensor by delayed
//   scaling: scale = max(amax history) * 2^margin / fp8_max, the history holding the last
//   fp8_amax_history_len training passes' max|x| (the current pass's amax is recorded
//   after its quantisation: the scale never depends on the tensor it scales, except on
//   the very first pass, when the history is empty and the current amax is used).
//   Values beyond the delayed scale's range saturate (fp8_max).
//   The forward's quantised x is kept in fp8 bytes for the weight gradient (1 byte per
//   element instead of bf16's 2: the activation memory win).
//
// Every training pass (forward_backward) records each history once and advances the
// pass counter; evaluation passes use the scales without recording.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/aligned.h"
#include "kernels/backend.h"
#include "model/param_store.h"

namespace hyperion {

enum class QuantMode : uint8_t { kOff, kInt8, kFp8 };
// "" / "none" -> kOff, "int8", "fp8"; throws naming `what` otherwise.
QuantMode parse_quant_mode(const std::string& s, const std::string& what);
const char* quant_mode_name(QuantMode m);

struct QuantOptions {
  QuantMode mode = QuantMode::kOff;
  bool quantize_logits = false;  // the LM head too
  int64_t amax_history_len = 1024;
  float amax_margin = 0.0f;  // scale *= 2^margin
  uint64_t seed = 0;         // stochastic rounding stream
  // int8 GEMMs on the AMX kernel (kernels/amx_int8_gemm.h) where the CPU has AMX-INT8;
  // false: oneDNN only (the same results bit for bit: for tests and benchmarks).
  bool use_amx = true;
  bool enabled() const { return mode != QuantMode::kOff; }
};

// A delayed-scaling amax history: a ring of the last `len` recorded amaxes.
class AmaxHistory {
 public:
  explicit AmaxHistory(int64_t len = 1024) : values_(static_cast<size_t>(len), 0.0f) {}
  int64_t length() const { return static_cast<int64_t>(values_.size()); }
  // Recorded values so far (saturates at length()).
  int64_t filled() const { return filled_; }
  // The scale that maps the history's max to fp8_max (times 2^margin), or 0 when nothing
  // usable was recorded yet (empty, or all zero).
  float scale(float fp8_max, float margin) const;
  // Writes amax at the ring position `pass % length()` (the slot of the oldest value).
  void record(float amax, uint64_t pass);
  const std::vector<float>& values() const { return values_; }
  void restore(const std::vector<float>& values, int64_t filled);

 private:
  std::vector<float> values_;
  int64_t filled_ = 0;
};

class QuantizedMatmuls {
 public:
  // rows: the most tokens one pass runs (batch x sequence).
  QuantizedMatmuls(const ParamStore& params, const QuantOptions& options, int64_t rows);

  const QuantOptions& options() const { return options_; }
  // Whether parameter `index`'s matmuls run here.
  bool covers(int index) const;
  // The saved-input slot of layer l's linear inputs (kind 0 = the attention norm's output,
  // 1 = attention output, 2 = the MLP norm's output, 3 = the gated activation) and of the
  // LM head's input.
  int slot(int layer, int kind) const { return layer * 4 + kind; }
  int head_slot() const { return head_slot_; }

  // Starts a pass: training passes record amaxes and advance the pass counter.
  void begin_pass(bool training);
  // The weights changed (an optimizer step, a load): int8 re-quantises them at their
  // next use, and otherwise keeps its quantised copies across passes (micro-batches and
  // evaluation passes of one step). fp8 re-quantises every pass (its delayed scale moves
  // with the history).
  void weights_changed() { ++weights_version_; }
  // y[n, out] = x[n, in] W^T + beta * y (x bf16; y bf16 or f32). The quantised x is kept
  // in `slot` for the backward; a slot already filled from the same x this pass is reused
  // (q, k and v share their input).
  void forward(int index, int slot, const void* x, void* y, DType yd, int64_t n, float beta);
  // dx[n, in] = dy W + beta * dx and grad(W) += dy^T x, x being slot's saved input.
  void backward(int index, int slot, const void* dy, void* dx, DType dxd, int64_t n, float beta);

  // Checkpoint state: the pass counter and (fp8) every history, by name.
  uint64_t passes() const { return passes_; }
  std::vector<std::pair<std::string, std::vector<float>>> histories() const;
  // Restores both (names must match this model's; throws naming the first missing one).
  void restore(uint64_t passes, const std::vector<std::pair<std::string, std::vector<float>>>& h);
  // The int8 weights of parameter `index` as the forward read them (per output channel).
  const int8_t* int8_weight(int index, const float** scales);

 private:
  struct Weight {
    uint64_t pass = ~uint64_t(0);          // fp8: the pass it was quantised in
    uint64_t version = ~uint64_t(0);       // int8: the weights_version_ it was quantised at
    AlignedBuffer<int8_t> q_rows, q_cols;  // int8: per output / per input channel
    AlignedBuffer<float> s_rows, s_cols;
    // The same, packed for the AMX kernel (kernels/amx_int8_gemm.h; empty without AMX or
    // when the reduction length is not a multiple of 64).
    AlignedBuffer<int8_t> packed_fwd, packed_dx;
    AlignedBuffer<bf16> values;  // fp8: the e4m3 values
    float scale = 1.0f;
    AmaxHistory w_hist, g_hist;
  };
  struct Slot {
    uint64_t pass = ~uint64_t(0);
    const void* src = nullptr;
    int64_t n = 0, cols = 0;
    AlignedBuffer<uint8_t> q;  // int8 or e4m3 bytes [n, cols]
    AlignedBuffer<float> s;    // int8 per-row scales
    float scale = 1.0f;        // fp8
    AmaxHistory hist;
    // int8 with AMX: q packed as the weight gradient's B operand (kernels/amx_int8_gemm.h),
    // built by the first backward that reads the slot in a pass.
    AlignedBuffer<int8_t> packed;
    uint64_t packed_pass = ~uint64_t(0);
  };
  Weight& weight(int index);
  Slot& fill_slot(int slot, const void* x, int64_t n, int64_t cols);
  float delayed_scale(const AmaxHistory& h, const void* x, DType xd, int64_t n, float fmax) const;
  uint64_t seed(int index) const;

  const ParamStore& params_;
  KernelBackend& k_;
  QuantOptions options_;
  int64_t rows_;
  std::vector<Weight> weights_;  // by parameter index (unused entries stay empty)
  std::vector<uint8_t> covered_;
  std::vector<Slot> slots_;
  int head_slot_ = 0;
  uint64_t passes_ = 0;   // training passes completed (the one running included)
  uint64_t pass_id_ = 0;  // every pass, for cache validity
  uint64_t weights_version_ = 0;
  bool training_ = false;
  // Scratch: quantised gradients and bf16 operand values.
  AlignedBuffer<int8_t> qa_, qb_;
  AlignedBuffer<float> sa_, sb_;
  AlignedBuffer<bf16> va_, vb_;
  std::vector<float> ones_;  // unit column scales (the weight gradient's)
};

}  // namespace hyperion
