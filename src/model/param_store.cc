#include "model/param_store.h"

#include <cstring>

#include "base/error.h"
#include "base/system_memory.h"
#include "base/threads.h"
#include "kernels/backend.h"
#include "kernels/fill.h"
#include "tensor/convert.h"

namespace hyperion {

namespace {
constexpr int64_t kAlignElems = 16;  // 64 bytes of f32
}

ParamStore::ParamStore(const DecoderConfig& config, bool bf16_copy, bool gradients,
                       Allocator& alloc)
    : config_(config), tie_(config.tie_embeddings), device_(alloc.device()) {
  describe();
  index_layers();
  allocate({bf16_copy, gradients}, alloc);
}

ParamStore::ParamStore(const DecoderConfig& config, const std::vector<ParamSpec>& tensors,
                       ParamBuffers buffers, Allocator& alloc)
    : config_(config), device_(alloc.device()) {
  config_.validate("model");
  int last = 0;
  for (const ParamSpec& t : tensors) {
    HYP_CHECK(t.layer >= last && t.layer < config_.n_layers,
              "ParamStore: tensor {} of layer {} is out of layer order (or range)", t.name, t.layer);
    last = t.layer;
    add(t.name, t.shape, t.layer, t.kind);
  }
  index_layers();
  allocate(buffers, alloc);
}

void ParamStore::allocate(ParamBuffers buffers, Allocator& alloc) {
  KernelBackend& k = backend_for(device_);
  const size_t n = static_cast<size_t>(size_);
  // Padding between tensors stays zero, so whole-buffer reductions (norms) are exact. On
  // the host the whole pages are returned instead of written (they read as zero and cost
  // nothing until a tensor is written: a bf16-only base never commits its matrices' f32).
  auto zeroed = [&](DeviceBuffer& b) {
    if (device_ == Device::kHost)
      release_pages(b.data(), b.bytes(), true);
    else
      k.zero(b.data(), b.bytes());
  };
  params_ = DeviceBuffer(alloc, n * sizeof(float));
  zeroed(params_);
  if (buffers.gradients) {
    grads_ = DeviceBuffer(alloc, n * sizeof(float));
    zero_grads();
  }
  if (buffers.bf16_copy) {
    bf16_ = DeviceBuffer(alloc, n * sizeof(bf16));
    zeroed(bf16_);
  }
}

void ParamStore::index_layers() {
  // Layer l starts at the first tensor of a layer >= l; past the last layer, at the first
  // tensor after it (the final norm) or the end.
  const int nl = static_cast<int>(config_.n_layers);
  layer_begin_.assign(static_cast<size_t>(nl + 1), size_);
  for (int l = nl; l >= 0; --l) {
    bool seen_layer = false;
    for (const ParamInfo& p : infos_) {
      if (p.layer >= 0) seen_layer = true;
      if (p.layer >= l || (l == nl && seen_layer && p.layer < 0)) {
        layer_begin_[static_cast<size_t>(l)] = p.offset;
        break;
      }
    }
  }
  if (nl == 0 && final_norm_ >= 0) layer_begin_[0] = infos_[static_cast<size_t>(final_norm_)].offset;
}

std::vector<ParamInfo> ParamStore::layout(const DecoderConfig& config) {
  ParamStore s;
  s.config_ = config;
  s.tie_ = config.tie_embeddings;
  s.describe();
  return std::move(s.infos_);
}

int64_t ParamStore::bytes(const DecoderConfig& config, ParamBuffers buffers) {
  ParamStore s;
  s.config_ = config;
  s.tie_ = config.tie_embeddings;
  s.describe();
  // Saturating: the element count fits int64 (validate()'s caps), its bytes may not.
  return sat_mul(s.size_, 4 + (buffers.gradients ? 4 : 0) + (buffers.bf16_copy ? 2 : 0));
}

void ParamStore::describe() {
  const DecoderConfig& config = config_;
  config.validate("model");
  const int64_t d = config.dim, q = config.q_dim(), kv = config.kv_dim(), f = config.ffn_dim;
  const int64_t fe = config.expert_ffn_dim();
  const int ne = static_cast<int>(config.n_experts);
  // Each tensor's name is Hugging Face's, so a checkpoint directory is a Hugging Face model
  // directory (other formats' names: convert/family_formats.cc).
  embed_ = add("model.embed_tokens.weight", {config.vocab_size, d}, -1, ParamKind::kEmbedding);
  for (int l = 0; l < config.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const DecoderArch& a = config.arch;
    const auto K = ParamKind::kMatrix, N = ParamKind::kNorm, B = ParamKind::kBias;
    LayerParamIndex li;
    li.input_norm = add(p + "input_layernorm.weight", {d}, l, N);
    li.q = add(p + "self_attn.q_proj.weight", {q, d}, l, K);
    if (a.qkv_bias) li.q_bias = add(p + "self_attn.q_proj.bias", {q}, l, B);
    li.k = add(p + "self_attn.k_proj.weight", {kv, d}, l, K);
    if (a.qkv_bias) li.k_bias = add(p + "self_attn.k_proj.bias", {kv}, l, B);
    li.v = add(p + "self_attn.v_proj.weight", {kv, d}, l, K);
    if (a.qkv_bias) li.v_bias = add(p + "self_attn.v_proj.bias", {kv}, l, B);
    if (a.qk_norm) {
      const int64_t hd = config.head_dim;
      li.q_norm = add(p + "self_attn.q_norm.weight", {hd}, l, N);
      li.k_norm = add(p + "self_attn.k_norm.weight", {hd}, l, N);
    }
    li.o = add(p + "self_attn.o_proj.weight", {d, q}, l, K);
    if (a.o_bias) li.o_bias = add(p + "self_attn.o_proj.bias", {d}, l, B);
    // Llama's post_attention_layernorm is the MLP's input norm; with post-norms (Gemma 2/3)
    // the name is the attention output's norm and the MLP's is pre_feedforward_layernorm.
    if (a.post_norms) {
      li.attn_out_norm = add(p + "post_attention_layernorm.weight", {d}, l, N);
      li.mlp_norm = add(p + "pre_feedforward_layernorm.weight", {d}, l, N);
    } else {
      li.mlp_norm = add(p + "post_attention_layernorm.weight", {d}, l, N);
    }
    if (config.is_moe_layer(l)) {
      // Mixtral's w1 = gate, w3 = up, w2 = down, one tensor per expert.
      const std::string m = p + "block_sparse_moe.";
      li.router = add(m + "gate.weight", {config.n_experts, d}, l, K);
      li.gate = add_stacked(m + "experts.", ".w1.weight", ne, {fe, d}, l);
      li.up = add_stacked(m + "experts.", ".w3.weight", ne, {fe, d}, l);
      li.down = add_stacked(m + "experts.", ".w2.weight", ne, {d, fe}, l);
    } else {
      li.gate = add(p + "mlp.gate_proj.weight", {f, d}, l, K);
      li.up = add(p + "mlp.up_proj.weight", {f, d}, l, K);
      li.down = add(p + "mlp.down_proj.weight", {d, f}, l, K);
    }
    if (a.post_norms) li.mlp_out_norm = add(p + "post_feedforward_layernorm.weight", {d}, l, N);
    layers_.push_back(li);
  }
  final_norm_ = add("model.norm.weight", {d}, -1, ParamKind::kNorm);
  if (!tie_) lm_head_ = add("lm_head.weight", {config.vocab_size, d}, -1, ParamKind::kMatrix);
}

int ParamStore::add(std::string name, Shape shape, int layer, ParamKind kind) {
  ParamInfo info;
  info.name = std::move(name);
  info.shape = shape;
  info.offset = size_;
  info.numel = shape.numel();
  info.layer = layer;
  info.kind = kind;
  size_ += (info.numel + kAlignElems - 1) / kAlignElems * kAlignElems;
  infos_.push_back(std::move(info));
  return static_cast<int>(infos_.size() - 1);
}

int ParamStore::add_stacked(const std::string& prefix, const std::string& suffix, int count,
                            Shape shape, int layer) {
  const int first = static_cast<int>(infos_.size());
  const int64_t begin = size_;
  for (int e = 0; e < count; ++e) {
    ParamInfo info;
    info.name = prefix + std::to_string(e) + suffix;
    info.shape = shape;
    info.numel = shape.numel();
    info.offset = begin + e * info.numel;
    info.layer = layer;
    info.kind = ParamKind::kMatrix;
    infos_.push_back(std::move(info));
  }
  const int64_t total = count * shape.numel();
  size_ += (total + kAlignElems - 1) / kAlignElems * kAlignElems;
  return first;
}

TensorView ParamStore::stack(const TensorView& first, int count) {
  if (first.data == nullptr) return first;
  Shape s;
  s.push_back(count);
  for (int64_t d : first.shape) s.push_back(d);
  TensorView v(first.data, first.dtype, s);
  v.device = first.device;
  return v;
}

TensorView ParamStore::stacked_param(int first, int count) const {
  return stack(param(first), count);
}
TensorView ParamStore::stacked_grad(int first, int count) const {
  return stack(grad(first), count);
}
TensorView ParamStore::stacked_compute_weight(int first, int count) const {
  return stack(compute_weight(first), count);
}

const ParamInfo* ParamStore::find(const std::string& name) const {
  for (const ParamInfo& p : infos_)
    if (p.name == name) return &p;
  return nullptr;
}

TensorView ParamStore::param(int i) const {
  const ParamInfo& p = infos_[static_cast<size_t>(i)];
  if (const BlockWeight* b = block_weight(i))
    fail("ParamStore: {} is held in {} blocks (a quantised GGUF model); its f32 weights are "
         "not available",
         p.name, block_format(b->type).name);
  HYP_CHECK(!master_dropped(i),
            "ParamStore: {} is held in bf16 alone (a frozen base drops the f32 masters of its "
            "matrices); its f32 weights are not available",
            p.name);
  TensorView v(params_.as<float>() + p.offset, DType::kF32, p.shape);
  v.device = device_;
  return v;
}

TensorView ParamStore::grad(int i) const {
  HYP_CHECK(has_grads(), "ParamStore: gradients of {} requested from a store built without them",
            infos_[static_cast<size_t>(i)].name);
  const ParamInfo& p = infos_[static_cast<size_t>(i)];
  TensorView v(grads_.as<float>() + p.offset, DType::kF32, p.shape);
  v.device = device_;
  return v;
}

TensorView ParamStore::param_bf16(int i) const {
  if (bf16_.empty()) return TensorView();
  const ParamInfo& p = infos_[static_cast<size_t>(i)];
  TensorView v(bf16_.as<bf16>() + p.offset, DType::kBF16, p.shape);
  v.device = device_;
  return v;
}

TensorView ParamStore::compute_weight(int i) const {
  if (!bf16_.empty() && block_weight(i) != nullptr) return param(i);  // throws naming it
  return bf16_.empty() ? param(i) : param_bf16(i);
}

std::string ParamStore::block_weights_summary() const {
  if (blocks_.empty()) return "";
  int count[kBlockTypes] = {};
  for (const BlockWeight& b : blocks_)
    if (b.data != nullptr) ++count[static_cast<int>(b.type)];
  std::string out = "gguf";
  for (int t = 0; t < kBlockTypes; ++t)
    if (count[t] > 0)
      out += fmt::format("{} {} x {}", out == "gguf" ? "" : ",", block_format(static_cast<BlockType>(t)).name, count[t]);
  return out;
}

void ParamStore::hold_in_blocks(int i, BlockType type, const void* data,
                                std::shared_ptr<const void> owner, bool mapped) {
  const ParamInfo& p = infos_[static_cast<size_t>(i)];
  HYP_CHECK(device_ == Device::kHost, "ParamStore: {} in {} blocks: block weights are a host format",
            p.name, block_format(type).name);
  HYP_CHECK(p.shape.rank() == 2 && p.shape[1] % block_format(type).values == 0,
            "ParamStore: {} {} cannot be held in {} blocks (rows must be whole blocks of {})",
            p.name, p.shape.str(), block_format(type).name, block_format(type).values);
  if (blocks_.empty()) blocks_.resize(infos_.size());
  blocks_[static_cast<size_t>(i)] = {type, data, mapped};
  // Its bf16 copy is not a copy of anything: sync_bf16 leaves it alone, as a dropped one.
  if (dropped_.empty()) dropped_.assign(infos_.size(), false);
  dropped_[static_cast<size_t>(i)] = true;
  if (owner) block_owners_.push_back(std::move(owner));
}

std::pair<int64_t, int64_t> ParamStore::layer_range(int l) const {
  return {layer_begin_[static_cast<size_t>(l)], layer_begin_[static_cast<size_t>(l) + 1]};
}

std::pair<int64_t, int64_t> ParamStore::bucket_range(int b) const {
  const int nl = static_cast<int>(config_.n_layers);
  HYP_CHECK(b >= 0 && b <= nl + 1, "bucket {} is out of range [0, {}]", b, nl + 1);
  if (nl == 0)
    return b == 0 ? std::pair<int64_t, int64_t>{0, layer_begin_[0]}
                  : std::pair<int64_t, int64_t>{layer_begin_[0], size_};
  if (b == 0) return {0, layer_range(0).first};
  if (b == nl + 1) return {layer_range(nl - 1).second, size_};
  return layer_range(b - 1);
}

void ParamStore::init(uint64_t seed, double std) {
  // Filled on the host (the generator is host code) and uploaded to a device: the same
  // values wherever the store lives. Padding between tensors stays zero.
  const bool host = device_ == Device::kHost;
  std::vector<float> staging(host ? 0 : static_cast<size_t>(size_), 0.0f);
  float* base = host ? params() : staging.data();
  for (size_t i = 0; i < infos_.size(); ++i) {
    const ParamInfo& p = infos_[i];
    const TensorView v(base + p.offset, DType::kF32, p.shape);
    // A norm starts as the identity scale: w = 1, or 0 where the scale is (1 + w).
    // A bias starts at zero (as Hugging Face's _init_weights).
    if (p.kind == ParamKind::kNorm)
      fill_constant(v, 1.0f - config_.arch.norm_weight_offset);
    else if (p.kind == ParamKind::kBias)
      fill_constant(v, 0.0f);
    else
      fill_normal(v, seed ^ hash_string(p.name.c_str()), 0.0f, static_cast<float>(std));
    if (host) master_written(static_cast<int>(i));
  }
  if (!host) backend_for(device_).upload(staging.data(), params_.data(), params_.bytes());
  sync_bf16();
}

float* ParamStore::host_copy() {
  if (host_copy_.empty()) host_copy_.resize(static_cast<size_t>(size_));
  return host_copy_.data();
}

void ParamStore::params_to_host() const {
  if (device_ == Device::kHost) return;
  auto* self = const_cast<ParamStore*>(this);
  backend_for(device_).download(params_.data(), self->host_copy(), params_.bytes());
}

void ParamStore::params_to_device() {
  if (device_ != Device::kHost)
    backend_for(device_).upload(host_copy(), params_.data(), params_.bytes());
  sync_bf16();
}

void ParamStore::zero_grads() {
  if (grads_.empty()) return;
  backend_for(device_).zero(grads_.data(), grads_.bytes());
}

void ParamStore::sync_bf16() {
  if (bf16_.empty()) return;
  KernelBackend& k = backend_for(device_);
  if (dropped_.empty()) {
    k.convert(params_.data(), DType::kF32, bf16_.data(), DType::kBF16, static_cast<size_t>(size_));
    return;
  }
  // The ranges between dropped tensors (their bf16 is the only copy).
  auto convert = [&](int64_t begin, int64_t end) {
    if (end > begin)
      k.convert(params_.as<float>() + begin, DType::kF32, bf16_.as<bf16>() + begin, DType::kBF16,
                static_cast<size_t>(end - begin));
  };
  int64_t at = 0;
  for (size_t i = 0; i < infos_.size(); ++i) {
    if (!dropped_[i]) continue;
    convert(at, infos_[i].offset);
    at = infos_[i].offset + infos_[i].numel;
  }
  convert(at, size_);
}

std::vector<int> ParamStore::droppable() const {
  std::vector<int> out;
  for (const LayerParamIndex& p : layers_) {
    for (int i : {p.q, p.k, p.v, p.o}) out.push_back(i);
    if (!p.moe())
      for (int i : {p.gate, p.up, p.down}) out.push_back(i);
  }
  if (!tie_) out.push_back(lm_head_);
  return out;
}

std::vector<int> ParamStore::droppable_masters(const DecoderConfig& config) {
  ParamStore s;
  s.config_ = config;
  s.tie_ = config.tie_embeddings;
  s.describe();
  return s.droppable();
}

int64_t ParamStore::drop_matrix_masters(bool fresh) {
  HYP_CHECK(device_ == Device::kHost && has_bf16() && !has_grads(),
            "ParamStore: only a frozen host store with a bf16 copy can drop its f32 masters");
  if (dropped_.empty()) dropped_.assign(infos_.size(), false);
  int64_t released = 0;
  for (int i : droppable()) {
    if (dropped_[static_cast<size_t>(i)]) continue;
    dropped_[static_cast<size_t>(i)] = true;
    if (!fresh) drop_master(i);
    released += infos_[static_cast<size_t>(i)].numel;
  }
  return released;
}

void ParamStore::master_written(int i) {
  if (master_dropped(i)) drop_master(i);
}

void ParamStore::drop_master(int i) {
  const ParamInfo& p = infos_[static_cast<size_t>(i)];
  float* f = params_.as<float>() + p.offset;
  convert_f32_to_bf16(f, bf16_.as<bf16>() + p.offset, static_cast<size_t>(p.numel));
  release_pages(f, static_cast<size_t>(p.numel) * sizeof(float), true);
}

}  // namespace hyperion
