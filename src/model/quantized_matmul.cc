#include "model/quantized_matmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/error.h"
#include "kernels/amx_int8_gemm.h"
#include "kernels/quantize.h"
#include "kernels/quantize_train.h"

namespace hyperion {

QuantMode parse_quant_mode(const std::string& s, const std::string& what) {
  if (s.empty() || s == "none" || s == "off") return QuantMode::kOff;
  if (s == "int8") return QuantMode::kInt8;
  if (s == "fp8") return QuantMode::kFp8;
  fail("{}: unknown quantization '{}' (expected int8, fp8 or empty)", what, s);
}

const char* quant_mode_name(QuantMode m) {
  switch (m) {
    case QuantMode::kOff:
      return "";
    case QuantMode::kInt8:
      return "int8";
    case QuantMode::kFp8:
      return "fp8";
  }
  return "?";
}

float AmaxHistory::scale(float fp8_max, float margin) const {
  if (filled_ == 0) return 0.0f;
  float m = 0.0f;
  for (float v : values_) m = std::max(m, v);
  return m > 0.0f ? m * std::exp2(margin) / fp8_max : 0.0f;
}

void AmaxHistory::record(float amax, uint64_t pass) {
  values_[static_cast<size_t>(pass % values_.size())] = amax;
  filled_ = std::min<int64_t>(filled_ + 1, length());
}

void AmaxHistory::restore(const std::vector<float>& values, int64_t filled) {
  HYP_CHECK(values.size() == values_.size(),
            "amax history: {} values for a history of length {} (fp8_amax_history_len changed?)",
            values.size(), values_.size());
  values_ = values;
  filled_ = std::min<int64_t>(filled, length());
}

QuantizedMatmuls::QuantizedMatmuls(const ParamStore& params, const QuantOptions& options,
                                   int64_t rows)
    : params_(params), k_(backend_for(params.device())), options_(options), rows_(rows) {
  HYP_CHECK(options.enabled(), "quantized matmuls: quantization is off");
  HYP_CHECK(params.has_bf16(), "quantization: {} training needs bf16 compute (dtype: bfloat16)",
            quant_mode_name(options.mode));
  HYP_CHECK(options.amax_history_len >= 1, "fp8_amax_history_len must be >= 1, got {}",
            options.amax_history_len);
  HYP_CHECK(k_.device() == Device::kHost, "quantization: the quantised matmuls run on the host");
  const DecoderConfig& cfg = params.config();
  const size_t np = params.infos().size();
  covered_.assign(np, 0);
  weights_.resize(np);
  int64_t max_out = 0, max_in = 0;
  auto cover = [&](int i) {
    covered_[static_cast<size_t>(i)] = 1;
    const TensorView w = params.param(i);
    max_out = std::max(max_out, w.shape[0]);
    max_in = std::max(max_in, w.shape[1]);
    weights_[static_cast<size_t>(i)].w_hist = AmaxHistory(options.amax_history_len);
    weights_[static_cast<size_t>(i)].g_hist = AmaxHistory(options.amax_history_len);
  };
  for (int l = 0; l < cfg.n_layers; ++l) {
    const LayerParamIndex& p = params.layer(l);
    for (int i : {p.q, p.k, p.v, p.o}) cover(i);
    if (!p.moe())
      for (int i : {p.gate, p.up, p.down}) cover(i);
  }
  if (options.quantize_logits) cover(params.lm_head());
  head_slot_ = static_cast<int>(cfg.n_layers) * 4;
  slots_.resize(static_cast<size_t>(head_slot_ + 1));
  for (Slot& s : slots_) s.hist = AmaxHistory(options.amax_history_len);
  const int64_t widest = std::max(max_out, max_in);
  qa_ = AlignedBuffer<int8_t>(static_cast<size_t>(rows * widest));
  qb_ = AlignedBuffer<int8_t>(static_cast<size_t>(rows * widest));
  sa_ = AlignedBuffer<float>(static_cast<size_t>(std::max(rows, widest)));
  sb_ = AlignedBuffer<float>(static_cast<size_t>(std::max(rows, widest)));
  if (options.mode == QuantMode::kFp8) {
    va_ = AlignedBuffer<bf16>(static_cast<size_t>(rows * widest));
    vb_ = AlignedBuffer<bf16>(static_cast<size_t>(rows * widest));
  }
}

bool QuantizedMatmuls::covers(int index) const {
  return index >= 0 && static_cast<size_t>(index) < covered_.size() &&
         covered_[static_cast<size_t>(index)] != 0;
}

void QuantizedMatmuls::begin_pass(bool training) {
  training_ = training;
  ++pass_id_;
  if (training) ++passes_;
}

uint64_t QuantizedMatmuls::seed(int index) const {
  // Two streams per (pass, parameter): the gradient's row and column quantisations.
  return options_.seed * 0x9E3779B97F4A7C15ull + passes_ * 0x100000ull +
         static_cast<uint64_t>(index) * 2;
}

float QuantizedMatmuls::delayed_scale(const AmaxHistory& h, const void* x, DType xd, int64_t n,
                                      float fmax) const {
  float s = h.scale(fmax, options_.amax_margin);
  if (s == 0.0f) s = absmax(x, xd, n) * std::exp2(options_.amax_margin) / fmax;  // first pass
  return s > 0.0f && std::isfinite(s) ? s : 1.0f;
}

QuantizedMatmuls::Weight& QuantizedMatmuls::weight(int index) {
  Weight& w = weights_[static_cast<size_t>(index)];
  const bool int8 = options_.mode == QuantMode::kInt8;
  if (int8 ? w.version == weights_version_ : w.pass == pass_id_) return w;
  w.version = weights_version_;
  w.pass = pass_id_;
  // From the f32 master weights (as serving's int8 LinearWeights quantises them, so a
  // checkpoint serves the int8 values it trained with).
  const TensorView src = params_.param(index);
  const int64_t out = src.shape[0], in = src.shape[1];
  const size_t numel = static_cast<size_t>(out * in);
  if (options_.mode == QuantMode::kInt8) {
    if (w.q_rows.size() != numel) {
      w.q_rows = AlignedBuffer<int8_t>(numel);
      w.q_cols = AlignedBuffer<int8_t>(numel);
      w.s_rows = AlignedBuffer<float>(static_cast<size_t>(out));
      w.s_cols = AlignedBuffer<float>(static_cast<size_t>(in));
    }
    quantize_rows(src, TensorView(w.q_rows.data(), DType::kI8, {out, in}), w.s_rows.data());
    quantize_cols_int8(src, TensorView(w.q_cols.data(), DType::kI8, {out, in}), w.s_cols.data());
    if (options_.use_amx && amx_int8_available()) {
      // forward: op(B) = W^T, reduction over in; dx: B = W, reduction over out.
      if (amx_int8_gemm_applies(in)) {
        w.packed_fwd = AlignedBuffer<int8_t>(static_cast<size_t>(amx_packed_b_bytes(in, out)));
        amx_pack_b_nk(w.q_rows.data(), out, in, w.packed_fwd.data());
      }
      if (amx_int8_gemm_applies(out)) {
        w.packed_dx = AlignedBuffer<int8_t>(static_cast<size_t>(amx_packed_b_bytes(out, in)));
        amx_pack_b_kn(w.q_cols.data(), out, in, w.packed_dx.data());
      }
    }
    return w;
  }
  if (w.values.size() != numel) w.values = AlignedBuffer<bf16>(numel);
  w.scale = delayed_scale(w.w_hist, src.data, src.dtype, out * in, 448.0f);
  const float amax =
      quantize_fp8(src.data, src.dtype, out * in, w.scale, DType::kE4M3, nullptr, w.values.data());
  if (training_) w.w_hist.record(amax, passes_ - 1);
  return w;
}

const int8_t* QuantizedMatmuls::int8_weight(int index, const float** scales) {
  HYP_CHECK(options_.mode == QuantMode::kInt8 && covers(index),
            "int8_weight: parameter {} is not an int8 matmul", index);
  Weight& w = weight(index);
  *scales = w.s_rows.data();
  return w.q_rows.data();
}

QuantizedMatmuls::Slot& QuantizedMatmuls::fill_slot(int slot, const void* x, int64_t n,
                                                    int64_t cols) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  if (s.pass == pass_id_ && s.src == x && s.n == n && s.cols == cols) return s;
  HYP_CHECK(n <= rows_, "quantized matmul: {} rows exceed the {} it was sized for", n, rows_);
  const size_t need = static_cast<size_t>(rows_ * cols);
  if (s.q.size() < need) {
    s.q = AlignedBuffer<uint8_t>(need);
    if (options_.mode == QuantMode::kInt8) s.s = AlignedBuffer<float>(static_cast<size_t>(rows_));
  }
  s.pass = pass_id_;
  s.src = x;
  s.n = n;
  s.cols = cols;
  const TensorView xv(const_cast<void*>(x), DType::kBF16, {n, cols});
  if (options_.mode == QuantMode::kInt8) {
    quantize_rows(xv, TensorView(s.q.data(), DType::kI8, {n, cols}), s.s.data());
    return s;
  }
  s.scale = delayed_scale(s.hist, x, DType::kBF16, n * cols, 448.0f);
  // Bytes only: every reader (q, k and v share a slot) decodes them into scratch.
  const float amax =
      quantize_fp8(x, DType::kBF16, n * cols, s.scale, DType::kE4M3, s.q.data(), nullptr);
  if (training_) s.hist.record(amax, passes_ - 1);
  return s;
}

void QuantizedMatmuls::forward(int index, int slot, const void* x, void* y, DType yd, int64_t n,
                               float beta) {
  HYP_CHECK(covers(index), "quantized matmul: parameter {} is not covered", index);
  const TensorView wv = params_.compute_weight(index);
  const int64_t out = wv.shape[0], in = wv.shape[1];
  Weight& w = weight(index);
  Slot& s = fill_slot(slot, x, n, in);
  if (options_.mode == QuantMode::kInt8) {
    const auto* qx = reinterpret_cast<const int8_t*>(s.q.data());
    if (w.packed_fwd.size() > 0 && (yd == DType::kF32 || yd == DType::kBF16)) {
      amx_int8_gemm(n, out, in, qx, in, w.packed_fwd.data(), s.s.data(), w.s_rows.data(), y, yd,
                    out, beta);
      return;
    }
    GemmArgs g = contiguous_gemm_args(Trans::kN, Trans::kT, n, out, in, s.q.data(), DType::kI8,
                                      w.q_rows.data(), DType::kI8, y, yd, beta);
    g.a_scale = s.s.data();
    g.b_scale = w.s_rows.data();
    k_.gemm(g);
    return;
  }
  dequantize_fp8_values(s.q.data(), DType::kE4M3, n * in, va_.data());
  GemmArgs g = contiguous_gemm_args(Trans::kN, Trans::kT, n, out, in, va_.data(), DType::kBF16,
                                    w.values.data(), DType::kBF16, y, yd, beta);
  g.alpha = s.scale * w.scale;
  k_.gemm(g);
}

void QuantizedMatmuls::backward(int index, int slot, const void* dy, void* dx, DType dxd, int64_t n,
                                float beta) {
  HYP_CHECK(covers(index), "quantized matmul: parameter {} is not covered", index);
  const TensorView wv = params_.compute_weight(index);
  const int64_t out = wv.shape[0], in = wv.shape[1];
  Weight& w = weight(index);
  Slot& s = slots_[static_cast<size_t>(slot)];
  HYP_CHECK(s.pass == pass_id_ && s.n == n && s.cols == in,
            "quantized matmul: the backward of parameter {} found no saved input in slot {}", index,
            slot);
  // A frozen base (a store without gradients, LoRA) needs the input gradient only.
  const bool frozen = !params_.has_grads();
  const TensorView grad = frozen ? TensorView() : params_.grad(index);
  if (options_.mode == QuantMode::kInt8) {
    // dW on the AMX kernel: dW[out, in] = (q_g^T [out, n]) x (q_x [n, in], packed), the
    // quantiser writing q_g transposed (the kernel's A operand runs along the tokens).
    const bool amx_dw = options_.use_amx && amx_int8_available() && amx_int8_gemm_applies(n);
    GradQuantized q{qa_.data(), sa_.data(), qb_.data(), sb_.data()};
    q.cols_transposed = amx_dw;
    quantize_grad_int8(TensorView(const_cast<void*>(dy), DType::kBF16, {n, out}), s.s.data(),
                       seed(index), q);
    if (w.packed_dx.size() > 0 && (dxd == DType::kF32 || dxd == DType::kBF16)) {
      amx_int8_gemm(n, in, out, qa_.data(), out, w.packed_dx.data(), sa_.data(), w.s_cols.data(),
                    dx, dxd, in, beta);
    } else {
      GemmArgs gx = contiguous_gemm_args(Trans::kN, Trans::kN, n, in, out, qa_.data(), DType::kI8,
                                         w.q_cols.data(), DType::kI8, dx, dxd, beta);
      gx.a_scale = sa_.data();
      gx.b_scale = w.s_cols.data();
      k_.gemm(gx);
    }
    if (frozen) return;
    if (amx_dw) {
      if (s.packed_pass != pass_id_) {
        const size_t bytes = static_cast<size_t>(amx_packed_b_bytes(n, in));
        if (s.packed.size() < bytes) s.packed = AlignedBuffer<int8_t>(bytes);
        amx_pack_b_kn(reinterpret_cast<const int8_t*>(s.q.data()), n, in, s.packed.data());
        s.packed_pass = pass_id_;
      }
      if (ones_.size() < static_cast<size_t>(in)) ones_.assign(static_cast<size_t>(in), 1.0f);
      amx_int8_gemm(out, in, n, qb_.data(), n, s.packed.data(), sb_.data(), ones_.data(), grad.data,
                    DType::kF32, in, 1.0f);
      return;
    }
    GemmArgs gw = contiguous_gemm_args(Trans::kT, Trans::kN, out, in, n, qb_.data(), DType::kI8,
                                       s.q.data(), DType::kI8, grad.data, DType::kF32, 1.0f);
    gw.a_scale = sb_.data();
    k_.gemm(gw);
    return;
  }
  const float sg = delayed_scale(w.g_hist, dy, DType::kBF16, n * out, 57344.0f);
  const float amax = quantize_fp8(dy, DType::kBF16, n * out, sg, DType::kE5M2, nullptr, vb_.data());
  if (training_) w.g_hist.record(amax, passes_ - 1);
  GemmArgs gx = contiguous_gemm_args(Trans::kN, Trans::kN, n, in, out, vb_.data(), DType::kBF16,
                                     w.values.data(), DType::kBF16, dx, dxd, beta);
  gx.alpha = sg * w.scale;
  k_.gemm(gx);
  if (frozen) return;
  dequantize_fp8_values(s.q.data(), DType::kE4M3, n * in, va_.data());
  GemmArgs gw = contiguous_gemm_args(Trans::kT, Trans::kN, out, in, n, vb_.data(), DType::kBF16,
                                     va_.data(), DType::kBF16, grad.data, DType::kF32, 1.0f);
  gw.alpha = sg * s.scale;
  k_.gemm(gw);
}

std::vector<std::pair<std::string, std::vector<float>>> QuantizedMatmuls::histories() const {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  if (options_.mode != QuantMode::kFp8) return out;
  const auto& infos = params_.infos();
  for (size_t i = 0; i < weights_.size(); ++i) {
    if (!covers(static_cast<int>(i))) continue;
    out.emplace_back(infos[i].name + ".weight_amax_history", weights_[i].w_hist.values());
    out.emplace_back(infos[i].name + ".grad_amax_history", weights_[i].g_hist.values());
  }
  static const char* kKinds[] = {"attention_input", "attention_output", "mlp_input",
                                 "mlp_activation"};
  for (size_t s = 0; s < slots_.size(); ++s) {
    const int si = static_cast<int>(s);
    const std::string name = si == head_slot_ ? std::string("lm_head.input_amax_history")
                                              : "model.layers." + std::to_string(si / 4) + "." +
                                                    kKinds[si % 4] + ".input_amax_history";
    out.emplace_back(name, slots_[s].hist.values());
  }
  return out;
}

void QuantizedMatmuls::restore(uint64_t passes,
                               const std::vector<std::pair<std::string, std::vector<float>>>& h) {
  passes_ = passes;
  if (options_.mode != QuantMode::kFp8) return;
  const int64_t filled = static_cast<int64_t>(passes);
  auto find = [&](const std::string& name) -> const std::vector<float>& {
    for (const auto& [n, v] : h)
      if (n == name) return v;
    fail("quantization state: no amax history '{}' in the checkpoint", name);
  };
  const auto mine = histories();  // the names, in order
  size_t at = 0;
  const auto& infos = params_.infos();
  for (size_t i = 0; i < weights_.size(); ++i) {
    if (!covers(static_cast<int>(i))) continue;
    weights_[i].w_hist.restore(find(infos[i].name + ".weight_amax_history"), filled);
    weights_[i].g_hist.restore(find(infos[i].name + ".grad_amax_history"), filled);
    at += 2;
  }
  for (Slot& s : slots_) s.hist.restore(find(mine[at++].first), filled);
}

}  // namespace hyperion
