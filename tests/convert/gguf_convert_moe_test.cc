// GGUF export of Mixtral-style (mixture-of-experts) checkpoints: config keys, the router
// and the experts stacked into llama.cpp's merged tensors, and the configurations llama.cpp
// cannot represent.
#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "../test_files.h"
#include "convert_test_util.h"
#include "base/error.h"
#include "convert/gguf_convert.h"
#include "io/atomic_file.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "tensor/convert.h"
#include "tensor/quantize_q8_0.h"

namespace hyperion::convert {
namespace {

using namespace hyperion::testing_util;
namespace fs = std::filesystem;

constexpr int64_t kVocab = 304, kDim = 64, kFf = 80, kLayers = 2, kHeads = 4, kKvHeads = 2;
constexpr int64_t kExperts = 4, kUsed = 2, kHeadDim = 16;


std::string expert_name(int64_t layer, int64_t e, const char* w) {
  return fmt::format("model.layers.{}.block_sparse_moe.experts.{}.{}.weight", layer, e, w);
}

// The ne[] of tensor `name` read straight from the file's tensor-info section (a check of
// the dims order that does not go through GgufFile): gguf_string name, u32 n_dims, u64 ne[].
std::vector<uint64_t> raw_ne(const std::string& path, const std::string& name) {
  const std::string bytes = io::read_file(path);
  std::string key(8, '\0');
  const uint64_t n = name.size();
  std::memcpy(key.data(), &n, 8);
  key += name;
  const size_t at = bytes.find(key);
  EXPECT_NE(at, std::string::npos) << name;
  if (at == std::string::npos) return {};
  size_t p = at + key.size();
  uint32_t n_dims = 0;
  std::memcpy(&n_dims, bytes.data() + p, 4);
  p += 4;
  std::vector<uint64_t> ne(n_dims);
  for (auto& d : ne) {
    std::memcpy(&d, bytes.data() + p, 8);
    p += 8;
  }
  return ne;
}

class ConvertMoeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tok_dir_ = fs::temp_directory_path() / fmt::format("hyp_gguf_moe_tok_{}", ::getpid());
    fs::remove_all(tok_dir_);
    fs::create_directories(tok_dir_);
    const std::vector<std::string> words = {"the",  "experts", "route",  "tokens", "to",
                                            "a",    "few",     "of",     "many",   "small",
                                            "mlps", "while",   "router", "learns", "balance"};
    std::mt19937 rng(9);
    std::string text;
    for (int line = 0; line < 300; ++line) {
      const int n = 3 + int(rng() % 9);
      for (int k = 0; k < n; ++k) text += (k ? " " : "") + words[rng() % words.size()];
      text += line % 5 == 0 ? ". 7!\n" : "\n";
    }
    const std::string corpus = (tok_dir_ / "corpus.txt").string();
    write_bytes(corpus, text);
    const auto status = sentencepiece::SentencePieceTrainer::Train(fmt::format(
        "--input={} --model_prefix={} --vocab_size=300 --model_type=bpe --byte_fallback=true "
        "--character_coverage=1.0 --num_threads=1 --minloglevel=2 "
        "--normalization_rule_name=identity --remove_extra_whitespaces=false",
        corpus, (tok_dir_ / "tok").string()));
    ASSERT_TRUE(status.ok()) << status.ToString();
  }
  static void TearDownTestSuite() { fs::remove_all(tok_dir_); }

  struct Options {
    std::string drop;                               // a tensor to leave out
    std::string reshape;                            // a tensor whose first dim grows by 2
    std::string extra;                              // an extra tensor to add
    nlohmann::json set = nlohmann::json::object();  // config.json keys to set (null: erase)
  };

  // A 2-layer Mixtral (E = 4, k = 2, D = 64, F = 80) in dir_ / "ckpt". Expert 2's w3 of
  // layer 1 is stored as bf16, to exercise the conversion on read.
  void make_checkpoint() { make_checkpoint(Options{}); }
  void make_checkpoint(const Options& o) {
    ckpt_ = (dir_.path / "ckpt").string();
    fs::create_directories(ckpt_);
    fs::copy_file(tok_dir_ / "tok.model", fs::path(ckpt_) / "tokenizer.model",
                  fs::copy_options::overwrite_existing);
    std::vector<std::pair<std::string, Shape>> spec = {
        {"model.embed_tokens.weight", {kVocab, kDim}}};
    for (int64_t i = 0; i < kLayers; ++i) {
      const std::string p = fmt::format("model.layers.{}.", i);
      spec.push_back({p + "input_layernorm.weight", {kDim}});
      spec.push_back({p + "self_attn.q_proj.weight", {kHeads * kHeadDim, kDim}});
      spec.push_back({p + "self_attn.k_proj.weight", {kKvHeads * kHeadDim, kDim}});
      spec.push_back({p + "self_attn.v_proj.weight", {kKvHeads * kHeadDim, kDim}});
      spec.push_back({p + "self_attn.o_proj.weight", {kDim, kHeads * kHeadDim}});
      spec.push_back({p + "post_attention_layernorm.weight", {kDim}});
      spec.push_back({p + "block_sparse_moe.gate.weight", {kExperts, kDim}});
      // Hugging Face's state-dict order: experts outermost, then w1, w2, w3.
      for (int64_t e = 0; e < kExperts; ++e) {
        spec.push_back({expert_name(i, e, "w1"), {kFf, kDim}});
        spec.push_back({expert_name(i, e, "w2"), {kDim, kFf}});
        spec.push_back({expert_name(i, e, "w3"), {kFf, kDim}});
      }
    }
    spec.push_back({"model.norm.weight", {kDim}});
    spec.push_back({"lm_head.weight", {kVocab, kDim}});
    if (!o.extra.empty()) spec.push_back({o.extra, {kFf, kDim}});

    RandomWeights r;
    r.spec = &spec;
    r.seed = 31;
    r.bf16_tensor = expert_name(1, 2, "w3");
    r.drop = o.drop;
    r.reshape = o.reshape;
    weights_ = write_random_weights(r, (fs::path(ckpt_) / "model.safetensors").string());

    // What hyperion's convert::to_hf_config_json writes for a MoE model.
    nlohmann::json cfg = {{"architectures", {"MixtralForCausalLM"}},
                          {"model_type", "mixtral"},
                          {"vocab_size", kVocab},
                          {"hidden_size", kDim},
                          {"intermediate_size", kFf},
                          {"num_local_experts", kExperts},
                          {"num_experts_per_tok", kUsed},
                          {"router_aux_loss_coef", 0.01},
                          {"output_router_logits", false},
                          {"sliding_window", nullptr},
                          {"norm_topk_prob", true},
                          {"num_hidden_layers", kLayers},
                          {"num_attention_heads", kHeads},
                          {"num_key_value_heads", kKvHeads},
                          {"head_dim", kHeadDim},
                          {"hidden_act", "silu"},
                          {"max_position_embeddings", 256},
                          {"rms_norm_eps", 1e-5},
                          {"rope_theta", 10000.0},
                          {"tie_word_embeddings", false},
                          {"bos_token_id", 1},
                          {"eos_token_id", 2},
                          {"torch_dtype", "float32"}};
    for (const auto& [k, v] : o.set.items()) {
      if (v.is_null())
        cfg.erase(k);
      else
        cfg[k] = v;
    }
    write_bytes((fs::path(ckpt_) / "config.json").string(), cfg.dump(2));
  }

  io::GgufFile convert(const std::string& type) {
    out_ = dir_.file("model-" + type + ".gguf");
    convert_checkpoint_to_gguf(ckpt_, out_, type);
    return io::GgufFile::open(out_);
  }

  // The per-expert Hugging Face tensors `w` of `layer`, concatenated in expert order.
  std::vector<float> stacked(int64_t layer, const char* w) const {
    std::vector<float> out;
    for (int64_t e = 0; e < kExperts; ++e) {
      const auto& v = weights_.at(expert_name(layer, e, w));
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  }

  // Converting must fail with a message holding every needle and the checkpoint dir, and
  // leave no output or temporary behind.
  void expect_fails(const Options& o, std::vector<std::string> needles,
                    const std::string& type = "f32") {
    make_checkpoint(o);
    out_ = dir_.file("bad.gguf");
    needles.push_back(ckpt_);
    expect_error([&] { convert_checkpoint_to_gguf(ckpt_, out_, type); }, needles);
    EXPECT_FALSE(fs::exists(out_));
    EXPECT_FALSE(testing_util::temp_files_left(out_));
  }

  static inline fs::path tok_dir_;
  TempDir dir_;
  std::string ckpt_, out_;
  std::map<std::string, std::vector<float>> weights_;
};

TEST_F(ConvertMoeTest, F32KeysTensorsAndStackedExperts) {
  make_checkpoint();
  io::GgufFile f = convert("f32");
  EXPECT_EQ(f.get_string("general.architecture"), "llama");  // llama.cpp reads Mixtral as llama
  EXPECT_EQ(f.get_u32("general.file_type"), 0u);
  EXPECT_EQ(f.get_u32("llama.block_count"), uint32_t(kLayers));
  EXPECT_EQ(f.get_u32("llama.embedding_length"), uint32_t(kDim));
  EXPECT_EQ(f.get_u32("llama.feed_forward_length"), uint32_t(kFf));  // the expert's size
  EXPECT_EQ(f.get_u32("llama.expert_count"), uint32_t(kExperts));
  EXPECT_EQ(f.get_u32("llama.expert_used_count"), uint32_t(kUsed));
  EXPECT_EQ(f.get_u32("llama.attention.head_count"), uint32_t(kHeads));
  EXPECT_EQ(f.get_u32("llama.attention.head_count_kv"), uint32_t(kKvHeads));
  EXPECT_EQ(f.get_u32("llama.rope.dimension_count"), uint32_t(kHeadDim));
  EXPECT_EQ(f.get_f32("llama.rope.freq_base"), 10000.0f);
  EXPECT_EQ(f.get_u32("llama.vocab_size"), uint32_t(kVocab));
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
  // Keys in convert_hf_to_gguf.py's order: the expert counts follow the norm epsilon.
  const auto& keys = f.keys();
  const auto pos = [&](const std::string& k) { return std::find(keys.begin(), keys.end(), k); };
  EXPECT_EQ(pos("llama.expert_count") - pos("llama.attention.layer_norm_rms_epsilon"), 1);
  EXPECT_EQ(pos("llama.expert_used_count") - pos("llama.expert_count"), 1);
  EXPECT_FALSE(f.has("llama.expert_feed_forward_length"));  // not read by llama.cpp's llama

  // 1 + 10 per layer + output_norm + output; no dense MLP tensors.
  ASSERT_EQ(f.tensors().size(), 1u + 10u * kLayers + 2u);
  for (const auto& t : f.tensors()) {
    EXPECT_EQ(t.type, io::GgmlType::kF32) << t.name;
    EXPECT_EQ(t.name.find("ffn_gate.weight"), std::string::npos) << t.name;
    EXPECT_EQ(t.name.find("ffn_up.weight"), std::string::npos) << t.name;
    EXPECT_EQ(t.name.find("ffn_down.weight"), std::string::npos) << t.name;
  }
  for (int64_t i = 0; i < kLayers; ++i) {
    SCOPED_TRACE(i);
    const std::string b = fmt::format("blk.{}.", i);
    EXPECT_EQ(f.tensor(b + "ffn_gate_inp.weight").shape, Shape({kExperts, kDim}));
    EXPECT_EQ(f.tensor(b + "ffn_gate_exps.weight").shape, Shape({kExperts, kFf, kDim}));
    EXPECT_EQ(f.tensor(b + "ffn_up_exps.weight").shape, Shape({kExperts, kFf, kDim}));
    EXPECT_EQ(f.tensor(b + "ffn_down_exps.weight").shape, Shape({kExperts, kDim, kFf}));
    // In the file, innermost first: llama.cpp's {n_embd, n_ff, n_expert} for gate/up,
    // {n_ff, n_embd, n_expert} for down and {n_embd, n_expert} for the router.
    EXPECT_EQ(raw_ne(out_, b + "ffn_gate_exps.weight"),
              (std::vector<uint64_t>{kDim, kFf, kExperts}));
    EXPECT_EQ(raw_ne(out_, b + "ffn_up_exps.weight"), (std::vector<uint64_t>{kDim, kFf, kExperts}));
    EXPECT_EQ(raw_ne(out_, b + "ffn_down_exps.weight"),
              (std::vector<uint64_t>{kFf, kDim, kExperts}));
    EXPECT_EQ(raw_ne(out_, b + "ffn_gate_inp.weight"), (std::vector<uint64_t>{kDim, kExperts}));

    // Values: the router as is, the experts stacked in order (w1 gate, w3 up, w2 down).
    const std::string p = fmt::format("model.layers.{}.", i);
    EXPECT_EQ(f.dequantize(b + "ffn_gate_inp.weight"),
              weights_.at(p + "block_sparse_moe.gate.weight"));
    EXPECT_EQ(f.dequantize(b + "ffn_gate_exps.weight"), stacked(i, "w1"));
    EXPECT_EQ(f.dequantize(b + "ffn_up_exps.weight"), stacked(i, "w3"));  // one expert bf16
    EXPECT_EQ(f.dequantize(b + "ffn_down_exps.weight"), stacked(i, "w2"));
    EXPECT_EQ(f.dequantize(b + "ffn_norm.weight"),
              weights_.at(p + "post_attention_layernorm.weight"));
    EXPECT_EQ(f.dequantize(b + "attn_v.weight"), weights_.at(p + "self_attn.v_proj.weight"));
  }
  // Expert e of the stacked tensor is the slice [e], e.g. expert 3's down projection.
  const std::vector<float> down = f.dequantize("blk.1.ffn_down_exps.weight");
  const std::vector<float>& e3 = weights_.at(expert_name(1, 3, "w2"));
  EXPECT_TRUE(std::equal(e3.begin(), e3.end(), down.begin() + 3 * kDim * kFf));
}

TEST_F(ConvertMoeTest, HalfAndQ8_0Types) {
  make_checkpoint();
  for (const auto& [name, type] :
       {std::pair{"f16", io::GgmlType::kF16}, std::pair{"bf16", io::GgmlType::kBF16}}) {
    SCOPED_TRACE(name);
    io::GgufFile f = convert(name);
    EXPECT_EQ(f.tensor("blk.0.ffn_gate_inp.weight").type, io::GgmlType::kF32);  // router stays f32
    EXPECT_EQ(f.dequantize("blk.0.ffn_gate_inp.weight"),
              weights_.at("model.layers.0.block_sparse_moe.gate.weight"));
    for (const char* gg : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"})
      EXPECT_EQ(f.tensor(fmt::format("blk.1.{}.weight", gg)).type, type) << gg;
    const std::vector<float> want = stacked(1, "w2");
    const std::vector<float> got = f.dequantize("blk.1.ffn_down_exps.weight");
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      const float r = type == io::GgmlType::kF16 ? f16_to_f32(f32_to_f16(want[i]))
                                             : bf16_to_f32(f32_to_bf16(want[i]));
      ASSERT_EQ(got[i], r) << i;
    }
  }

  io::GgufFile f = convert("q8_0");
  EXPECT_EQ(f.get_u32("general.file_type"), 7u);
  EXPECT_EQ(f.tensor("blk.0.ffn_gate_inp.weight").type, io::GgmlType::kF32);
  EXPECT_EQ(f.tensor("blk.0.ffn_gate_exps.weight").type, io::GgmlType::kQ8_0);  // rows of D = 64
  EXPECT_EQ(f.tensor("blk.0.ffn_up_exps.weight").type, io::GgmlType::kQ8_0);
  EXPECT_EQ(f.tensor("blk.0.ffn_down_exps.weight").type, io::GgmlType::kF16);  // rows of F = 80
  for (int64_t i = 0; i < kLayers; ++i) {
    for (const auto& [gg, w] : {std::pair{"ffn_gate_exps", "w1"}, std::pair{"ffn_up_exps", "w3"}}) {
      SCOPED_TRACE(fmt::format("layer {} {}", i, gg));
      const std::string name = fmt::format("blk.{}.{}.weight", i, gg);
      // Exactly llama.cpp's quantisation of the stacked tensor, blocks along D.
      const std::vector<float> want = stacked(i, w);
      std::vector<unsigned char> q(io::ggml_nbytes(io::GgmlType::kQ8_0, int64_t(want.size())));
      ref::quantize_row_q8_0(want.data(), q.data(), int64_t(want.size()));
      const io::GgufTensor& t = f.tensor(name);
      ASSERT_EQ(t.nbytes, q.size());
      EXPECT_EQ(std::memcmp(t.data, q.data(), q.size()), 0);
      // And within Q8_0's error: half a step of each block's scale amax / 127 (plus the
      // f16 rounding of the scale).
      const std::vector<float> got = f.dequantize(name);
      for (size_t b = 0; b < want.size(); b += 32) {
        float amax = 0;
        for (size_t j = b; j < b + 32; ++j) amax = std::max(amax, std::fabs(want[j]));
        const float tol = amax / 127.0f * 0.5f + amax * 2e-3f;
        for (size_t j = b; j < b + 32; ++j) ASSERT_NEAR(got[j], want[j], tol) << j;
      }
    }
    const std::vector<float> down = f.dequantize(fmt::format("blk.{}.ffn_down_exps.weight", i));
    const std::vector<float> want = stacked(i, "w2");
    for (size_t k = 0; k < want.size(); ++k) ASSERT_EQ(down[k], f16_to_f32(f32_to_f16(want[k])));
  }
}

// Mixtral configs as transformers writes them may omit hyperion's norm_topk_prob (Mixtral
// always renormalises) and model_type; explicit "all layers MoE" interleaving keys pass.
TEST_F(ConvertMoeTest, AcceptedConfigVariants) {
  Options o;
  o.set = {{"norm_topk_prob", nullptr}, {"model_type", nullptr}, {"rope_theta", nullptr}};
  make_checkpoint(o);
  io::GgufFile f = convert("f32");
  EXPECT_EQ(f.get_u32("llama.expert_count"), uint32_t(kExperts));
  EXPECT_EQ(f.get_f32("llama.rope.freq_base"), 1e6f);  // MixtralConfig's default
  o.set = {{"hyperion_first_dense_layers", 0},
           {"hyperion_moe_layer_step", 1},
           {"hyperion_dense_intermediate_size", 128},
           {"sliding_window", 4096}};  // >= the context: no effect
  make_checkpoint(o);
  EXPECT_EQ(convert("f32").get_u32("llama.expert_used_count"), uint32_t(kUsed));
  o.set = {{"num_experts_per_tok", kExperts}};  // k = E is allowed
  make_checkpoint(o);
  EXPECT_EQ(convert("f32").get_u32("llama.expert_used_count"), uint32_t(kExperts));
}

TEST_F(ConvertMoeTest, RefusesWhatLlamaCppCannotRepresent) {
  Options o;
  o.set = {{"norm_topk_prob", false}};
  expect_fails(o, {"config.json", "'norm_topk_prob'", "renormalise"});
  o.set = {{"hyperion_first_dense_layers", 1},
           {"hyperion_moe_layer_step", 1},
           {"hyperion_dense_intermediate_size", 128}};
  expect_fails(o, {"config.json", "'hyperion_first_dense_layers' = 1", "every layer"});
  o.set = {{"hyperion_first_dense_layers", 0},
           {"hyperion_moe_layer_step", 2},
           {"hyperion_dense_intermediate_size", 128}};
  expect_fails(o, {"config.json", "'hyperion_moe_layer_step' = 2", "every layer"});
  o.set = {{"sliding_window", 128}};
  expect_fails(o, {"config.json", "'sliding_window'", "128"});
}

TEST_F(ConvertMoeTest, ConfigErrorsNameTheKey) {
  Options o;
  o.set = {{"num_experts_per_tok", kExperts + 1}};
  expect_fails(o, {"config.json", "'num_experts_per_tok' = 5", "num_local_experts = 4"});
  o.set = {{"num_experts_per_tok", 0}};
  expect_fails(o, {"config.json", "'num_experts_per_tok'", ">= 1"});
  o.set = {{"num_local_experts", "4"}};
  expect_fails(o, {"config.json", "'num_local_experts'", "not an integer"});
  o.set = {{"norm_topk_prob", 1}};
  expect_fails(o, {"config.json", "'norm_topk_prob'", "not a boolean"});
  o.set = {{"hyperion_moe_layer_step", 0}};
  expect_fails(o, {"config.json", "'hyperion_moe_layer_step'", ">= 1"});
  o.set = {{"hyperion_shared_experts", 1}};
  expect_fails(o, {"config.json", "unknown key 'hyperion_shared_experts'"});
  o.set = {{"model_type", "qwen2_moe"}};
  expect_fails(o, {"config.json", "'model_type'", "qwen2_moe"});
  // Missing num_local_experts means MixtralConfig's 8, which the router's shape contradicts.
  o.set = {{"num_local_experts", nullptr}};
  expect_fails(o, {"model.safetensors", "'model.layers.0.block_sparse_moe.gate.weight'", "[8, 64]",
                   "num_local_experts 8"});
}

TEST_F(ConvertMoeTest, TensorErrorsNameTheTensor) {
  Options o;
  o.drop = expert_name(1, 3, "w3");
  expect_fails(o, {"model.safetensors", "missing tensor '" + o.drop + "'"});
  o = {};
  o.drop = "model.layers.0.block_sparse_moe.gate.weight";
  expect_fails(o, {"model.safetensors", "missing tensor '" + o.drop + "'"});
  o = {};
  o.reshape = expert_name(0, 2, "w2");
  expect_fails(o, {"model.safetensors", "'" + o.reshape + "'", "[66, 80]", "[64, 80]",
                   "num_local_experts 4"});
  o = {};
  o.reshape = "model.layers.1.block_sparse_moe.gate.weight";
  expect_fails(o, {"'" + o.reshape + "'", "[6, 64]", "[4, 64]"});
  // Leftovers: an expert past num_local_experts, or a dense MLP in a Mixtral.
  o = {};
  o.extra = expert_name(0, 4, "w1");
  expect_fails(o, {"model.safetensors", "1 tensor(s) not part of a 2-layer Mixtral (4 experts)",
                   "'" + o.extra + "'"});
  o = {};
  o.extra = "model.layers.1.mlp.gate_proj.weight";
  expect_fails(o, {"not part of", "'" + o.extra + "'"});
  // A Llama config over a Mixtral checkpoint: the dense MLP is missing.
  o = {};
  o.set = {{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}}};
  expect_fails(o, {"missing tensor 'model.layers.0.mlp.gate_proj.weight'"});
  EXPECT_EQ(dir_.listing(), std::vector<std::string>{"ckpt"});
}

}  // namespace
}  // namespace hyperion::convert
