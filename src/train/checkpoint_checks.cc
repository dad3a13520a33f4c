// Checking a checkpoint directory before and while loading it: its weight files against
// its config.json (before anything large is allocated), its tokenizer against the model,
// the memory the load needs, and every tensor for non-finite values.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/system_memory.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "kernels/finite.h"
#include "model/param_store.h"
#include "tensor/convert.h"
#include "train/checkpoint.h"

namespace hyperion {

namespace fs = std::filesystem;

namespace {

// The config.json keys that size a tensor, by its name.
std::string sizing_keys(const std::string& name, const DecoderConfig& c) {
  if (name.find("embed_tokens") != std::string::npos || name == "lm_head.weight")
    return fmt::format("vocab_size {}, hidden_size {}", c.vocab_size, c.dim);
  if (name.find("q_proj") != std::string::npos || name.find("o_proj") != std::string::npos)
    return fmt::format("num_attention_heads {} x head_dim {}, hidden_size {}", c.n_heads,
                       c.head_dim, c.dim);
  if (name.find("k_proj") != std::string::npos || name.find("v_proj") != std::string::npos)
    return fmt::format("num_key_value_heads {} x head_dim {}, hidden_size {}", c.n_kv_heads,
                       c.head_dim, c.dim);
  if (name.find("block_sparse_moe.gate.") != std::string::npos)
    return fmt::format("num_local_experts {}, hidden_size {}", c.n_experts, c.dim);
  if (name.find("mlp.") != std::string::npos || name.find("experts.") != std::string::npos)
    return fmt::format("intermediate_size {}, hidden_size {}",
                       c.is_moe() ? c.expert_ffn_dim() : c.ffn_dim, c.dim);
  return fmt::format("hidden_size {}", c.dim);
}

// Decoder layers the weight files hold: 1 + the highest model.layers.<i> index.
int64_t layers_held(const std::vector<std::string>& names) {
  int64_t n = 0;
  for (const std::string& name : names)
    if (name.rfind("model.layers.", 0) == 0)
      n = std::max<int64_t>(n, std::atoll(name.c_str() + 13) + 1);
  return n;
}

bool same_bytes(const io::SafetensorsTensor& a, const io::SafetensorsTensor& b) {
  return a.dtype == b.dtype && a.shape == b.shape && a.nbytes == b.nbytes &&
         std::memcmp(a.data, b.data, a.nbytes) == 0;
}

}  // namespace

namespace {
void check_weights_match_config_impl(const std::string& dir, const DecoderConfig& config);
}  // namespace

// A directory whose weights disagree with its config.json (or whose weight files or index
// are malformed) is bad input: exit status 2, like a bad flag.
void check_weights_match_config(const std::string& dir, const DecoderConfig& config) {
  try {
    check_weights_match_config_impl(dir, config);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw_usage_error(e.what());
  }
}

namespace {

void check_weights_match_config_impl(const std::string& dir, const DecoderConfig& config) {
  const std::string cfg = dir + "/config.json";
  const WeightFiles files(dir);
  const std::vector<std::string> names = files.names();
  auto file_name = [&](const std::string& tensor) {
    const io::SafetensorsFile* f = files.file_of(tensor);
    return f == nullptr ? std::string("the weight files") : f->path();
  };
  const int64_t held = layers_held(names);
  if (held != config.n_layers)
    fail(
        "{}: num_hidden_layers is {} but the weights hold {} layers (model.layers.0..{} in {}); "
        "the config and the weights disagree",
        cfg, config.n_layers, held, held - 1, file_name("model.layers.0.input_layernorm.weight"));
  if (config.tie_embeddings) {
    const io::SafetensorsTensor* head = files.find("lm_head.weight");
    const io::SafetensorsTensor* embed = files.find("model.embed_tokens.weight");
    // A saved copy of the tied head is harmless; a different head would be ignored.
    if (head != nullptr && (embed == nullptr || !same_bytes(*head, *embed)))
      fail(
          "{}: tie_word_embeddings is true but {} holds its own lm_head.weight {}, which "
          "would be ignored; set tie_word_embeddings to false",
          cfg, file_name("lm_head.weight"), head->shape.str());
  }
  std::map<std::string, bool> expected;
  for (const ParamInfo& p : ParamStore::layout(config)) {
    expected[p.name] = true;
    const io::SafetensorsTensor* t = files.find(p.name);
    if (t == nullptr)
      fail("{} describes tensor {} {} but {} does not hold it", cfg, p.name, p.shape.str(),
           file_name("model.embed_tokens.weight"));
    if (!(t->shape == p.shape))
      fail("{}: tensor {} is {} but {} gives {} ({}); the config and the weights disagree",
           file_name(p.name), p.name, t->shape.str(), cfg, p.shape.str(),
           sizing_keys(p.name, config));
  }
  for (const std::string& name : names) {
    if (expected.count(name) || name.ends_with(".rotary_emb.inv_freq")) continue;
    if (name == "lm_head.weight" && config.tie_embeddings) continue;  // identical copy
    fail(
        "{} holds tensor {} {}, which {} does not describe (model_type, num_local_experts, "
        "tie_word_embeddings?)",
        file_name(name), name, files.find(name)->shape.str(), cfg);
  }
}

}  // namespace

void check_load_fits_in_memory(const std::string& dir, const DecoderConfig& config, bool bf16) {
  const int64_t params = config.total_params();
  check_fits_in_memory(
      ParamStore::bytes(config, {bf16, /*gradients=*/false}),
      fmt::format("loading {} ({} parameters in f32{})", dir, params, bf16 ? " + a bf16 copy" : ""),
      fmt::format("its sizes come from {}/config.json (vocab_size {}, hidden_size {}, "
                  "num_hidden_layers {}, intermediate_size {})",
                  dir, config.vocab_size, config.dim, config.n_layers, config.ffn_dim));
}

text::Tokenizer load_checkpoint_tokenizer(const std::string& dir, const DecoderConfig& config) {
  std::string path = text::tokenizer_file_in(dir);
  if (path.empty()) path = dir + "/tokenizer.model";  // the error names the file expected
  text::Tokenizer tok = text::Tokenizer::load(path);
  HYP_CHECK(tok.fits_model_vocab(config.vocab_size),
            "{} has {} tokens but {}/config.json has vocab_size {}: the tokenizer does not belong "
            "to this model",
            path, tok.vocab_size(), dir, config.vocab_size);
  return tok;
}

void check_finite(const TensorView& t, const std::string& name, const std::string& file) {
  const int64_t at = first_nonfinite(t);
  if (at < 0) return;
  const float v = t.dtype == DType::kF32 ? t.as<float>()[at] : bf16_to_f32(t.as<bf16>()[at]);
  fail(
      "{}: tensor {} {} holds {} at element {}: the checkpoint is corrupt or its training "
      "diverged",
      file, name, t.shape.str(), v != v ? "NaN" : (v > 0 ? "+inf" : "-inf"), at);
}

}  // namespace hyperion
