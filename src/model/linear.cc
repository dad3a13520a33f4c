#include "model/linear.h"

#include <string>
#include <vector>

#include "base/aligned.h"
#include "base/error.h"
#include "kernels/amx_int8_gemm.h"
#include "kernels/block_quant.h"
#include "kernels/quantize.h"

namespace hyperion {

namespace {

// Up to this many rows the int8 GEMM runs on the decode GEMV path (kernels/gemv.h, which
// streams W once for all rows); beyond it on AMX tiles where the CPU has them.
constexpr int64_t kInt8GemvMaxRows = 8;

}  // namespace

LinearWeights::LinearWeights(const ParamStore& params, WeightFormat format)
    : params_(params), backend_(backend_for(params.device())), format_(format) {
  HYP_CHECK(format == WeightFormat::kF32 || params.has_bf16(),
            "bf16 or int8 weights need the parameter store's bf16 copy");
  const DecoderConfig& cfg = params.config();
  for (const ParamInfo& info : params.infos()) {
    if (info.kind == ParamKind::kNorm || info.kind == ParamKind::kBias) continue;
    const bool expert = info.name.find(".experts.") != std::string::npos;
    const bool matmul = info.kind == ParamKind::kMatrix ||
                        (info.kind == ParamKind::kEmbedding && params.lm_head() == params.embed());
    if (!matmul) continue;
    const int index = static_cast<int>(&info - params.infos().data());
    if (const ParamStore::BlockWeight* b = params.block_weight(index)) {
      weight_bytes_ += static_cast<int64_t>(block_bytes(b->type, info.numel));
      if (!packed_.count(index)) {
        const PackedBlocks& p =
            packed_.emplace(index, pack_blocks(b->type, b->data, info.shape[0], info.shape[1])).first->second;
        // The file's pages of the packed rows are not read again (the tail rows are, and
        // the embedding's rows when the lookup reads them, from the file): hand them back
        // rather than hold the matrix twice.
        if (b->mapped)
          release_pages(const_cast<void*>(b->data),
                        static_cast<size_t>(p.groups * 8) * block_bytes(b->type, info.shape[1]), false);
      }
      continue;
    }
    if (format == WeightFormat::kInt8 && !expert)
      weight_bytes_ += info.numel + info.shape[0] * 4;
    else
      weight_bytes_ += info.numel * static_cast<int64_t>(dtype_size(act_dtype()));
  }
  if (format != WeightFormat::kInt8) return;
  std::vector<int> mats;
  for (int l = 0; l < cfg.n_layers; ++l) {
    const LayerParamIndex& p = params.layer(l);
    for (int i : {p.q, p.k, p.v, p.o}) mats.push_back(i);
    if (!p.moe())
      for (int i : {p.gate, p.up, p.down}) mats.push_back(i);
  }
  mats.push_back(params.lm_head());
  for (int i : mats) {
    if (quant_.count(i) || params.block_weight(i) != nullptr) continue;
    const TensorView w = params.param(i);
    QuantMatrix qm;
    qm.out = w.shape[0];
    qm.in = w.shape[1];
    if (backend_.device() != Device::kHost) {  // quantised where the weights are
      qm.dw = DeviceBuffer(backend_.allocator(), static_cast<size_t>(qm.out * qm.in));
      qm.dscale = DeviceBuffer(backend_.allocator(), static_cast<size_t>(qm.out) * 4);
      backend_.quantize_rows(w, backend_.view(qm.dw.data(), DType::kI8, {qm.out, qm.in}),
                             qm.dscale.as<float>());
      quant_.emplace(i, std::move(qm));
      continue;
    }
    qm.w = AlignedBuffer<int8_t>(static_cast<size_t>(qm.out * qm.in));
    qm.scale = AlignedBuffer<float>(static_cast<size_t>(qm.out));
    quantize_rows(w, TensorView(qm.w.data(), DType::kI8, {qm.out, qm.in}), qm.scale.data());
    qm.sums = AlignedBuffer<int32_t>(static_cast<size_t>(qm.out));
    int8_row_sums(TensorView(qm.w.data(), DType::kI8, {qm.out, qm.in}), qm.sums.data());
    if (backend_.device() == Device::kHost && amx_int8_available() &&
        amx_int8_gemm_applies(qm.in)) {
      qm.packed = AlignedBuffer<int8_t>(static_cast<size_t>(amx_packed_b_bytes(qm.in, qm.out)));
      amx_pack_b_nk(qm.w.data(), qm.out, qm.in, qm.packed.data());
    }
    quant_.emplace(i, std::move(qm));
  }
}

const int8_t* LinearWeights::int8_matrix(int index, const float** scales) const {
  auto it = quant_.find(index);
  if (it == quant_.end()) return nullptr;
  if (!it->second.dw.empty()) {
    *scales = it->second.dscale.as<float>();
    return it->second.dw.as<int8_t>();
  }
  *scales = it->second.scale.data();
  return it->second.w.data();
}

void LinearWeights::forward_int8_device(std::span<const int> indices, const void* x,
                                        std::span<void* const> ys, DType yd, int64_t n,
                                        float beta) {
  std::vector<KernelBackend::Int8Target> targets;
  int64_t in = -1;
  for (size_t t = 0; t < indices.size(); ++t) {
    const QuantMatrix& qm = quant_.at(indices[t]);
    HYP_CHECK(in < 0 || qm.in == in, "linear: the weights of one input differ in width");
    in = qm.in;
    targets.push_back({qm.dw.as<int8_t>(), qm.dscale.as<float>(), qm.out, ys[t], beta});
  }
  if (targets.empty()) return;
  const size_t need = static_cast<size_t>(n * in);
  if (dqx_.bytes() < need) dqx_ = DeviceBuffer(backend_.allocator(), need);
  if (dqscale_.bytes() < static_cast<size_t>(n) * 4)
    dqscale_ = DeviceBuffer(backend_.allocator(), static_cast<size_t>(n) * 4);
  backend_.linear_int8_many(x, act_dtype(), n, in, yd, targets, dqx_.as<int8_t>(),
                            dqscale_.as<float>());
}

void LinearWeights::forward_many(std::span<const int> indices, const void* x,
                                 std::span<void* const> ys, DType yd, int64_t n) {
  HYP_CHECK(indices.size() == ys.size(), "linear: {} weights but {} outputs", indices.size(),
            ys.size());
  bool quantised = false, device = true;
  for (int i : indices) {
    if (packed_.count(i) != 0) {  // all held in blocks: one pass for all of them
      std::vector<const PackedBlocks*> ps;
      for (int j : indices) {
        auto p = packed_.find(j);
        HYP_CHECK(p != packed_.end(), "linear: matrices of one input held in blocks and not");
        ps.push_back(&p->second);
      }
      packed_block_matmul_many(ps, n, x, act_dtype(), ys, yd);
      return;
    }
    auto it = quant_.find(i);
    quantised = quantised || it != quant_.end();
    device = device && it != quant_.end() && !it->second.dw.empty();
  }
  if (quantised && device) {
    forward_int8_device(indices, x, ys, yd, n);
    return;
  }
  if (quantised) {
    for (size_t t = 0; t < indices.size(); ++t) forward(indices[t], x, ys[t], yd, n);
    return;
  }
  std::vector<KernelBackend::LinearTarget> targets;
  int64_t in = -1;
  DType wd = DType::kF32;
  for (size_t t = 0; t < indices.size(); ++t) {
    const TensorView w = params_.compute_weight(indices[t]);
    HYP_CHECK(in < 0 || (w.shape[1] == in && w.dtype == wd),
              "linear: the weights of one input differ in width or dtype ({})", w.str());
    in = w.shape[1];
    wd = w.dtype;
    targets.push_back({w.data, w.shape[0], ys[t]});
  }
  if (targets.empty()) return;
  backend_.linear_many(x, act_dtype(), n, in, wd, yd, targets);
}

void LinearWeights::forward(int index, const void* x, void* y, DType yd, int64_t n, float beta) {
  if (auto p = packed_.find(index); p != packed_.end()) {
    packed_block_matmul(p->second, n, x, act_dtype(), y, yd, beta);
    return;
  }
  auto it = quant_.find(index);
  if (it == quant_.end()) {
    linear::forward(backend_, x, act_dtype(), params_.compute_weight(index), y, yd, n, beta);
    return;
  }
  const QuantMatrix& qm = it->second;
  const size_t need = static_cast<size_t>(n * qm.in);
  if (!qm.dw.empty()) {  // on a device: quantised and multiplied there
    const int idx[1] = {index};
    void* const ys[1] = {y};
    forward_int8_device(idx, x, ys, yd, n, beta);
    return;
  }
  if (qx_.size() < need) qx_ = AlignedBuffer<int8_t>(need);
  if (qscale_.size() < static_cast<size_t>(n))
    qscale_ = AlignedBuffer<float>(static_cast<size_t>(n));
  quantize_rows(TensorView(const_cast<void*>(x), act_dtype(), {n, qm.in}),
                TensorView(qx_.data(), DType::kI8, {n, qm.in}), qscale_.data());
  // int8 weights are a host format for now (quantize_rows and the VNNI GEMM).
  HYP_CHECK(backend_.device() == Device::kHost, "int8 weights need the host backend");
  if (qm.packed.size() > 0 && n > kInt8GemvMaxRows) {
    amx_int8_gemm(n, qm.out, qm.in, qx_.data(), qm.in, qm.packed.data(), qscale_.data(),
                  qm.scale.data(), y, yd, qm.out, beta);
    return;
  }
  GemmArgs g;
  g.trans_a = Trans::kN;
  g.trans_b = Trans::kT;
  g.m = n;
  g.n = qm.out;
  g.k = qm.in;
  g.a = qx_.data();
  g.a_dtype = DType::kI8;
  g.lda = qm.in;
  g.b = qm.w.data();
  g.b_dtype = DType::kI8;
  g.ldb = qm.in;
  g.c = y;
  g.c_dtype = yd;
  g.ldc = qm.out;
  g.beta = beta;
  g.a_scale = qscale_.data();
  g.b_scale = qm.scale.data();
  g.b_sums = qm.sums.data();
  backend_.gemm(g);
}

}  // namespace hyperion
