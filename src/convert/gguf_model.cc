#include "convert/gguf_model.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <filesystem>
#include <system_error>
#include <vector>

#include "base/error.h"
#include "convert/family_formats.h"
#include "convert/hf_config.h"
#include "kernels/block_quant.h"
#include "kernels/rope.h"

namespace hyperion::convert {

namespace {

// The GGUF architecture name -> the family, and the config.json model_type that says it.
struct ArchModel {
  DecoderFamily family;
  const char* model_type;
};

ArchModel arch_model(const io::GgufFile& f, const std::string& arch, bool moe) {
  static const DecoderFamily kFamilies[] = {DecoderFamily::kLlama,  DecoderFamily::kGemma,
                                            DecoderFamily::kGemma2, DecoderFamily::kGemma3,
                                            DecoderFamily::kQwen2,  DecoderFamily::kQwen3};
  std::string known;
  for (DecoderFamily fam : kFamilies) {
    const GgufArch& a = gguf_arch(fam);
    if (arch == a.arch) {
      if (fam == DecoderFamily::kLlama) return {fam, moe ? "mixtral" : "llama"};
      return {fam, hf_model_type(fam).model_type};
    }
    known += (known.empty() ? "" : ", ") + std::string(a.arch);
  }
  throw_usage_error(fmt::format(
      "{}: key 'general.architecture' = '{}': not an architecture hyperion runs (it reads {})",
      f.path(), arch, known));
}

bool is_integer(io::GgufType t) {
  using T = io::GgufType;
  return t == T::kU8 || t == T::kI8 || t == T::kU16 || t == T::kI16 || t == T::kU32 ||
         t == T::kI32 || t == T::kU64 || t == T::kI64;
}

// An integer key of any width. A per-layer array (models whose layers differ in heads or
// MLP width) is refused by name: every layer of this decoder has the same shape.
int64_t get_int(const io::GgufFile& f, const std::string& key) {
  const io::GgufType t = f.type(key);
  HYP_USAGE_CHECK(t != io::GgufType::kArray,
                  "{}: key '{}' is an array (a value per layer): hyperion's decoder gives every "
                  "layer the same shape",
                  f.path(), key);
  HYP_USAGE_CHECK(is_integer(t), "{}: key '{}' is a {}, not an integer", f.path(), key,
                  io::gguf_type_name(t));
  switch (t) {
    case io::GgufType::kU8: return f.get<uint8_t>(key);
    case io::GgufType::kI8: return f.get<int8_t>(key);
    case io::GgufType::kU16: return f.get<uint16_t>(key);
    case io::GgufType::kI16: return f.get<int16_t>(key);
    case io::GgufType::kU32: return f.get<uint32_t>(key);
    case io::GgufType::kI32: return f.get<int32_t>(key);
    case io::GgufType::kI64: return f.get<int64_t>(key);
    default: {
      const uint64_t v = f.get<uint64_t>(key);
      HYP_USAGE_CHECK(v < (uint64_t(1) << 62), "{}: key '{}' = {} is out of range", f.path(), key,
                      v);
      return static_cast<int64_t>(v);
    }
  }
}

// An f32 key holds the f32 rounding of the decimal a config.json gave (rms_norm_eps 1e-5
// is stored as 9.99999974738e-06): it is read as the shortest decimal that rounds to the
// same f32, so that the model's config equals the one converted (a config.json written
// from it says 1e-05 again, and the eps is the one the model was trained with).
double f32_as_decimal(float v) {
  char buf[32];
  const std::to_chars_result w = std::to_chars(buf, buf + sizeof(buf), v);
  double d = v;
  if (w.ec == std::errc() && std::isfinite(v)) std::from_chars(buf, w.ptr, d);
  return d;
}

double get_num(const io::GgufFile& f, const std::string& key) {
  const io::GgufType t = f.type(key);
  if (t == io::GgufType::kF32) return f32_as_decimal(f.get<float>(key));
  if (t == io::GgufType::kF64) return f.get<double>(key);
  return static_cast<double>(get_int(f, key));
}

// Llama 3.1's RoPE scaling, which convert_hf_to_gguf.py writes as the per-frequency
// divisors of rope_freqs.weight rather than as parameters: matched against the divisors
// of the parameters Llama 3.x models use (factor from the largest divisor).
nlohmann::json llama3_rope_scaling(const io::GgufFile& f, const io::GgufTensor& t, int64_t head_dim,
                                   double theta) {
  HYP_USAGE_CHECK(t.shape.rank() == 1 && t.shape[0] == head_dim / 2,
                  "{}: tensor rope_freqs.weight has shape {}; a model of head_dim {} needs [{}]",
                  f.path(), t.shape.str(), head_dim, head_dim / 2);
  const std::vector<float> got = f.dequantize(t.name);
  float largest = 0;
  for (float v : got) largest = std::max(largest, v);
  const double factor = f32_as_decimal(largest);  // the low frequencies' divisor
  const std::vector<double> plain = rope_inv_freq(head_dim, theta, RopeScaling{});
  for (int64_t orig : {8192, 4096, 2048, 16384, 32768, 65536, 131072})
    for (double low : {1.0, 2.0, 0.5})
      for (double high : {4.0, 8.0, 2.0, 1.0}) {
        if (high <= low) continue;
        RopeScaling s;
        s.type = RopeScaling::Type::kLlama3;
        s.factor = factor;
        s.low_freq_factor = low;
        s.high_freq_factor = high;
        s.original_max_positions = orig;
        const std::vector<double> scaled = rope_inv_freq(head_dim, theta, s);
        bool same = true;
        for (size_t i = 0; i < got.size() && same; ++i)
          same = std::fabs(plain[i] / scaled[i] - got[i]) <= 1e-4 * std::fabs(double(got[i]));
        if (same)
          return {{"rope_type", "llama3"},
                  {"factor", factor},
                  {"low_freq_factor", low},
                  {"high_freq_factor", high},
                  {"original_max_position_embeddings", orig}};
      }
  throw_usage_error(fmt::format(
      "{}: tensor rope_freqs.weight: per-frequency RoPE factors that no Llama 3 rope_scaling "
      "(factor {}, low/high frequency factors and an original context tried) produces",
      f.path(), factor));
}

}  // namespace

bool is_gguf_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

DecoderConfig decoder_config_from_gguf(const io::GgufFile& f) {
  HYP_USAGE_CHECK(f.has("general.architecture"), "{}: missing key 'general.architecture'",
                  f.path());
  const std::string arch = f.get_string("general.architecture");
  const std::string p = arch + ".";
  auto need = [&](const std::string& key) {
    HYP_USAGE_CHECK(f.has(p + key), "{}: missing key '{}{}'", f.path(), p, key);
    return get_int(f, p + key);
  };
  const bool moe = f.has(p + "expert_count") && get_int(f, p + "expert_count") > 0;
  const ArchModel am = arch_model(f, arch, moe);
  nlohmann::json j;
  j["model_type"] = am.model_type;
  j["num_hidden_layers"] = need("block_count");
  j["hidden_size"] = need("embedding_length");
  j["intermediate_size"] = need("feed_forward_length");
  const int64_t heads = need("attention.head_count");
  j["num_attention_heads"] = heads;
  j["num_key_value_heads"] = f.has(p + "attention.head_count_kv") ? get_int(f, p + "attention.head_count_kv") : heads;
  HYP_USAGE_CHECK(heads > 0, "{}: key '{}attention.head_count' = {} must be > 0", f.path(), p, heads);
  const int64_t dim = j["hidden_size"].get<int64_t>();
  const int64_t layers = j["num_hidden_layers"].get<int64_t>();
  int64_t head_dim = dim / heads;
  if (f.has(p + "attention.key_length")) {
    head_dim = get_int(f, p + "attention.key_length");
    const int64_t v = f.has(p + "attention.value_length") ? get_int(f, p + "attention.value_length") : head_dim;
    HYP_USAGE_CHECK(v == head_dim,
                    "{}: keys '{}attention.key_length' = {} and 'value_length' = {} differ: "
                    "hyperion's attention has one head size",
                    f.path(), p, head_dim, v);
  }
  j["head_dim"] = head_dim;
  if (f.has(p + "rope.dimension_count")) {
    const int64_t rd = get_int(f, p + "rope.dimension_count");
    HYP_USAGE_CHECK(rd == head_dim,
                    "{}: key '{}rope.dimension_count' = {}: RoPE on part of a head (head size "
                    "{}) is not supported",
                    f.path(), p, rd, head_dim);
  }
  if (f.has(p + "context_length")) j["max_position_embeddings"] = get_int(f, p + "context_length");
  if (f.has(p + "attention.layer_norm_rms_epsilon"))
    j["rms_norm_eps"] = get_num(f, p + "attention.layer_norm_rms_epsilon");
  const double theta = f.has(p + "rope.freq_base") ? get_num(f, p + "rope.freq_base") : hf_model_type(am.family).rope_theta;
  j["rope_theta"] = theta;
  // The vocabulary: the embedding's rows (what the weights need) over the metadata.
  const io::GgufTensor* embd = f.find("token_embd.weight");
  HYP_USAGE_CHECK(embd != nullptr && embd->shape.rank() == 2, "{}: no 2-D tensor 'token_embd.weight'",
                  f.path());
  j["vocab_size"] = embd->shape[0];
  j["tie_word_embeddings"] = f.find("output.weight") == nullptr;
  if (moe) {
    j["num_local_experts"] = get_int(f, p + "expert_count");
    HYP_USAGE_CHECK(f.has(p + "expert_used_count"), "{}: missing key '{}expert_used_count'", f.path(), p);
    j["num_experts_per_tok"] = get_int(f, p + "expert_used_count");
  }
  if (am.family == DecoderFamily::kLlama && f.find("blk.0.attn_q.bias") != nullptr)
    j["attention_bias"] = true;
  for (const char* key : {"bos_token_id", "eos_token_id", "padding_token_id"}) {
    const std::string k = std::string("tokenizer.ggml.") + key;
    if (f.has(k)) j[key == std::string("padding_token_id") ? "pad_token_id" : key] = get_int(f, k);
  }
  // Gemma 2 and 3: what llama.cpp's graphs fix (convert/gguf_convert.cc refuses a model
  // that differs): the caps, the window and its pattern, the attention scale.
  if (am.family == DecoderFamily::kGemma2 || am.family == DecoderFamily::kGemma3) {
    const bool g2 = am.family == DecoderFamily::kGemma2;
    HYP_USAGE_CHECK(f.has(p + "attention.sliding_window"), "{}: missing key '{}attention.sliding_window'",
                    f.path(), p);
    j["sliding_window"] = get_int(f, p + "attention.sliding_window");
    if (g2) {
      j["attn_logit_softcapping"] = f.has(p + "attn_logit_softcapping") ? get_num(f, p + "attn_logit_softcapping") : 50.0;
      j["final_logit_softcapping"] = f.has(p + "final_logit_softcapping") ? get_num(f, p + "final_logit_softcapping") : 30.0;
    } else {
      j["sliding_window_pattern"] = 6;
      j["rope_local_base_freq"] = 10000.0;
    }
    const bool big = layers == (g2 ? 46 : 62);
    j["query_pre_attn_scalar"] = big ? dim / heads : head_dim;
  }
  // RoPE scaling.
  if (f.has(p + "rope.scaling.type")) {
    const std::string type = f.get_string(p + "rope.scaling.type");
    if (type == "linear" || type == "yarn") {
      HYP_USAGE_CHECK(f.has(p + "rope.scaling.factor"), "{}: missing key '{}rope.scaling.factor'", f.path(), p);
      nlohmann::json rs = {{"rope_type", type}, {"factor", get_num(f, p + "rope.scaling.factor")}};
      if (type == "yarn") {
        HYP_USAGE_CHECK(f.has(p + "rope.scaling.original_context_length"),
                        "{}: missing key '{}rope.scaling.original_context_length'", f.path(), p);
        rs["original_max_position_embeddings"] = get_int(f, p + "rope.scaling.original_context_length");
        if (f.has(p + "rope.scaling.yarn_beta_fast")) rs["beta_fast"] = get_num(f, p + "rope.scaling.yarn_beta_fast");
        if (f.has(p + "rope.scaling.yarn_beta_slow")) rs["beta_slow"] = get_num(f, p + "rope.scaling.yarn_beta_slow");
      }
      j["rope_scaling"] = rs;
    } else {
      HYP_USAGE_CHECK(type == "none", "{}: key '{}rope.scaling.type' = '{}' (hyperion reads none, linear, yarn)",
                      f.path(), p, type);
    }
  }
  if (const io::GgufTensor* rf = f.find("rope_freqs.weight")) {
    HYP_USAGE_CHECK(am.family == DecoderFamily::kLlama && !j.contains("rope_scaling"),
                    "{}: tensor rope_freqs.weight on a {} model (read for Llama 3.x only)", f.path(), arch);
    j["rope_scaling"] = llama3_rope_scaling(f, *rf, head_dim, theta);
  }
  const std::string origin = f.path() + " (GGUF metadata)";
  try {
    return decoder_config_from_hf_json(j.dump(), origin);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw_usage_error(e.what());
  }
}

namespace {

// GGUF row r of a llama-architecture q/k matrix is Hugging Face's row
// source_row(r): convert_hf_to_gguf.py interleaves each head's two halves.
int64_t hf_row_of_gguf_row(int64_t r, int64_t head_dim) {
  const int64_t h = r / head_dim, i = r % head_dim, half = head_dim / 2;
  return h * head_dim + (i % 2) * half + i / 2;
}

// The expert index in a stacked expert's name ("...experts.3.w1.weight" -> 3).
int64_t expert_index(const std::string& name) {
  const size_t at = name.find(".experts.");
  return at == std::string::npos ? -1 : std::stoll(name.substr(at + 9));
}

}  // namespace

int load_gguf_weights(std::shared_ptr<const io::GgufFile> file, ParamStore& ps) {
  const io::GgufFile& f = *file;
  const DecoderConfig& c = ps.config();
  HYP_CHECK(ps.device() == Device::kHost, "{}: a GGUF model loads into a host store", f.path());
  const std::vector<ParamInfo>& infos = ps.infos();
  const std::vector<std::string> names = gguf_tensor_names(c, infos);
  const bool permute = gguf_arch(c.arch.family).permute_qk;
  // Which parameters are q/k rows (weights and biases) and with how many heads.
  std::map<int, int64_t> qk_heads;
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerParamIndex& li = ps.layer(l);
    qk_heads[li.q] = c.n_heads;
    qk_heads[li.k] = c.n_kv_heads;
    if (li.q_bias >= 0) qk_heads[li.q_bias] = c.n_heads;
    if (li.k_bias >= 0) qk_heads[li.k_bias] = c.n_kv_heads;
  }
  std::set<std::string> used;
  std::string cached_name;  // the last stacked expert tensor, dequantised once for its experts
  std::vector<float> cached;
  int held = 0;
  for (size_t idx = 0; idx < infos.size(); ++idx) {
    const int i = static_cast<int>(idx);
    const ParamInfo& info = infos[idx];
    const std::string& gg = names[idx];
    const io::GgufTensor* t = f.find(gg);
    HYP_USAGE_CHECK(t != nullptr, "{}: no tensor '{}' (the model's {} {})", f.path(), gg, info.name,
                    info.shape.str());
    used.insert(gg);
    const int64_t expert = expert_index(info.name);
    Shape expect = info.shape;
    if (expert >= 0) {
      std::vector<int64_t> dims = {c.n_experts};
      for (int d = 0; d < info.shape.rank(); ++d) dims.push_back(info.shape[d]);
      expect = Shape(dims.begin(), dims.end());
    }
    HYP_USAGE_CHECK(t->shape == expect,
                    "{}: tensor '{}' has shape {} but the metadata implies {} (the model's {})",
                    f.path(), gg, t->shape.str(), expect.str(), info.name);
    const BlockFormat* bf = block_format_of_ggml(static_cast<uint32_t>(t->type));
    const auto qk = permute ? qk_heads.find(i) : qk_heads.end();
    const int64_t hd = c.head_dim;
    const bool matrix = expert < 0 && info.shape.rank() == 2 &&
                        (info.kind == ParamKind::kMatrix || info.kind == ParamKind::kEmbedding);
    if (bf != nullptr && matrix && info.name.find(".gate.weight") == std::string::npos) {
      if (qk == qk_heads.end()) {
        ps.hold_in_blocks(i, bf->type, t->data, file, /*mapped=*/true);
      } else {
        // Rows back to Hugging Face's order, whole rows of blocks at a time.
        const size_t row = block_bytes(bf->type, info.shape[1]);
        auto rows = std::make_shared<std::vector<unsigned char>>(row * size_t(info.shape[0]));
        const auto* src = static_cast<const unsigned char*>(t->data);
        for (int64_t r = 0; r < info.shape[0]; ++r)
          std::memcpy(rows->data() + size_t(hf_row_of_gguf_row(r, hd)) * row, src + size_t(r) * row, row);
        ps.hold_in_blocks(i, bf->type, rows->data(), rows);
      }
      ++held;
      continue;
    }
    // Into the f32 master.
    std::vector<float> values;
    const float* v = nullptr;
    if (expert >= 0) {
      if (cached_name != gg) {
        cached = f.dequantize(gg);
        cached_name = gg;
      }
      v = cached.data() + expert * info.numel;
    } else {
      values = f.dequantize(gg);
      v = values.data();
    }
    float* dst = ps.param(i).as<float>();
    const int64_t cols = info.shape.rank() == 2 ? info.shape[1] : 1;
    if (qk != qk_heads.end()) {
      for (int64_t r = 0; r < info.shape[0]; ++r)
        std::memcpy(dst + hf_row_of_gguf_row(r, hd) * cols, v + r * cols, size_t(cols) * sizeof(float));
    } else {
      std::memcpy(dst, v, size_t(info.numel) * sizeof(float));
    }
    // Norms stored as the scale llama.cpp multiplies by (Gemma's 1 + w).
    if (gg.ends_with("_norm.weight") && c.arch.norm_weight_offset != 0.0f)
      for (int64_t e = 0; e < info.numel; ++e) dst[e] -= c.arch.norm_weight_offset;
  }
  std::string unused;
  for (const io::GgufTensor& t : f.tensors())
    if (!used.count(t.name) && t.name != "rope_freqs.weight") unused += (unused.empty() ? "" : ", ") + t.name;
  HYP_USAGE_CHECK(unused.empty(),
                  "{}: tensors the {} model has no place for: {} (a different architecture, or "
                  "a file hyperion would only half read)",
                  f.path(), family_info(c.arch.family).decoder_block, unused);
  if (ps.has_bf16()) ps.sync_bf16();
  return held;
}

int64_t gguf_weight_bytes(const std::string& path) {
  if (!is_gguf_file(path)) return -1;
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  return ec ? -1 : static_cast<int64_t>(size + size / 10);
}

std::string gguf_type_summary(const io::GgufFile& f) {
  std::map<std::string, int> count;
  for (const io::GgufTensor& t : f.tensors()) ++count[std::string(io::ggml_type_name(t.type))];
  std::string out;
  for (const auto& [name, n] : count) out += fmt::format("{}{} x {}", out.empty() ? "" : ", ", name, n);
  return out;
}

}  // namespace hyperion::convert
