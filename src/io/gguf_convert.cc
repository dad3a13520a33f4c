#include "io/gguf_convert.h"

#include <sentencepiece_processor.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "io/atomic_file.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "kernels/finite.h"
#include "kernels/quantize.h"
#include "tensor/convert.h"

namespace hyperion::io {

namespace {

using json = nlohmann::json;

// llama.cpp's LlamaFileType values for general.file_type.
constexpr uint32_t kFileTypeF32 = 0, kFileTypeF16 = 1, kFileTypeQ8_0 = 7, kFileTypeBF16 = 32;
// llama.cpp's token types (tokenizer.ggml.token_type).
constexpr int32_t kTokNormal = 1, kTokUnknown = 2, kTokControl = 3, kTokUnused = 5, kTokByte = 6;

// Hugging Face LlamaConfig / MixtralConfig fields we use.
struct LlamaConfig {
  int64_t vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
      num_key_value_heads, max_position_embeddings, head_dim;
  double rms_norm_eps, rope_theta;
  bool tie_word_embeddings;
  bool has_head_dim;                                 // head_dim given explicitly in config.json
  int64_t bos_token_id, eos_token_id, pad_token_id;  // pad: -1 if absent
  // Mixtral (model_type "mixtral"): every layer's MLP is a mixture of num_local_experts
  // SwiGLU experts of intermediate_size, num_experts_per_tok of them used per token.
  bool moe;
  bool gemma;  // llama.cpp's "gemma" architecture: (1 + w) norms stored as 1 + w, no RoPE
               // permutation
  int64_t num_local_experts, num_experts_per_tok;  // 0 for a dense model
};

// Reads typed keys of config.json; every error names the directory, the file and the key.
class ConfigReader {
 public:
  ConfigReader(const json& j, std::string where) : j_(j), where_(std::move(where)) {}

  const json* find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  int64_t integer(const char* key, std::optional<int64_t> fallback = std::nullopt,
                  int64_t min = 1) const {
    const json* v = find(key);
    if (v == nullptr) {
      HYP_CHECK(fallback.has_value(), "{}: missing key '{}'", where_, key);
      return *fallback;
    }
    // Some configs give a list of ids (e.g. several eos tokens); the first is the primary.
    if (v->is_array() && !v->empty()) v = &(*v)[0];
    HYP_CHECK(v->is_number_integer(), "{}: key '{}' = {} is not an integer", where_, key,
              v->dump());
    const int64_t x = v->get<int64_t>();
    HYP_CHECK(x >= min, "{}: key '{}' = {} must be >= {}", where_, key, x, min);
    return x;
  }
  double number(const char* key, std::optional<double> fallback = std::nullopt) const {
    const json* v = find(key);
    if (v == nullptr) {
      HYP_CHECK(fallback.has_value(), "{}: missing key '{}'", where_, key);
      return *fallback;
    }
    HYP_CHECK(v->is_number(), "{}: key '{}' = {} is not a number", where_, key, v->dump());
    const double x = v->get<double>();
    HYP_CHECK(x > 0, "{}: key '{}' = {} must be positive", where_, key, x);
    return x;
  }
  bool boolean(const char* key, bool fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    HYP_CHECK(v->is_boolean(), "{}: key '{}' = {} is not a boolean", where_, key, v->dump());
    return v->get<bool>();
  }
  const std::string& where() const { return where_; }

 private:
  const json& j_;
  std::string where_;
};

// llama.cpp reads a Mixtral as architecture "llama" with llama.expert_count experts per
// layer (llama-model.cpp's llama graph calls build_moe_ffn with softmax gating and
// norm_w = true: softmax over all experts -> top-k -> the k weights renormalised to sum 1).
// Anything it cannot express is refused here rather than written as a file that loads
// but computes another model.
void read_moe_config(const ConfigReader& r, LlamaConfig* c) {
  const std::string& where = r.where();
  c->num_local_experts = r.integer("num_local_experts", 8);  // MixtralConfig's defaults
  c->num_experts_per_tok = r.integer("num_experts_per_tok", 2);
  HYP_CHECK(c->num_experts_per_tok <= c->num_local_experts,
            "{}: key 'num_experts_per_tok' = {} exceeds num_local_experts = {}", where,
            c->num_experts_per_tok, c->num_local_experts);
  // Mixtral always renormalises; hyperion records its choice in norm_topk_prob.
  HYP_CHECK(r.boolean("norm_topk_prob", true),
            "{}: key 'norm_topk_prob' = false: llama.cpp's llama architecture always "
            "renormalises the top-k router probabilities (softmax -> top-k -> renormalise), so "
            "a model routed without renormalisation cannot be represented in GGUF",
            where);
  // Dense/MoE interleaving (hyperion-only keys): llama.cpp's llama architecture makes
  // every layer a mixture of experts once llama.expert_count is set.
  const int64_t first_dense = r.integer("hyperion_first_dense_layers", 0, 0);
  HYP_CHECK(first_dense == 0,
            "{}: key 'hyperion_first_dense_layers' = {}: llama.cpp's llama architecture needs "
            "every layer to be a mixture of experts; dense/MoE interleaving cannot be "
            "represented in GGUF",
            where, first_dense);
  const int64_t step = r.integer("hyperion_moe_layer_step", 1, 1);
  HYP_CHECK(step == 1,
            "{}: key 'hyperion_moe_layer_step' = {}: llama.cpp's llama architecture needs every "
            "layer to be a mixture of experts; dense/MoE interleaving cannot be represented in "
            "GGUF",
            where, step);
  r.integer("hyperion_dense_intermediate_size", 1);  // unused without dense layers; type check
}

LlamaConfig read_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  const std::string where = fmt::format("gguf convert: {}: config.json", dir);
  std::string text;
  try {
    text = read_file(path);
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", where, e.what());
  }
  HYP_CHECK(j.is_object(), "{}: expected a JSON object, got a {}", where, j.type_name());
  ConfigReader r(j, where);
  // Without model_type, the architecture decides (as for transformers' AutoConfig users).
  std::string model_type = "llama";
  if (const json* mt = r.find("model_type")) {
    HYP_CHECK(mt->is_string() &&
                  (mt->get<std::string>() == "llama" || mt->get<std::string>() == "mixtral" ||
                   mt->get<std::string>() == "gemma"),
              "{}: key 'model_type' = {}; only \"llama\", \"mixtral\" and \"gemma\" "
              "checkpoints can be converted",
              where, mt->dump());
    model_type = mt->get<std::string>();
  } else if (const json* arch = r.find("architectures"); arch != nullptr && arch->is_array() &&
                                                         !arch->empty() &&
                                                         (*arch)[0] == "MixtralForCausalLM") {
    model_type = "mixtral";
  } else if (const json* arch2 = r.find("architectures"); arch2 != nullptr && arch2->is_array() &&
                                                          !arch2->empty() &&
                                                          (*arch2)[0] == "GemmaForCausalLM") {
    model_type = "gemma";
  }
  // hyperion_* keys change the model (hyperion writes them only for what Hugging Face
  // cannot express); one this converter does not know must not be silently ignored.
  for (const auto& [key, value] : j.items())
    HYP_CHECK(!key.starts_with("hyperion_") || key == "hyperion_dense_intermediate_size" ||
                  key == "hyperion_first_dense_layers" || key == "hyperion_moe_layer_step",
              "{}: unknown key '{}' = {}", where, key, value.dump());
  // Scaled RoPE changes the model; writing it without the rope.scaling keys would produce a
  // file that loads but generates garbage.
  HYP_CHECK(r.find("rope_scaling") == nullptr,
            "{}: key 'rope_scaling' = {} is not supported by this converter", where,
            j["rope_scaling"].dump());

  LlamaConfig c{};
  c.vocab_size = r.integer("vocab_size");
  c.hidden_size = r.integer("hidden_size");
  c.intermediate_size = r.integer("intermediate_size");
  c.num_hidden_layers = r.integer("num_hidden_layers");
  c.num_attention_heads = r.integer("num_attention_heads");
  // Defaults as in transformers' LlamaConfig.
  c.num_key_value_heads = r.integer("num_key_value_heads", c.num_attention_heads);
  c.max_position_embeddings = r.integer("max_position_embeddings");
  c.rms_norm_eps = r.number("rms_norm_eps");
  // Defaults of transformers' LlamaConfig / MixtralConfig.
  c.rope_theta = r.number("rope_theta", model_type == "mixtral" ? 1e6 : 10000.0);
  // GemmaConfig ties by default.
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", model_type == "gemma");
  c.bos_token_id = r.integer("bos_token_id", 1, 0);
  c.eos_token_id = r.integer("eos_token_id", 2, 0);
  c.pad_token_id = r.integer("pad_token_id", -1, 0);

  HYP_CHECK(c.num_attention_heads % c.num_key_value_heads == 0,
            "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}", where,
            c.num_attention_heads, c.num_key_value_heads);
  // head_dim defaults to hidden_size / num_attention_heads (LlamaConfig) but may be set
  // independently; then q_proj is [heads * head_dim, hidden_size].
  c.has_head_dim = r.find("head_dim") != nullptr;
  if (c.has_head_dim) {
    c.head_dim = r.integer("head_dim");
  } else {
    HYP_CHECK(c.hidden_size % c.num_attention_heads == 0,
              "{}: hidden_size {} is not divisible by num_attention_heads {} (and no head_dim)",
              where, c.hidden_size, c.num_attention_heads);
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  HYP_CHECK(c.head_dim % 2 == 0, "{}: head_dim {} is odd; RoPE rotates pairs", where, c.head_dim);
  for (const auto& [key, id] :
       {std::pair{"bos_token_id", c.bos_token_id}, std::pair{"eos_token_id", c.eos_token_id},
        std::pair{"pad_token_id", c.pad_token_id}})
    HYP_CHECK(id < c.vocab_size, "{}: key '{}' = {} is outside the vocabulary (vocab_size {})",
              where, key, id, c.vocab_size);
  // llama.cpp's llama graph has no sliding-window attention (Mistral/Mixtral's option).
  if (const json* sw = r.find("sliding_window")) {
    const int64_t window = r.integer("sliding_window");
    HYP_CHECK(window >= c.max_position_embeddings,
              "{}: key 'sliding_window' = {} (< max_position_embeddings {}): sliding-window "
              "attention is not supported by llama.cpp's llama architecture",
              where, sw->dump(), c.max_position_embeddings);
  }

  c.moe = model_type == "mixtral";
  c.gemma = model_type == "gemma";
  c.num_local_experts = c.num_experts_per_tok = 0;
  if (c.moe) read_moe_config(r, &c);
  return c;
}

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  int64_t unk_id = -1;
  // The normalizer settings llama.cpp's SentencePiece tokenizer must reproduce.
  std::string normalizer = "identity";
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
};

// Reads a protobuf varint at p (bounded by end); false on truncation.
bool read_varint(const unsigned char*& p, const unsigned char* end, uint64_t* out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64 && p < end; shift += 7) {
    const unsigned char b = *p++;
    v |= uint64_t(b & 0x7F) << shift;
    if (!(b & 0x80)) {
      *out = v;
      return true;
    }
  }
  return false;
}

// ModelProto.normalizer_spec (field 3): name (1), add_dummy_prefix (3),
// remove_extra_whitespaces (4). Debian's SentencePiece ships no generated proto header,
// so the serialized model is walked directly (wire types 0, 1, 2 and 5 only).
void read_normalizer(const std::string& proto, Vocab* v) {
  auto walk = [](const unsigned char* p, const unsigned char* end, auto&& on_field) {
    while (p < end) {
      uint64_t key = 0;
      if (!read_varint(p, end, &key)) return;
      const uint32_t field = uint32_t(key >> 3), wire = uint32_t(key & 7);
      uint64_t value = 0;
      if (wire == 0) {
        if (!read_varint(p, end, &value)) return;
        on_field(field, wire, value, nullptr, 0);
      } else if (wire == 2) {
        if (!read_varint(p, end, &value) || value > uint64_t(end - p)) return;
        on_field(field, wire, 0, p, size_t(value));
        p += value;
      } else if (wire == 1 || wire == 5) {
        const size_t n = wire == 1 ? 8 : 4;
        if (size_t(end - p) < n) return;
        p += n;
      } else {
        return;
      }
    }
  };
  const auto* begin = reinterpret_cast<const unsigned char*>(proto.data());
  walk(begin, begin + proto.size(),
       [&](uint32_t field, uint32_t wire, uint64_t, const unsigned char* data, size_t n) {
         if (field != 3 || wire != 2) return;
         walk(data, data + n,
              [&](uint32_t f, uint32_t w, uint64_t value, const unsigned char* d, size_t len) {
                if (f == 1 && w == 2) v->normalizer.assign(reinterpret_cast<const char*>(d), len);
                if (f == 3 && w == 0) v->add_dummy_prefix = value != 0;
                if (f == 4 && w == 0) v->remove_extra_whitespaces = value != 0;
              });
       });
}

// As convert_hf_to_gguf.py's _create_vocab_sentencepiece: pieces, scores and types from
// the SentencePiece model, padded up to the config's vocab_size with "[PADi]" entries of
// score -10000 and type UNUSED.
Vocab read_vocab(const std::string& dir, int64_t vocab_size) {
  const std::string path = (std::filesystem::path(dir) / "tokenizer.model").string();
  HYP_CHECK(std::filesystem::exists(path) ||
                !std::filesystem::exists(std::filesystem::path(dir) / "tokenizer.json"),
            "gguf convert: {}: the tokenizer is a Hugging Face tokenizer.json; GGUF export "
            "writes SentencePiece vocabularies (tokenizer.model) only. Export to safetensors "
            "instead (`convert --to safetensors`), which llama.cpp's convert_hf_to_gguf.py reads",
            dir);
  sentencepiece::SentencePieceProcessor sp;
  const auto status = sp.Load(path);
  HYP_CHECK(status.ok(),
            "gguf convert: {}: tokenizer.model: cannot load SentencePiece model '{}': {}", dir,
            path, status.ToString());
  const int64_t n = sp.GetPieceSize();
  HYP_CHECK(n <= vocab_size,
            "gguf convert: {}: tokenizer.model has {} pieces but config.json vocab_size is {}", dir,
            n, vocab_size);
  Vocab v;
  v.tokens.resize(size_t(vocab_size));
  v.scores.assign(size_t(vocab_size), -10000.0f);
  v.types.assign(size_t(vocab_size), kTokUnused);
  for (int64_t i = 0; i < vocab_size; ++i) v.tokens[size_t(i)] = fmt::format("[PAD{}]", i);
  for (int id = 0; id < static_cast<int>(n); ++id) {
    int32_t type = kTokNormal;
    if (sp.IsUnknown(id))
      type = kTokUnknown;
    else if (sp.IsControl(id))
      type = kTokControl;
    else if (sp.IsUnused(id))
      type = kTokUnused;
    else if (sp.IsByte(id))
      type = kTokByte;
    v.tokens[size_t(id)] = sp.IdToPiece(id);
    v.scores[size_t(id)] = sp.GetScore(id);
    v.types[size_t(id)] = type;
  }
  v.unk_id = sp.unk_id();
  read_normalizer(sp.serialized_model_proto(), &v);
  // llama.cpp's "llama" tokenizer neither normalises text nor collapses whitespace, so a
  // model that does would tokenize differently there: refuse rather than write a GGUF
  // that silently disagrees with training.
  HYP_CHECK(v.normalizer == "identity" && !v.remove_extra_whitespaces,
            "gguf convert: {}: tokenizer.model: normalizer '{}' with remove_extra_whitespaces={} "
            "is not reproduced by llama.cpp's SentencePiece tokenizer (train the tokenizer with "
            "--normalization_rule_name=identity --remove_extra_whitespaces=false)",
            dir, v.normalizer, v.remove_extra_whitespaces);
  return v;
}

struct OutType {
  GgmlType matrix;  // type of 2-D weights
  uint32_t file_type;
};

OutType parse_out_type(const std::string& dir, const std::string& s) {
  if (s == "f32") return {GgmlType::kF32, kFileTypeF32};
  if (s == "f16") return {GgmlType::kF16, kFileTypeF16};
  if (s == "bf16") return {GgmlType::kBF16, kFileTypeBF16};
  if (s == "q8_0") return {GgmlType::kQ8_0, kFileTypeQ8_0};
  fail("gguf convert: {}: unknown output type '{}' (expected f32, f16, bf16 or q8_0)", dir, s);
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
// checkpoint would load in llama.cpp and print nothing but garbage.
void read_finite(const SafetensorsFile& st, const std::string& name, const TensorView& dst) {
  st.read_into(name, dst);
  const int64_t at = first_nonfinite(dst);
  HYP_CHECK(at < 0,
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
    const nlohmann::json st = nlohmann::json::parse(read_file(path));
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
  const OutType ot = parse_out_type(checkpoint_dir, out_type);
  const LlamaConfig c = read_config(checkpoint_dir);
  const Vocab vocab = read_vocab(checkpoint_dir, c.vocab_size);
  const std::string st_path =
      (std::filesystem::path(checkpoint_dir) / "model.safetensors").string();
  SafetensorsFile st = [&] {
    try {
      return SafetensorsFile::open(st_path);
    } catch (const Error& e) {
      fail("gguf convert: {}: model.safetensors: {}", checkpoint_dir, e.what());
    }
  }();

  std::string name = std::filesystem::path(checkpoint_dir).lexically_normal().filename().string();
  if (name.empty())
    name =
        std::filesystem::path(checkpoint_dir).lexically_normal().parent_path().filename().string();
  if (name.empty() || name == ".") name = "hyperion";

  GgufWriter w;
  // Keys in the order convert_hf_to_gguf.py writes them.
  // llama.cpp's gemma graph is the llama one with Gemma's embedding scale and GELU; its
  // keys take the architecture's name as prefix.
  const std::string arch = c.gemma ? "gemma" : "llama";
  w.set_string("general.architecture", arch);
  w.set_string("general.name", name);
  w.set_u32("general.alignment", kGgufDefaultAlignment);
  w.set_u32(arch + ".block_count", uint32_t(c.num_hidden_layers));
  w.set_u32(arch + ".context_length", uint32_t(c.max_position_embeddings));
  w.set_u32(arch + ".embedding_length", uint32_t(c.hidden_size));
  w.set_u32(arch + ".feed_forward_length", uint32_t(c.intermediate_size));
  w.set_u32(arch + ".attention.head_count", uint32_t(c.num_attention_heads));
  w.set_u32(arch + ".attention.head_count_kv", uint32_t(c.num_key_value_heads));
  w.set_f32(arch + ".rope.freq_base", float(c.rope_theta));
  w.set_f32(arch + ".attention.layer_norm_rms_epsilon", float(c.rms_norm_eps));
  if (c.moe) {  // with llama.feed_forward_length = intermediate_size, the expert's size
    w.set_u32(arch + ".expert_count", uint32_t(c.num_local_experts));
    w.set_u32(arch + ".expert_used_count", uint32_t(c.num_experts_per_tok));
  }
  // convert_hf_to_gguf.py writes these whenever head_dim is given, and always for Gemma.
  if (c.has_head_dim || c.gemma) {
    w.set_u32(arch + ".attention.key_length", uint32_t(c.head_dim));
    w.set_u32(arch + ".attention.value_length", uint32_t(c.head_dim));
  }
  w.set_u32("general.file_type", ot.file_type);
  w.set_u32(arch + ".vocab_size", uint32_t(c.vocab_size));
  w.set_u32(arch + ".rope.dimension_count", uint32_t(c.head_dim));
  w.set_u32("general.quantization_version", 2);  // GGML_QNT_VERSION
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string_array("tokenizer.ggml.tokens", vocab.tokens);
  w.set_f32_array("tokenizer.ggml.scores", vocab.scores);
  w.set_i32_array("tokenizer.ggml.token_type", vocab.types);
  w.set_u32("tokenizer.ggml.bos_token_id", uint32_t(c.bos_token_id));
  w.set_u32("tokenizer.ggml.eos_token_id", uint32_t(c.eos_token_id));
  if (vocab.unk_id >= 0) w.set_u32("tokenizer.ggml.unknown_token_id", uint32_t(vocab.unk_id));
  if (c.pad_token_id >= 0) w.set_u32("tokenizer.ggml.padding_token_id", uint32_t(c.pad_token_id));
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
  w.set_bool("tokenizer.ggml.add_space_prefix", vocab.add_dummy_prefix);

  std::set<std::string> used;
  const int64_t dim = c.hidden_size, hd = c.head_dim, ff = c.intermediate_size;
  const int64_t q_rows = c.num_attention_heads * hd, kv_rows = c.num_key_value_heads * hd;
  // Checks that `hf` exists with shape `expect` and marks it as used.
  auto check = [&](const std::string& hf, const Shape& expect) {
    const SafetensorsTensor* t = st.find(hf);
    HYP_CHECK(t != nullptr, "gguf convert: {}: model.safetensors: missing tensor '{}'",
              checkpoint_dir, hf);
    HYP_CHECK(t->shape == expect,
              "gguf convert: {}: model.safetensors: tensor '{}' has shape {} but config.json "
              "implies {} (hidden_size {}, intermediate_size {}, heads {}, kv heads {}, "
              "head_dim {}, vocab_size {}{})",
              checkpoint_dir, hf, t->shape.str(), expect.str(), c.hidden_size, c.intermediate_size,
              c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.vocab_size,
              c.moe ? fmt::format(", num_local_experts {}", c.num_local_experts) : "");
    used.insert(hf);
  };
  // As convert_hf_to_gguf.py: 1-D tensors, norms and the MoE router (ffn_gate_inp, which
  // llama.cpp's quantizer never quantises either) stay f32; q8_0 blocks run along the last
  // dimension and fall back to f16 when it is not a multiple of 32.
  auto type_for = [&](const std::string& gg, const Shape& shape) {
    GgmlType type = ot.matrix;
    if (shape.rank() <= 1 || gg.ends_with("_norm.weight") || gg.ends_with(".ffn_gate_inp.weight"))
      type = GgmlType::kF32;
    if (type == GgmlType::kQ8_0 && shape.dim(-1) % ggml_block_size(GgmlType::kQ8_0) != 0)
      type = GgmlType::kF16;
    return type;
  };
  // permute_heads > 0: apply the RoPE row permutation with that many heads (llama only:
  // llama.cpp's gemma graph rotates halves as Hugging Face does). Gemma's norms are stored
  // as 1 + w, the scale llama.cpp applies (convert_hf_to_gguf.py does the same).
  // Matrices int8 training quantised per output channel go to Q8_0 as those int8 values.
  const TrainedQuantization tq = read_trained_quantization(checkpoint_dir);
  int per_channel_matrices = 0;
  double max_scale_change = 0;
  auto add = [&](const std::string& hf, const std::string& gg, Shape expect,
                 int64_t permute_heads) {
    check(hf, expect);
    if (c.gemma) permute_heads = 0;
    const bool trained_int8 =
        tq.int8 && (gg.rfind("blk.", 0) == 0 || (tq.logits && gg == "output.weight")) &&
        !gg.ends_with("_norm.weight") && !gg.ends_with(".ffn_gate_inp.weight");
    if (trained_int8 && type_for(gg, expect) == GgmlType::kQ8_0) {
      ++per_channel_matrices;
      w.add_encoded_tensor(
          gg, expect,
          [&st, hf, expect, permute_heads, &max_scale_change](unsigned char* dst) {
            std::vector<float> tmp(size_t(expect.numel())), perm;
            read_finite(st, hf, TensorView(tmp.data(), DType::kF32, expect));
            if (permute_heads > 0) {
              perm.resize(tmp.size());
              permute_rope_rows_for_gguf(tmp.data(), perm.data(), expect[0], expect[1],
                                         permute_heads);
              tmp.swap(perm);
            }
            encode_q8_0_per_channel(tmp.data(), expect[0], expect[1], dst, &max_scale_change);
          },
          GgmlType::kQ8_0);
      return;
    }
    const bool plus_one = c.gemma && gg.ends_with("_norm.weight");
    w.add_tensor(
        gg, expect,
        [&st, hf, expect, permute_heads, plus_one](float* dst) {
          if (permute_heads == 0) {
            read_finite(st, hf, TensorView(dst, DType::kF32, expect));
            if (plus_one)
              for (int64_t i = 0; i < expect.numel(); ++i) dst[i] += 1.0f;
            return;
          }
          std::vector<float> tmp(size_t(expect.numel()));
          read_finite(st, hf, TensorView(tmp.data(), DType::kF32, expect));
          permute_rope_rows_for_gguf(tmp.data(), dst, expect[0], expect[1], permute_heads);
        },
        type_for(gg, expect));
  };
  // The E per-expert Hugging Face matrices `{prefix}{e}{suffix}` (each of shape `expert`)
  // stacked into one [E, rows, cols] tensor, as convert_hf_to_gguf.py's torch.stack(dim=0);
  // GGUF stores its dims reversed, ne = [cols, rows, E], which is what llama.cpp's
  // create_tensor expects ({n_embd, n_ff, n_expert} for gate/up). Each expert is read
  // straight into its slice when the writer reaches the tensor, so only the stacked tensor
  // being written is held in f32.
  auto add_experts = [&](const std::string& prefix, const std::string& suffix,
                         const std::string& gg, Shape expert) {
    std::vector<std::string> names;
    for (int64_t e = 0; e < c.num_local_experts; ++e) {
      names.push_back(fmt::format("{}{}{}", prefix, e, suffix));
      check(names.back(), expert);
    }
    const Shape stacked{c.num_local_experts, expert[0], expert[1]};
    w.add_tensor(
        gg, stacked,
        [&st, names, expert](float* dst) {
          for (size_t e = 0; e < names.size(); ++e)
            read_finite(st, names[e],
                        TensorView(dst + e * size_t(expert.numel()), DType::kF32, expert));
        },
        type_for(gg, stacked));
  };

  add("model.embed_tokens.weight", "token_embd.weight", {c.vocab_size, dim}, 0);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i), b = fmt::format("blk.{}.", i);
    add(p + "input_layernorm.weight", b + "attn_norm.weight", {dim}, 0);
    add(p + "self_attn.q_proj.weight", b + "attn_q.weight", {q_rows, dim}, c.num_attention_heads);
    add(p + "self_attn.k_proj.weight", b + "attn_k.weight", {kv_rows, dim}, c.num_key_value_heads);
    add(p + "self_attn.v_proj.weight", b + "attn_v.weight", {kv_rows, dim}, 0);
    add(p + "self_attn.o_proj.weight", b + "attn_output.weight", {dim, q_rows}, 0);
    add(p + "post_attention_layernorm.weight", b + "ffn_norm.weight", {dim}, 0);
    if (c.moe) {
      // Mixtral's w1 = gate, w3 = up, w2 = down (gguf-py's tensor_mapping.py).
      const std::string m = p + "block_sparse_moe.";
      add(m + "gate.weight", b + "ffn_gate_inp.weight", {c.num_local_experts, dim}, 0);
      add_experts(m + "experts.", ".w1.weight", b + "ffn_gate_exps.weight", {ff, dim});
      add_experts(m + "experts.", ".w3.weight", b + "ffn_up_exps.weight", {ff, dim});
      add_experts(m + "experts.", ".w2.weight", b + "ffn_down_exps.weight", {dim, ff});
    } else {
      add(p + "mlp.gate_proj.weight", b + "ffn_gate.weight", {ff, dim}, 0);
      add(p + "mlp.up_proj.weight", b + "ffn_up.weight", {ff, dim}, 0);
      add(p + "mlp.down_proj.weight", b + "ffn_down.weight", {dim, ff}, 0);
    }
  }
  add("model.norm.weight", "output_norm.weight", {dim}, 0);
  if (!c.tie_word_embeddings) {
    HYP_CHECK(st.find("lm_head.weight") != nullptr,
              "gguf convert: {}: model.safetensors: missing tensor 'lm_head.weight' (config.json "
              "has tie_word_embeddings = false)",
              checkpoint_dir);
    add("lm_head.weight", "output.weight", {c.vocab_size, dim}, 0);
  } else {
    // A saved copy of the tied head is not needed: llama.cpp reuses token_embd when
    // output.weight is absent.
    used.insert("lm_head.weight");
  }

  // Anything left over would be silently dropped; llama.cpp's converter refuses too.
  std::vector<std::string> unused;
  for (const auto& t : st.tensors())
    if (!used.count(t.name) && !t.name.ends_with(".rotary_emb.inv_freq")) unused.push_back(t.name);
  if (!unused.empty()) {
    std::string list;
    for (size_t i = 0; i < unused.size() && i < 5; ++i) list += (i ? ", '" : "'") + unused[i] + "'";
    fail(
        "gguf convert: {}: model.safetensors: {} tensor(s) not part of a {}-layer {} model: "
        "{}{}",
        checkpoint_dir, unused.size(), c.num_hidden_layers,
        c.moe ? fmt::format("Mixtral ({} experts)", c.num_local_experts)
              : std::string(c.gemma ? "Gemma" : "Llama"),
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

}  // namespace hyperion::io
