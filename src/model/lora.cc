#include "model/lora.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "base/system_memory.h"
#include "kernels/backend.h"
#include "kernels/fill.h"
#include "kernels/gemm.h"

namespace hyperion {

namespace {

constexpr const char* kModuleNames[kLoraModules] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                    "gate_proj", "up_proj", "down_proj"};

constexpr const char* kPeftPrefix = "base_model.model.";

// The base parameter index of module m in layer indices p.
int module_index(const LayerParamIndex& p, LoraModule m) {
  switch (m) {
    case LoraModule::kQ: return p.q;
    case LoraModule::kK: return p.k;
    case LoraModule::kV: return p.v;
    case LoraModule::kO: return p.o;
    case LoraModule::kGate: return p.gate;
    case LoraModule::kUp: return p.up;
    case LoraModule::kDown: return p.down;
  }
  return -1;
}

bool is_mlp(LoraModule m) { return m >= LoraModule::kGate; }

std::string module_path(const std::string& base_name) {
  const std::string suffix = ".weight";
  HYP_CHECK(base_name.size() > suffix.size() &&
                base_name.compare(base_name.size() - suffix.size(), suffix.size(), suffix) == 0,
            "LoRA: base tensor {} is not a .weight matrix", base_name);
  return base_name.substr(0, base_name.size() - suffix.size());
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    std::string item = s.substr(at, comma - at);
    const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
    at = comma + 1;
  }
  return out;
}

}  // namespace

const char* lora_module_name(LoraModule m) { return kModuleNames[static_cast<int>(m)]; }

float LoraConfig::scale() const {
  HYP_CHECK(rank > 0, "LoRA: the scale of a rank-0 adapter");
  const double r = static_cast<double>(rank);
  return static_cast<float>(rslora ? alpha / std::sqrt(r) : alpha / r);
}

bool LoraConfig::targets_module(LoraModule m) const {
  return std::find(targets.begin(), targets.end(), m) != targets.end();
}

std::vector<LoraModule> parse_lora_targets(const std::vector<std::string>& names,
                                           const std::string& what) {
  bool want[kLoraModules] = {};
  HYP_USAGE_CHECK(!names.empty(), "{}: no target modules (use all-linear or names among q_proj, k_proj, "
                  "v_proj, o_proj, gate_proj, up_proj, down_proj)", what);
  for (const std::string& n : names) {
    if (n == "all-linear") {
      std::fill(std::begin(want), std::end(want), true);
      continue;
    }
    int found = -1;
    for (int m = 0; m < kLoraModules; ++m)
      if (n == kModuleNames[m]) found = m;
    HYP_USAGE_CHECK(found >= 0,
                    "{}: unknown target module '{}' (the adaptable ones: q_proj, k_proj, v_proj, "
                    "o_proj, gate_proj, up_proj, down_proj, or all-linear; lm_head and the "
                    "embedding are not adapted)",
                    what, n);
    want[found] = true;
  }
  std::vector<LoraModule> out;
  for (int m = 0; m < kLoraModules; ++m)
    if (want[m]) out.push_back(static_cast<LoraModule>(m));
  return out;
}

std::vector<LoraModule> parse_lora_targets(const std::string& list, const std::string& what) {
  return parse_lora_targets(split_list(list), what);
}

std::string lora_a_name(const std::string& base_name) {
  return kPeftPrefix + module_path(base_name) + ".lora_A.weight";
}
std::string lora_b_name(const std::string& base_name) {
  return kPeftPrefix + module_path(base_name) + ".lora_B.weight";
}

std::vector<ParamSpec> lora_layout(const DecoderConfig& config, const LoraConfig& lora) {
  HYP_USAGE_CHECK(lora.rank > 0, "config key lora_rank: must be >= 1 for adapters, got {}", lora.rank);
  const std::vector<ParamInfo> base = ParamStore::layout(config);
  std::vector<ParamSpec> out;
  for (const ParamInfo& p : base) {
    if (p.layer < 0 || p.kind != ParamKind::kMatrix) continue;
    for (LoraModule m : lora.targets) {
      const std::string leaf = std::string(is_mlp(m) ? "mlp." : "self_attn.") + lora_module_name(m) + ".weight";
      if (p.name.size() < leaf.size() || p.name.compare(p.name.size() - leaf.size(), leaf.size(), leaf) != 0)
        continue;
      const int64_t out_dim = p.shape[0], in_dim = p.shape[1];
      out.push_back({lora_a_name(p.name), Shape{lora.rank, in_dim}, p.layer, ParamKind::kMatrix});
      out.push_back({lora_b_name(p.name), Shape{out_dim, lora.rank}, p.layer, ParamKind::kMatrix});
    }
  }
  return out;
}

namespace {

const LoraConfig& checked(const ParamStore& base, const LoraConfig& config) {
  const DecoderConfig& c = base.config();
  HYP_USAGE_CHECK(config.rank > 0, "config key lora_rank: must be >= 1 for adapters, got {}", config.rank);
  HYP_USAGE_CHECK(config.alpha > 0 && std::isfinite(config.alpha), "config key lora_alpha: must be > 0, got {}",
                  config.alpha);
  HYP_USAGE_CHECK(config.dropout >= 0 && config.dropout < 1, "config key lora_dropout: must be in [0, 1), got {}",
                  config.dropout);
  HYP_USAGE_CHECK(!config.targets.empty(), "config key lora_target_modules: no modules");
  const int64_t smallest = std::min({c.dim, c.q_dim(), c.kv_dim(), c.ffn_dim});
  HYP_USAGE_CHECK(config.rank <= smallest,
                  "config key lora_rank: {} exceeds the smallest adapted dimension ({}) of the model",
                  config.rank, smallest);
  if (c.n_experts > 0)
    for (LoraModule m : config.targets)
      HYP_USAGE_CHECK(!is_mlp(m) || c.first_dense_layers >= c.n_layers,
                      "config key lora_target_modules: {} of a mixture-of-experts model's experts is "
                      "not adaptable yet (target the attention: q_proj, k_proj, v_proj, o_proj)",
                      lora_module_name(m));
  return config;
}

}  // namespace

LoraAdapter::LoraAdapter(const ParamStore& base, const LoraConfig& config, bool gradients, bool bf16_copy)
    : config_(checked(base, config)),
      scale_(config.scale()),
      store_(base.config(), lora_layout(base.config(), config), ParamBuffers{bf16_copy, gradients},
             backend_for(base.device()).allocator()) {
  a_of_.assign(base.infos().size(), -1);
  base_of_.assign(store_.infos().size(), -1);
  for (int l = 0; l < base.config().n_layers; ++l) {
    const LayerParamIndex& p = base.layer(l);
    for (LoraModule m : config_.targets) {
      const int bi = module_index(p, m);
      if (bi < 0 || (p.moe() && is_mlp(m))) continue;
      const std::string a = lora_a_name(base.infos()[static_cast<size_t>(bi)].name);
      for (size_t i = 0; i < store_.infos().size(); ++i)
        if (store_.infos()[i].name == a) {
          a_of_[static_cast<size_t>(bi)] = static_cast<int>(i);
          base_of_[i] = base_of_[i + 1] = bi;
        }
    }
  }
}

void LoraAdapter::init(uint64_t seed) {
  const bool host = store_.device() == Device::kHost;
  std::vector<float> staging(host ? 0 : static_cast<size_t>(store_.size()), 0.0f);
  float* base = host ? store_.params() : staging.data();
  for (size_t i = 0; i < store_.infos().size(); ++i) {
    const ParamInfo& p = store_.infos()[i];
    const TensorView v(base + p.offset, DType::kF32, p.shape);
    if (i % 2 == 0) {  // A [r, in]
      const float bound = 1.0f / std::sqrt(static_cast<float>(p.shape[1]));
      fill_uniform(v, seed ^ hash_string(p.name.c_str()), -bound, bound);
    } else {
      fill_constant(v, 0.0f);
    }
  }
  if (!host) backend_for(store_.device()).upload(staging.data(), store_.params(), static_cast<size_t>(store_.size()) * 4);
  store_.sync_bf16();
}

int64_t LoraAdapter::elements() const {
  int64_t n = 0;
  for (const ParamInfo& p : store_.infos()) n += p.numel;
  return n;
}

std::string lora_target_list(const LoraConfig& lora) {
  if (static_cast<int>(lora.targets.size()) == kLoraModules) return "all-linear";
  std::string out;
  for (LoraModule m : lora.targets) {
    if (!out.empty()) out += ',';
    out += lora_module_name(m);
  }
  return out;
}

MemoryPlan lora_memory_plan(const MemoryPlan& full, const DecoderConfig& config, const LoraConfig& lora,
                            bool bf16, int64_t tokens, bool bf16_only_matrices) {
  int64_t e = 0;
  for (const ParamSpec& s : lora_layout(config, lora)) e += s.shape.numel();
  MemoryPlan m = full;
  if (bf16 && bf16_only_matrices && m.weight_bytes != kSaturatedBytes) {
    const std::vector<ParamInfo> infos = ParamStore::layout(config);
    for (int i : ParamStore::droppable_masters(config))
      m.weight_bytes -= 4 * infos[static_cast<size_t>(i)].numel;
  }
  m.weight_bytes = sat_add(m.weight_bytes, 4 * e);
  if (bf16) m.compute_weight_bytes = sat_add(m.compute_weight_bytes, 2 * e);
  m.grad_bytes = 4 * e;
  m.optimizer_bytes = 8 * e;
  m.scratch_bytes = sat_add(m.scratch_bytes, sat_mul(2 * tokens * lora.rank, bf16 ? 2 : 4));
  if (lora.dropout > 0) {  // the dropped input, then its gradient's term in f32: [n, in]
    int64_t in = 0;
    for (const ParamSpec& s : lora_layout(config, lora))
      if (s.name.find("lora_A") != std::string::npos) in = std::max(in, s.shape[1]);
    m.scratch_bytes = sat_add(m.scratch_bytes, sat_mul(tokens * in, 4));
  }
  return m;
}

double lora_train_flops_per_token(const DecoderConfig& config, const LoraConfig& lora, int64_t seq_len) {
  int64_t e = 0;
  for (const ParamSpec& s : lora_layout(config, lora)) e += s.shape.numel();
  return config.train_flops_per_token(seq_len) - 2.0 * double(config.active_non_embedding_params()) +
         6.0 * double(e);
}

void merge_lora(const LoraAdapter& adapter, ParamStore& base) {
  KernelBackend& k = backend_for(base.device());
  const ParamStore& s = adapter.store();
  for (size_t i = 0; i + 1 < s.infos().size(); i += 2) {
    const int bi = adapter.base_of(static_cast<int>(i));
    const TensorView a = s.param(static_cast<int>(i)), b = s.param(static_cast<int>(i) + 1);
    const TensorView w = base.param(bi);
    // W [out, in] += s * B [out, r] A [r, in]
    GemmArgs g = contiguous_gemm_args(Trans::kN, Trans::kN, w.shape[0], w.shape[1], a.shape[0], b.data,
                                      DType::kF32, a.data, DType::kF32, w.data, DType::kF32, 1.0f);
    g.alpha = adapter.scale();
    k.gemm(g);
  }
  base.sync_bf16();
  if (base.device() != Device::kHost) base.params_to_host();
}

}  // namespace hyperion
