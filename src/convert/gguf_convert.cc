#include "convert/gguf_convert.h"

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "convert/family_formats.h"
#include "convert/hf_config.h"
#include "io/atomic_file.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "io/weight_files.h"
#include "kernels/block_quant.h"
#include "kernels/finite.h"
#include "kernels/quantize.h"
#include "model/param_store.h"
#include "tensor/convert.h"
#include "text/gguf_vocab.h"

namespace hyperion::convert {

namespace {

// The model, as config.json describes it (the one reader every command uses), and what
// GGUF needs besides.
struct GgufModel {
  DecoderConfig c;
  const FamilyInfo* family = nullptr;
  const GgufArch* gguf = nullptr;  // llama.cpp's architecture for the family
};

// llama.cpp reads a Mixtral as architecture "llama" with llama.expert_count experts per
// layer (llama-model.cpp's llama graph calls build_moe_ffn with softmax gating and
// norm_w = true: softmax over all experts -> top-k -> the k weights renormalised to sum 1).
// Anything it cannot express is refused here rather than written as a file that loads
// but computes another model.
void check_moe_representable(const hyperion::DecoderConfig& c, const std::string& where) {
  HYP_CHECK(c.norm_topk_prob,
            "{}: key 'norm_topk_prob' = false: llama.cpp's llama architecture always "
            "renormalises the top-k router probabilities (softmax -> top-k -> renormalise), so "
            "a model routed without renormalisation cannot be represented in GGUF",
            where);
  // Dense/MoE interleaving (hyperion-only keys): llama.cpp's llama architecture makes
  // every layer a mixture of experts once llama.expert_count is set.
  HYP_CHECK(c.first_dense_layers == 0,
            "{}: key 'hyperion_first_dense_layers' = {}: llama.cpp's llama architecture needs "
            "every layer to be a mixture of experts; dense/MoE interleaving cannot be "
            "represented in GGUF",
            where, c.first_dense_layers);
  HYP_CHECK(c.moe_layer_step == 1,
            "{}: key 'hyperion_moe_layer_step' = {}: llama.cpp's llama architecture needs every "
            "layer to be a mixture of experts; dense/MoE interleaving cannot be represented in "
            "GGUF",
            where, c.moe_layer_step);
}

// The model a config.json describes, with what llama.cpp cannot represent refused.
GgufModel model_of(const std::string& text, const std::string& where) {
  GgufModel g;
  g.c = decoder_config_from_hf_json(text, where);
  g.family = &family_info(g.c.arch.family);
  g.gguf = &gguf_arch(g.c.arch.family);
  if (g.c.is_moe()) check_moe_representable(g.c, where);
  // llama.cpp's llama, qwen2 and qwen3 graphs attend over the whole context; its gemma2
  // and gemma3 graphs fix what the GGUF cannot say (the layer pattern, Gemma 3's local RoPE
  // base, the attention scale, which caps apply), so a model that differs is refused.
  const DecoderArch& a = g.c.arch;
  const bool gemma2 = a.family == DecoderFamily::kGemma2, gemma3 = a.family == DecoderFamily::kGemma3;
  HYP_CHECK(a.sliding_window == 0 || gemma2 || gemma3,
            "{}: key 'sliding_window' = {}: llama.cpp's {} architecture has no sliding window, "
            "so a GGUF would attend over the whole context where this model does not",
            where, a.sliding_window, g.gguf->arch);
  if (gemma2 || gemma3) {
    const int64_t pattern = gemma2 ? 2 : 6;
    HYP_CHECK(a.sliding_window > 0 && a.sliding_window_pattern == pattern,
              "{}: layer_types: llama.cpp's {} graph makes one layer in {} global and gives "
              "the others a window; this model has window {} and pattern {}",
              where, g.gguf->arch, pattern, a.sliding_window, a.sliding_window_pattern);
    // llama.cpp scales by 1/sqrt(hidden_size / heads) for its "27B" model type (46 layers
    // of Gemma 2, 62 of Gemma 3) and by 1/sqrt(head_dim) otherwise.
    const bool big = g.c.n_layers == (gemma2 ? 46 : 62);
    const double scalar = a.query_pre_attn_scalar > 0 ? a.query_pre_attn_scalar : double(g.c.head_dim);
    const double expected = big ? double(g.c.dim / g.c.n_heads) : double(g.c.head_dim);
    HYP_CHECK(scalar == expected,
              "{}: key 'query_pre_attn_scalar' = {}: llama.cpp's {} graph scales scores by "
              "1/sqrt({}) for a model of {} layers",
              where, scalar, g.gguf->arch, expected, g.c.n_layers);
    HYP_CHECK(!gemma2 || (a.attn_logit_softcap > 0 && a.final_logit_softcap > 0),
              "{}: attn_logit_softcapping / final_logit_softcapping = {} / {}: llama.cpp's "
              "gemma2 graph always caps both",
              where, a.attn_logit_softcap, a.final_logit_softcap);
    HYP_CHECK(!gemma3 || (a.attn_logit_softcap == 0 && a.final_logit_softcap == 0),
              "{}: attn_logit_softcapping / final_logit_softcapping = {} / {} on a Gemma 3 "
              "model: llama.cpp's gemma3 graph has no soft caps",
              where, a.attn_logit_softcap, a.final_logit_softcap);
    HYP_CHECK(!gemma3 || a.local_rope_theta == 10000.0,
              "{}: key 'rope_local_base_freq' = {}: llama.cpp's gemma3 graph uses 10000", where,
              a.local_rope_theta);
  }
  // llama.cpp applies Llama 3.1's scaling through the rope_freqs tensor of its llama graph.
  HYP_CHECK(
      g.c.rope_scaling.type != RopeScaling::Type::kLlama3 || std::string(g.gguf->arch) == "llama",
      "{}: rope_scaling llama3 on a {} model: llama.cpp applies it in its llama "
      "architecture only",
      where, g.family->decoder_block);
  return g;
}

GgufModel read_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  const std::string where = fmt::format("gguf convert: {}: config.json", dir);
  std::string text;
  try {
    text = io::read_file(path);
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
  // What config.json says, and what llama.cpp cannot represent of it, is bad input (exit
  // status 2), as when a command loads the checkpoint.
  try {
    return model_of(text, where);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw_usage_error(e.what());
  }
}

GgufOutType parse_out_type(const std::string& dir, const std::string& s) {
  const std::optional<GgufOutType> t = parse_gguf_out_type(s);
  if (!t)
    fail("gguf convert: {}: unknown output type '{}' (expected f32, f16, bf16, q8_0, q4_0, "
         "q4_k_m, q5_k_m or q6_k)",
         dir, s);
  return *t;
}

// ---- llama-quantize's choice of tensor types (llama-quant.cpp), for the mixtures here.

enum class Category { kTokenEmbd, kAttnQ, kAttnV, kAttnK, kAttnOutput, kFfnUp, kFfnGate,
                      kFfnDown, kOutput, kOther };

// tensor_get_category: the first match, in llama.cpp's order (the fused attn_qkv and
// attn_kv_b of other architectures never occur here).
Category category_of(const std::string& name) {
  if (name == "output.weight") return Category::kOutput;
  if (name == "token_embd.weight") return Category::kTokenEmbd;
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (has("attn_v.weight")) return Category::kAttnV;
  if (has("attn_k.weight")) return Category::kAttnK;
  if (has("attn_q.weight")) return Category::kAttnQ;
  if (has("attn_output.weight")) return Category::kAttnOutput;
  if (has("ffn_up")) return Category::kFfnUp;
  if (has("ffn_gate")) return Category::kFfnGate;
  if (has("ffn_down")) return Category::kFfnDown;
  return Category::kOther;
}

// tensor_allows_quantization, for the tensors this converter writes.
bool quantizable(const std::string& name, const Shape& shape) {
  return shape.rank() >= 2 && name.ends_with("weight") &&
         name.find("_norm.weight") == std::string::npos &&
         name.find("ffn_gate_inp.weight") == std::string::npos;
}

// The first and last eighth of the layers and every third one between get more bits.
bool use_more_bits(int64_t i_layer, int64_t n_layers) {
  return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 ||
         (i_layer - n_layers / 8) % 3 == 2;
}

io::GgmlType base_type(GgufOutType t) {
  switch (t) {
    case GgufOutType::kF32:
      return io::GgmlType::kF32;
    case GgufOutType::kF16:
      return io::GgmlType::kF16;
    case GgufOutType::kBF16:
      return io::GgmlType::kBF16;
    case GgufOutType::kQ8_0:
      return io::GgmlType::kQ8_0;
    case GgufOutType::kQ4_0:
      return io::GgmlType::kQ4_0;
    case GgufOutType::kQ4_K_M:
      return io::GgmlType::kQ4_K;
    case GgufOutType::kQ5_K_M:
      return io::GgmlType::kQ5_K;
    case GgufOutType::kQ6_K:
      return io::GgmlType::kQ6_K;
  }
  return io::GgmlType::kF32;
}

// tensor_type_fallback, with q8_0 for llama.cpp's q5_0 and q5_1 (gguf_convert.h).
io::GgmlType fallback_type(io::GgmlType t, int64_t cols) {
  if (cols % io::ggml_block_size(t) == 0) return t;
  if (t == io::GgmlType::kQ4_K || t == io::GgmlType::kQ5_K || t == io::GgmlType::kQ6_K)
    t = io::GgmlType::kQ8_0;
  return cols % io::ggml_block_size(t) == 0 ? t : io::GgmlType::kF16;
}

// The layer number of a "blk.{i}." tensor name.
int64_t layer_of(const std::string& name, int64_t n_layers) {
  int64_t layer = -1;
  if (name.rfind("blk.", 0) == 0) {
    const size_t dot = name.find('.', 4);
    if (dot != std::string::npos && dot > 4) {
      try {
        layer = std::stoll(name.substr(4, dot - 4));
      } catch (const std::exception&) {
        layer = -1;
      }
    }
  }
  HYP_CHECK(layer >= 0 && layer < n_layers,
            "gguf convert: cannot determine the layer of tensor '{}' (of {} layers)", name,
            n_layers);
  return layer;
}

}  // namespace

std::optional<GgufOutType> parse_gguf_out_type(std::string_view name) {
  static constexpr std::pair<std::string_view, GgufOutType> kNames[] = {
      {"f32", GgufOutType::kF32},       {"f16", GgufOutType::kF16},
      {"bf16", GgufOutType::kBF16},     {"q8_0", GgufOutType::kQ8_0},
      {"q4_0", GgufOutType::kQ4_0},     {"q4_k_m", GgufOutType::kQ4_K_M},
      {"q5_k_m", GgufOutType::kQ5_K_M}, {"q6_k", GgufOutType::kQ6_K}};
  for (const auto& [n, t] : kNames)
    if (n == name) return t;
  return std::nullopt;
}

uint32_t gguf_file_type(GgufOutType type) {
  switch (type) {
    case GgufOutType::kF32:
      return 0;  // LLAMA_FTYPE_ALL_F32
    case GgufOutType::kF16:
      return 1;  // LLAMA_FTYPE_MOSTLY_F16
    case GgufOutType::kBF16:
      return 32;  // LLAMA_FTYPE_MOSTLY_BF16
    case GgufOutType::kQ8_0:
      return 7;  // LLAMA_FTYPE_MOSTLY_Q8_0
    case GgufOutType::kQ4_0:
      return 2;  // LLAMA_FTYPE_MOSTLY_Q4_0
    case GgufOutType::kQ4_K_M:
      return 15;  // LLAMA_FTYPE_MOSTLY_Q4_K_M
    case GgufOutType::kQ5_K_M:
      return 17;  // LLAMA_FTYPE_MOSTLY_Q5_K_M
    case GgufOutType::kQ6_K:
      return 18;  // LLAMA_FTYPE_MOSTLY_Q6_K
  }
  return 0;
}

std::vector<io::GgmlType> gguf_tensor_types(
    GgufOutType type, const GgufQuantModel& model,
    const std::vector<std::pair<std::string, Shape>>& tensors) {
  const io::GgmlType base = base_type(type);
  const bool mixture = type == GgufOutType::kQ8_0 || type == GgufOutType::kQ4_0 ||
                       type == GgufOutType::kQ4_K_M || type == GgufOutType::kQ5_K_M ||
                       type == GgufOutType::kQ6_K;
  const bool k_m = type == GgufOutType::kQ4_K_M || type == GgufOutType::kQ5_K_M;
  // quantize_state_impl's counters and the facts it reads.
  int64_t n_attn_v = 0;
  bool tied = true;  // llama.cpp assumes tied embeddings until it sees output.weight
  for (const auto& [name, shape] : tensors) {
    const Category c = category_of(name);
    if (c == Category::kAttnV) ++n_attn_v;
    if (c == Category::kOutput) tied = false;
  }
  const int64_t n_expert = model.n_experts;
  // llama.cpp's LLM_TYPE_70B: its llama graph's 80-layer models with grouped-query
  // attention (an 8-expert llama is "8x7B" instead), and qwen2's 80-layer models.
  const bool is_70b = model.n_layers == 80 &&
                      ((model.arch == "llama" && n_expert != 8 &&
                        model.n_heads != model.n_kv_heads) ||
                       model.arch == "qwen2");
  int64_t i_attn_v = 0, i_ffn_down = 0;
  std::vector<io::GgmlType> out;
  out.reserve(tensors.size());
  for (const auto& [name, shape] : tensors) {
    if (!quantizable(name, shape)) {
      out.push_back(io::GgmlType::kF32);
      continue;
    }
    const int64_t cols = shape.dim(-1);
    if (!mixture) {
      out.push_back(base);
      continue;
    }
    io::GgmlType t = base;
    const Category c = category_of(name);
    if (c == Category::kOutput || (tied && c == Category::kTokenEmbd)) {
      if (cols % io::ggml_block_size(base) != 0)
        t = io::GgmlType::kQ8_0;
      else if (t != io::GgmlType::kQ8_0)
        t = io::GgmlType::kQ6_K;
    } else if (c == Category::kAttnV) {
      if (k_m && use_more_bits(i_attn_v, n_attn_v)) t = io::GgmlType::kQ6_K;
      if (is_70b && t == io::GgmlType::kQ4_K) t = io::GgmlType::kQ5_K;
      if (n_expert == 8) t = io::GgmlType::kQ8_0;
      ++i_attn_v;
    } else if (c == Category::kAttnK) {
      if (n_expert == 8) t = io::GgmlType::kQ8_0;
    } else if (c == Category::kFfnDown) {
      const int64_t i_layer = n_expert > 1 ? layer_of(name, model.n_layers) : i_ffn_down;
      if (k_m && use_more_bits(i_layer, model.n_layers)) t = io::GgmlType::kQ6_K;
      ++i_ffn_down;
    } else if (c == Category::kAttnOutput) {
      if (n_expert == 8 && type == GgufOutType::kQ4_K_M) t = io::GgmlType::kQ5_K;
    }
    out.push_back(fallback_type(t, cols));
  }
  return out;
}

namespace {

// kernels' quantize_blocks, for the writer's Q4_0/K tensors (io cannot call kernels).
void quantize_with_kernels(io::GgmlType t, const float* src, unsigned char* dst, int64_t n) {
  const BlockFormat* f = block_format_of_ggml(static_cast<uint32_t>(t));
  HYP_CHECK(f != nullptr, "gguf convert: no block quantiser for {}", io::ggml_type_name(t));
  quantize_blocks(f->type, src, dst, n);
}

}  // namespace

void permute_rope_rows_for_gguf(const float* in, float* out, int64_t rows, int64_t cols,
                                int64_t n_head) {
  HYP_CHECK(n_head > 0 && rows % (2 * n_head) == 0,
            "permute_rope_rows_for_gguf: {} rows are not a multiple of 2 * n_head = {}", rows,
            2 * n_head);
  const int64_t hd = rows / n_head, half = hd / 2;
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t j = 0; j < half; ++j)
      for (int64_t t = 0; t < 2; ++t)
        std::memcpy(out + (h * hd + 2 * j + t) * cols, in + (h * hd + t * half + j) * cols,
                    size_t(cols) * sizeof(float));
}

namespace {

// Reads tensor `name` and refuses NaN or infinity: a GGUF of a diverged or corrupt
// checkpoint would load in llama.cpp and print nothing but garbage. Both, and a dtype that
// cannot be read, are bad input (exit status 2).
void read_finite(const io::SafetensorsFile& st, const std::string& name, const TensorView& dst) {
  try {
    st.read_into(name, dst);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw_usage_error(e.what());
  }
  const int64_t at = first_nonfinite(dst);
  HYP_USAGE_CHECK(at < 0,
            "gguf convert: {}: tensor {} {} holds a non-finite value ({}) at element {}: the "
            "checkpoint is corrupt or its training diverged; nothing was written",
            st.path(), name, dst.shape.str(), dst.as<float>()[at], at);
}

}  // namespace

namespace {

// What int8 quantised training (`quantization: int8`) trained the checkpoint's matrices
// with, from its trainer_state.json: "" (none or not a training checkpoint), or "int8"
// and whether the LM head was quantised too.
struct TrainedQuantization {
  bool int8 = false;
  bool logits = false;
};
TrainedQuantization read_trained_quantization(const std::string& dir) {
  TrainedQuantization q;
  const std::string path = dir + "/trainer_state.json";
  if (!std::filesystem::exists(path)) return q;
  try {
    const nlohmann::json st = nlohmann::json::parse(io::read_file(path));
    const nlohmann::json& cfg = st.at("config");
    q.int8 = cfg.value("quantization", std::string()) == "int8";
    q.logits = q.int8 && cfg.value("quantize_logits", std::string("false")) == "true";
  } catch (const nlohmann::json::exception& e) {
    fail("gguf convert: {}: invalid trainer state: {}", path, e.what());
  }
  return q;
}

// Q8_0 blocks holding a matrix's per-output-channel int8 weights as int8 training's
// forward read them (the f32 master weights through kernels/quantize.h's quantize_rows): every
// block of row r gets d = f16(scale[r]) and the row's int8 values unchanged. The one change is the
// scale's rounding to f16; its largest relative size is added to *max_scale_change.
void encode_q8_0_per_channel(const float* w, int64_t rows, int64_t cols, unsigned char* dst,
                             double* max_scale_change) {
  std::vector<int8_t> q(static_cast<size_t>(rows * cols));
  std::vector<float> scale(static_cast<size_t>(rows));
  quantize_rows(TensorView(const_cast<float*>(w), DType::kF32, {rows, cols}),
                TensorView(q.data(), DType::kI8, {rows, cols}), scale.data());
  constexpr int64_t kBlock = 32, kBlockBytes = 34;
  for (int64_t r = 0; r < rows; ++r) {
    const f16 d = f32_to_f16(scale[size_t(r)]);
    const float back = f16_to_f32(d);
    if (scale[size_t(r)] > 0)
      *max_scale_change = std::max(*max_scale_change,
                                   double(std::fabs(back - scale[size_t(r)]) / scale[size_t(r)]));
    for (int64_t b = 0; b < cols / kBlock; ++b) {
      unsigned char* blk = dst + (r * (cols / kBlock) + b) * kBlockBytes;
      std::memcpy(blk, &d.bits, 2);
      std::memcpy(blk + 2, q.data() + r * cols + b * kBlock, kBlock);
    }
  }
}

}  // namespace

void convert_checkpoint_to_gguf(const std::string& checkpoint_dir, const std::string& out_path,
                                const std::string& out_type) {
  const GgufOutType ot = parse_out_type(checkpoint_dir, out_type);
  const GgufModel g = read_config(checkpoint_dir);
  const hyperion::DecoderConfig& c = g.c;
  const FamilyInfo& fam = *g.family;
  const text::GgufVocab vocab = text::read_gguf_vocab(checkpoint_dir, c.vocab_size);
  // The single model.safetensors or a Hugging Face sharded layout (with its index).
  const io::WeightFiles files = [&] {
    try {
      return io::WeightFiles(checkpoint_dir);
    } catch (const Error& e) {
      fail("gguf convert: {}: {}", checkpoint_dir, e.what());
    }
  }();

  std::string name = std::filesystem::path(checkpoint_dir).lexically_normal().filename().string();
  if (name.empty())
    name =
        std::filesystem::path(checkpoint_dir).lexically_normal().parent_path().filename().string();
  if (name.empty() || name == ".") name = "hyperion";

  io::GgufWriter w;
  // Keys in the order convert_hf_to_gguf.py writes them, prefixed by llama.cpp's
  // architecture (the family's: llama for Llama, Mistral and Mixtral, gemma, gemma2, gemma3,
  // qwen2, qwen3).
  const std::string arch = g.gguf->arch;
  const DecoderFamily family = c.arch.family;
  const bool gemma = family == DecoderFamily::kGemma || family == DecoderFamily::kGemma2 ||
                     family == DecoderFamily::kGemma3;
  w.set_string("general.architecture", arch);
  w.set_string("general.name", name);
  w.set_u32("general.alignment", io::kGgufDefaultAlignment);
  w.set_u32(arch + ".block_count", uint32_t(c.n_layers));
  w.set_u32(arch + ".context_length", uint32_t(c.max_seq_len));
  w.set_u32(arch + ".embedding_length", uint32_t(c.dim));
  w.set_u32(arch + ".feed_forward_length", uint32_t(c.is_moe() ? c.expert_ffn_dim() : c.ffn_dim));
  w.set_u32(arch + ".attention.head_count", uint32_t(c.n_heads));
  w.set_u32(arch + ".attention.head_count_kv", uint32_t(c.n_kv_heads));
  w.set_f32(arch + ".rope.freq_base", float(c.rope_theta));
  w.set_f32(arch + ".attention.layer_norm_rms_epsilon", float(c.norm_eps));
  if (family == DecoderFamily::kGemma2) {
    w.set_f32(arch + ".attn_logit_softcapping", float(c.arch.attn_logit_softcap));
    w.set_f32(arch + ".final_logit_softcapping", float(c.arch.final_logit_softcap));
  }
  if (c.arch.sliding_window > 0)
    w.set_u32(arch + ".attention.sliding_window", uint32_t(c.arch.sliding_window));
  if (c.is_moe()) {  // with llama.feed_forward_length = intermediate_size, the expert's size
    w.set_u32(arch + ".expert_count", uint32_t(c.n_experts));
    w.set_u32(arch + ".expert_used_count", uint32_t(c.n_experts_per_tok));
  }
  // llama.cpp takes embedding_length / head_count unless these say otherwise; written
  // where head_dim differs from that, and always for Gemma (as convert_hf_to_gguf.py).
  if (c.head_dim * c.n_heads != c.dim || gemma) {
    w.set_u32(arch + ".attention.key_length", uint32_t(c.head_dim));
    w.set_u32(arch + ".attention.value_length", uint32_t(c.head_dim));
  }
  // RoPE scaling: linear and YaRN as metadata; Llama 3.1's as the rope_freqs tensor below.
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == RopeScaling::Type::kLinear || rs.type == RopeScaling::Type::kYarn) {
    w.set_string(arch + ".rope.scaling.type", rope_type_name(rs.type));
    w.set_f32(arch + ".rope.scaling.factor", float(rs.factor));
  }
  if (rs.type == RopeScaling::Type::kYarn) {
    w.set_u32(arch + ".rope.scaling.original_context_length", uint32_t(rs.original_max_positions));
    if (rs.beta_fast != 32.0) w.set_f32(arch + ".rope.scaling.yarn_beta_fast", float(rs.beta_fast));
    if (rs.beta_slow != 1.0) w.set_f32(arch + ".rope.scaling.yarn_beta_slow", float(rs.beta_slow));
    HYP_CHECK(rs.attention_factor == 0.0 && rs.mscale == 0.0,
              "gguf convert: {}: config.json: rope_scaling yarn with an explicit "
              "attention_factor or mscale: llama.cpp derives the factor from 'factor' alone",
              checkpoint_dir);
  }
  w.set_u32("general.file_type", gguf_file_type(ot));
  w.set_u32(arch + ".vocab_size", uint32_t(c.vocab_size));
  w.set_u32(arch + ".rope.dimension_count", uint32_t(c.head_dim));
  w.set_u32("general.quantization_version", 2);  // GGML_QNT_VERSION
  text::write_gguf_vocab(w, vocab, c.bos_id, c.eos_id, c.pad_id);

  std::set<std::string> used;
  // What errors name the weights by: the single file or the sharded layout's index.
  const std::string weights_name =
      std::filesystem::exists(std::filesystem::path(checkpoint_dir) / "model.safetensors")
          ? "model.safetensors"
          : "model.safetensors.index.json";
  // Checks that `hf` exists with shape `expect` and marks it as used.
  auto check = [&](const std::string& hf, const Shape& expect) {
    const io::SafetensorsTensor* t = files.find(hf);
    HYP_CHECK(t != nullptr, "gguf convert: {}: {}: missing tensor '{}'{}", checkpoint_dir,
              weights_name, hf,
              hf == "lm_head.weight" ? " (config.json has tie_word_embeddings = false)" : "");
    HYP_CHECK(t->shape == expect,
              "gguf convert: {}: {}: tensor '{}' has shape {} but config.json implies {} "
              "(hidden_size {}, intermediate_size {}, heads {}, kv heads {}, head_dim {}, "
              "vocab_size {}{})",
              checkpoint_dir, files.file_of(hf)->path(), hf, t->shape.str(), expect.str(), c.dim,
              c.is_moe() ? c.expert_ffn_dim() : c.ffn_dim, c.n_heads, c.n_kv_heads, c.head_dim,
              c.vocab_size, c.is_moe() ? fmt::format(", num_local_experts {}", c.n_experts) : "");
    used.insert(hf);
  };
  auto read = [&files](const std::string& hf, const TensorView& dst) {
    read_finite(*files.file_of(hf), hf, dst);
  };
  // Every tensor's type, chosen for the whole file at once as llama-quantize does
  // (gguf_tensor_types): 1-D tensors, norms and the MoE router stay f32; blocks run along
  // the last dimension, with llama.cpp's fallbacks where their size does not divide it.
  const std::vector<ParamInfo> layout = ParamStore::layout(c);
  const std::vector<std::string> gguf_names = gguf_tensor_names(c, layout);
  std::map<std::string, io::GgmlType> types;
  {
    std::vector<std::pair<std::string, Shape>> plan;
    for (size_t i = 0; i < layout.size(); ++i) {
      if (i > 0 && gguf_names[i] == gguf_names[i - 1]) continue;  // one stacked expert tensor
      Shape shape = layout[i].shape;
      if (layout[i].name.find(".experts.") != std::string::npos) {
        int64_t e = 0;
        for (size_t j = i; j < layout.size() && gguf_names[j] == gguf_names[i]; ++j) ++e;
        shape = Shape{e, shape[0], shape[1]};
      }
      plan.emplace_back(gguf_names[i], shape);
    }
    const GgufQuantModel qm{arch, c.n_layers, c.n_heads, c.n_kv_heads, c.n_experts};
    const std::vector<io::GgmlType> chosen = gguf_tensor_types(ot, qm, plan);
    int fallbacks = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
      types[plan[i].first] = chosen[i];
      const bool k = base_type(ot) == io::GgmlType::kQ4_K ||
                     base_type(ot) == io::GgmlType::kQ5_K || base_type(ot) == io::GgmlType::kQ6_K;
      if (k && chosen[i] != io::GgmlType::kF32 && plan[i].second.dim(-1) % 256 != 0) ++fallbacks;
    }
    if (fallbacks > 0)
      log_info(
          "gguf convert: {} matrices have rows that are not a multiple of 256 values: written "
          "as q8_0 (f16 where not a multiple of 32), where llama.cpp writes q5_0, q5_1 or q8_0",
          fallbacks);
  }
  w.set_block_quantizer(quantize_with_kernels);
  // (rope_freqs.weight, the one tensor not in the layout, is 1-D: f32.)
  auto type_for = [&](const std::string& gg, const Shape& shape) {
    if (auto it = types.find(gg); it != types.end()) return it->second;
    HYP_CHECK(shape.rank() <= 1, "gguf convert: {}: no type chosen for tensor '{}' {}",
              checkpoint_dir, gg, shape.str());
    return io::GgmlType::kF32;
  };
  // permute_heads > 0: apply the RoPE row permutation with that many heads (the llama
  // graph only: the others rotate halves as Hugging Face does). Norms whose scale is
  // (w + offset) (Gemma's 1 + w) are stored as that scale, which llama.cpp applies
  // (convert_hf_to_gguf.py does the same).
  // Matrices int8 training quantised per output channel go to Q8_0 as those int8 values.
  const TrainedQuantization tq = read_trained_quantization(checkpoint_dir);
  int per_channel_matrices = 0;
  double max_scale_change = 0;
  const float norm_offset = c.arch.norm_weight_offset;
  auto add = [&](const std::string& hf, const std::string& gg, Shape expect,
                 int64_t permute_heads) {
    check(hf, expect);
    const bool trained_int8 =
        tq.int8 && (gg.rfind("blk.", 0) == 0 || (tq.logits && gg == "output.weight")) &&
        expect.rank() == 2 && !gg.ends_with("_norm.weight") && !gg.ends_with(".ffn_gate_inp.weight");
    const int64_t cols = expect.rank() == 2 ? expect[1] : 1;
    if (trained_int8 && type_for(gg, expect) == io::GgmlType::kQ8_0) {
      ++per_channel_matrices;
      w.add_encoded_tensor(
          gg, expect,
          [read, hf, expect, cols, permute_heads, &max_scale_change](unsigned char* dst) {
            std::vector<float> tmp(size_t(expect.numel())), perm;
            read(hf, TensorView(tmp.data(), DType::kF32, expect));
            if (permute_heads > 0) {
              perm.resize(tmp.size());
              permute_rope_rows_for_gguf(tmp.data(), perm.data(), expect[0], cols, permute_heads);
              tmp.swap(perm);
            }
            encode_q8_0_per_channel(tmp.data(), expect[0], cols, dst, &max_scale_change);
          },
          io::GgmlType::kQ8_0);
      return;
    }
    const bool plus_offset = norm_offset != 0.0f && gg.ends_with("_norm.weight");
    w.add_tensor(
        gg, expect,
        [read, hf, expect, cols, permute_heads, plus_offset, norm_offset](float* dst) {
          if (permute_heads == 0) {
            read(hf, TensorView(dst, DType::kF32, expect));
            if (plus_offset)
              for (int64_t i = 0; i < expect.numel(); ++i) dst[i] += norm_offset;
            return;
          }
          std::vector<float> tmp(size_t(expect.numel()));
          read(hf, TensorView(tmp.data(), DType::kF32, expect));
          permute_rope_rows_for_gguf(tmp.data(), dst, expect[0], cols, permute_heads);
        },
        type_for(gg, expect));
  };
  // The E per-expert Hugging Face matrices (each of shape `expert`) stacked into one
  // [E, rows, cols] tensor, as convert_hf_to_gguf.py's torch.stack(dim=0); GGUF stores its
  // dims reversed, ne = [cols, rows, E], which is what llama.cpp's create_tensor expects
  // ({n_embd, n_ff, n_expert} for gate/up). Each expert is read straight into its slice
  // when the writer reaches the tensor, so only the stacked tensor being written is held
  // in f32.
  auto add_experts = [&](const std::vector<std::string>& names, const std::string& gg,
                         Shape expert) {
    for (const std::string& n : names) check(n, expert);
    const Shape stacked{int64_t(names.size()), expert[0], expert[1]};
    w.add_tensor(
        gg, stacked,
        [read, names, expert](float* dst) {
          for (size_t e = 0; e < names.size(); ++e)
            read(names[e], TensorView(dst + e * size_t(expert.numel()), DType::kF32, expert));
        },
        type_for(gg, stacked));
  };

  // Every tensor of the model, in the parameter layout's order, and its llama.cpp name
  // (convert/family_formats.cc).
  for (size_t i = 0; i < layout.size();) {
    const ParamInfo& p = layout[i];
    if (p.name.find(".experts.") != std::string::npos) {
      std::vector<std::string> names;
      size_t j = i;
      for (; j < layout.size() && gguf_names[j] == gguf_names[i]; ++j)
        names.push_back(layout[j].name);
      add_experts(names, gguf_names[i], p.shape);
      i = j;
      continue;
    }
    int64_t permute = 0;
    if (g.gguf->permute_qk) {
      if (p.name.ends_with("self_attn.q_proj.weight") || p.name.ends_with("self_attn.q_proj.bias"))
        permute = c.n_heads;
      if (p.name.ends_with("self_attn.k_proj.weight") || p.name.ends_with("self_attn.k_proj.bias"))
        permute = c.n_kv_heads;
    }
    add(p.name, gguf_names[i], p.shape, permute);
    ++i;
  }
  // A saved copy of the tied head is not needed: llama.cpp reuses token_embd when
  // output.weight is absent.
  if (c.tie_embeddings) used.insert("lm_head.weight");
  // Llama 3.1's scaled RoPE: llama.cpp divides each frequency by rope_freqs[i]
  // (convert_hf_to_gguf.py's generate_extra_tensors), the plain over the scaled one.
  if (rs.type == RopeScaling::Type::kLlama3) {
    const std::vector<double> plain = rope_inv_freq(c.head_dim, c.rope_theta, RopeScaling{});
    const std::vector<double> scaled = rope_inv_freq(c.head_dim, c.rope_theta, rs);
    std::vector<float> factors(plain.size());
    for (size_t i = 0; i < plain.size(); ++i) factors[i] = float(plain[i] / scaled[i]);
    const Shape shape{int64_t(factors.size())};
    w.add_tensor(
        "rope_freqs.weight", shape,
        [factors](float* dst) { std::copy(factors.begin(), factors.end(), dst); },
        type_for("rope_freqs.weight", shape));
  }

  // Anything left over would be silently dropped; llama.cpp's converter refuses too.
  std::vector<std::string> unused;
  for (const std::string& t : files.names())
    if (!used.count(t) && !t.ends_with(".rotary_emb.inv_freq")) unused.push_back(t);
  if (!unused.empty()) {
    std::string list;
    for (size_t i = 0; i < unused.size() && i < 5; ++i) list += (i ? ", '" : "'") + unused[i] + "'";
    fail("gguf convert: {}: {}: {} tensor(s) not part of a {}-layer {} model: {}{}",
         checkpoint_dir, weights_name, unused.size(), c.n_layers,
         c.is_moe() ? fmt::format("Mixtral ({} experts)", c.n_experts)
                    : std::string(fam.decoder_block),
         list, unused.size() > 5 ? ", ..." : "");
  }
  w.write(out_path);
  if (per_channel_matrices > 0)
    log_info(
        "gguf convert: {} matrices written from their per-channel int8 training weights: the "
        "int8 values are kept, each Q8_0 block takes its row's scale rounded to f16 (largest "
        "relative change {:.2e})",
        per_channel_matrices, max_scale_change);
}

}  // namespace hyperion::convert
