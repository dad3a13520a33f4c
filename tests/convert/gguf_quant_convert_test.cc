// `convert --to gguf --quant q8_0|q4_0|q4_k_m|q5_k_m|q6_k` (convert/gguf_convert.h): each
// tensor's type as llama.cpp's llama-quantize chooses it (checked against the rule written
// out by hand for the models here, and on synthetic 70B and 8-expert layouts), the
// fallbacks for rows that are not a multiple of 256, general.file_type, and every stored
// tensor equal to kernels' quantize_blocks of the checkpoint's (q/k-permuted) rows, within
// its format's error.
#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "../test_files.h"
#include "base/error.h"
#include "convert/gguf_convert.h"
#include "convert_test_util.h"
#include "io/gguf.h"
#include "kernels/block_quant.h"
#include "tensor/convert.h"

namespace hyperion::convert {
namespace {

using namespace hyperion::testing_util;
using io::GgmlType;
namespace fs = std::filesystem;

// RMS relative error bounds per type on normal(0, 0.5) weights (those of
// tests/kernels/block_quantizer_test.cc).
double rms_bound(GgmlType t) {
  switch (t) {
    case GgmlType::kF32:
      return 0;
    case GgmlType::kF16:
      return 1e-3;
    case GgmlType::kQ8_0:
      return 0.0058;
    case GgmlType::kQ6_K:
      return 0.0183;
    case GgmlType::kQ5_K:
      return 0.0376;
    case GgmlType::kQ4_K:
      return 0.0760;
    case GgmlType::kQ4_0:
      return 0.0880;
    default:
      return 0;
  }
}

class GgufQuantConvertTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tok_dir_ = fs::temp_directory_path() / fmt::format("hyp_gguf_quant_tok_{}", ::getpid());
    fs::remove_all(tok_dir_);
    fs::create_directories(tok_dir_);
    const std::vector<std::string> words = {"blocks", "of",      "four",  "bits",   "hold",
                                            "the",    "weights", "while", "scales", "keep",
                                            "their",  "range",   "and",   "mins",   "shift"};
    std::mt19937 rng(13);
    std::string text;
    for (int line = 0; line < 300; ++line) {
      const int n = 3 + int(rng() % 9);
      for (int k = 0; k < n; ++k) text += (k ? " " : "") + words[rng() % words.size()];
      text += line % 5 == 0 ? ". 9!\n" : "\n";
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
    int64_t vocab = 304, dim = 256, ff = 256, layers = 8, heads = 4, kv_heads = 1;
    int64_t experts = 0;  // > 0: a Mixtral
    bool tied = false;
  };

  // A Llama (or Mixtral) checkpoint in dir_ / "ckpt": normal(0, 0.5) weights.
  void make_checkpoint(const Options& o) {
    opt_ = o;
    ckpt_ = (dir_.path / "ckpt").string();
    fs::remove_all(ckpt_);
    fs::create_directories(ckpt_);
    fs::copy_file(tok_dir_ / "tok.model", fs::path(ckpt_) / "tokenizer.model");
    const int64_t hd = o.dim / o.heads;
    std::vector<std::pair<std::string, Shape>> spec = {
        {"model.embed_tokens.weight", {o.vocab, o.dim}}};
    for (int64_t i = 0; i < o.layers; ++i) {
      const std::string p = fmt::format("model.layers.{}.", i);
      spec.push_back({p + "input_layernorm.weight", {o.dim}});
      spec.push_back({p + "self_attn.q_proj.weight", {o.heads * hd, o.dim}});
      spec.push_back({p + "self_attn.k_proj.weight", {o.kv_heads * hd, o.dim}});
      spec.push_back({p + "self_attn.v_proj.weight", {o.kv_heads * hd, o.dim}});
      spec.push_back({p + "self_attn.o_proj.weight", {o.dim, o.heads * hd}});
      spec.push_back({p + "post_attention_layernorm.weight", {o.dim}});
      if (o.experts > 0) {
        spec.push_back({p + "block_sparse_moe.gate.weight", {o.experts, o.dim}});
        for (int64_t e = 0; e < o.experts; ++e) {
          const std::string x = fmt::format("{}block_sparse_moe.experts.{}.", p, e);
          spec.push_back({x + "w1.weight", {o.ff, o.dim}});
          spec.push_back({x + "w2.weight", {o.dim, o.ff}});
          spec.push_back({x + "w3.weight", {o.ff, o.dim}});
        }
      } else {
        spec.push_back({p + "mlp.gate_proj.weight", {o.ff, o.dim}});
        spec.push_back({p + "mlp.up_proj.weight", {o.ff, o.dim}});
        spec.push_back({p + "mlp.down_proj.weight", {o.dim, o.ff}});
      }
    }
    spec.push_back({"model.norm.weight", {o.dim}});
    if (!o.tied) spec.push_back({"lm_head.weight", {o.vocab, o.dim}});
    RandomWeights r;
    r.spec = &spec;
    r.seed = 23;
    weights_ = write_random_weights(r, (fs::path(ckpt_) / "model.safetensors").string());

    nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}},
                          {"model_type", "llama"},
                          {"vocab_size", o.vocab},
                          {"hidden_size", o.dim},
                          {"intermediate_size", o.ff},
                          {"num_hidden_layers", o.layers},
                          {"num_attention_heads", o.heads},
                          {"num_key_value_heads", o.kv_heads},
                          {"rms_norm_eps", 1e-5},
                          {"rope_theta", 10000.0},
                          {"max_position_embeddings", 256},
                          {"tie_word_embeddings", o.tied},
                          {"bos_token_id", 1},
                          {"eos_token_id", 2},
                          {"torch_dtype", "float32"}};
    if (o.experts > 0) {
      cfg["architectures"] = {"MixtralForCausalLM"};
      cfg["model_type"] = "mixtral";
      cfg["num_local_experts"] = o.experts;
      cfg["num_experts_per_tok"] = 2;
      cfg["norm_topk_prob"] = true;
      cfg["sliding_window"] = nullptr;
      cfg["hidden_act"] = "silu";
    }
    write_bytes((fs::path(ckpt_) / "config.json").string(), cfg.dump(2));
  }

  io::GgufFile convert(const std::string& quant) {
    out_ = dir_.file("model-" + quant + ".gguf");
    convert_checkpoint_to_gguf(ckpt_, out_, quant);
    return io::GgufFile::open(out_);
  }

  // The f32 values llama.cpp's tensor `gg` holds: the checkpoint's tensor, q/k rows
  // permuted for RoPE, experts stacked.
  std::vector<float> source_of(const std::string& gg) const {
    static const std::map<std::string, std::string> kPlain = {
        {"token_embd.weight", "model.embed_tokens.weight"},
        {"output.weight", "lm_head.weight"},
        {"output_norm.weight", "model.norm.weight"}};
    if (auto it = kPlain.find(gg); it != kPlain.end()) return weights_.at(it->second);
    const int64_t layer = std::stoll(gg.substr(4, gg.find('.', 4) - 4));
    const std::string rest = gg.substr(gg.find('.', 4) + 1);
    const std::string p = fmt::format("model.layers.{}.", layer);
    const int64_t hd = opt_.dim / opt_.heads;
    auto permuted = [&](const std::string& hf, int64_t n_head) {
      const std::vector<float>& w = weights_.at(hf);
      std::vector<float> out(w.size());
      permute_rope_rows_for_gguf(w.data(), out.data(), n_head * hd, opt_.dim, n_head);
      return out;
    };
    auto stacked = [&](const char* w) {
      std::vector<float> out;
      for (int64_t e = 0; e < opt_.experts; ++e) {
        const auto& v =
            weights_.at(fmt::format("{}block_sparse_moe.experts.{}.{}.weight", p, e, w));
        out.insert(out.end(), v.begin(), v.end());
      }
      return out;
    };
    if (rest == "attn_q.weight") return permuted(p + "self_attn.q_proj.weight", opt_.heads);
    if (rest == "attn_k.weight") return permuted(p + "self_attn.k_proj.weight", opt_.kv_heads);
    if (rest == "ffn_gate_exps.weight") return stacked("w1");
    if (rest == "ffn_down_exps.weight") return stacked("w2");
    if (rest == "ffn_up_exps.weight") return stacked("w3");
    static const std::map<std::string, std::string> kLayer = {
        {"attn_norm.weight", "input_layernorm.weight"},
        {"ffn_norm.weight", "post_attention_layernorm.weight"},
        {"attn_v.weight", "self_attn.v_proj.weight"},
        {"attn_output.weight", "self_attn.o_proj.weight"},
        {"ffn_gate_inp.weight", "block_sparse_moe.gate.weight"},
        {"ffn_gate.weight", "mlp.gate_proj.weight"},
        {"ffn_up.weight", "mlp.up_proj.weight"},
        {"ffn_down.weight", "mlp.down_proj.weight"}};
    return weights_.at(p + kLayer.at(rest));
  }

  // Every tensor: the stored bytes are quantize_blocks of each source row (the types
  // quantised here), and the dequantised values are within the type's RMS error.
  void check_values(const io::GgufFile& f) {
    for (const io::GgufTensor& t : f.tensors()) {
      SCOPED_TRACE(t.name + " (" + std::string(io::ggml_type_name(t.type)) + ")");
      const std::vector<float> want = source_of(t.name);
      ASSERT_EQ(int64_t(want.size()), t.shape.numel());
      const std::vector<float> got = f.dequantize(t.name);
      double err = 0, norm = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        err += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
        norm += double(want[i]) * want[i];
      }
      EXPECT_LE(std::sqrt(err / norm), rms_bound(t.type));
      if (const BlockFormat* b = block_format_of_ggml(static_cast<uint32_t>(t.type));
          b != nullptr && t.type != GgmlType::kQ8_0) {
        const int64_t cols = t.shape.dim(-1);
        const size_t row_bytes = block_bytes(b->type, cols);
        std::vector<unsigned char> q(t.nbytes);
        for (int64_t r = 0; r < t.shape.numel() / cols; ++r)
          quantize_blocks(b->type, want.data() + r * cols, q.data() + size_t(r) * row_bytes, cols);
        EXPECT_EQ(std::memcmp(q.data(), t.data, q.size()), 0);
      }
    }
  }

  static inline fs::path tok_dir_;
  TempDir dir_;
  Options opt_;
  std::string ckpt_, out_;
  std::map<std::string, std::vector<float>> weights_;
};

// The 8-layer model's types, written out from llama.cpp's rules: use_more_bits(i, 8) picks
// layers 0 (i < 8/8), 7 (i >= 7*8/8) and 3, 6 ((i - 1) % 3 == 2).
TEST_F(GgufQuantConvertTest, TypesFileTypeAndValuesFollowLlamaQuantize) {
  make_checkpoint({});
  const std::set<int> more_bits = {0, 3, 6, 7};
  struct Mixture {
    std::string quant;
    uint32_t file_type;
    GgmlType base;
    bool k_m;
  };
  for (const Mixture& m :
       {Mixture{"q4_k_m", 15, GgmlType::kQ4_K, true}, Mixture{"q5_k_m", 17, GgmlType::kQ5_K, true},
        Mixture{"q6_k", 18, GgmlType::kQ6_K, false}, Mixture{"q4_0", 2, GgmlType::kQ4_0, false},
        Mixture{"q8_0", 7, GgmlType::kQ8_0, false}}) {
    SCOPED_TRACE(m.quant);
    const io::GgufFile f = convert(m.quant);
    EXPECT_EQ(f.get_u32("general.file_type"), m.file_type);
    EXPECT_EQ(f.get_u32("general.quantization_version"), 2u);
    ASSERT_EQ(f.tensors().size(), 1u + 9u * 8u + 2u);
    for (const io::GgufTensor& t : f.tensors()) {
      GgmlType want = m.base;
      if (t.shape.rank() == 1) {
        want = GgmlType::kF32;
      } else if (t.name == "output.weight") {
        want = m.base == GgmlType::kQ8_0 ? GgmlType::kQ8_0 : GgmlType::kQ6_K;
      } else if (t.name.ends_with("attn_v.weight") || t.name.ends_with("ffn_down.weight")) {
        const int layer = std::stoi(t.name.substr(4));
        if (m.k_m && more_bits.count(layer)) want = GgmlType::kQ6_K;
      }
      EXPECT_EQ(t.type, want) << t.name;
    }
    check_values(f);
  }
  EXPECT_FALSE(temp_files_left(out_));
}

// With tied embeddings (no output.weight) token_embd takes the output's type.
TEST_F(GgufQuantConvertTest, TiedEmbeddingTakesTheOutputType) {
  Options o;
  o.tied = true;
  o.layers = 2;
  make_checkpoint(o);
  for (const auto& [quant, embd] :
       {std::pair{"q4_k_m", GgmlType::kQ6_K}, std::pair{"q4_0", GgmlType::kQ6_K},
        std::pair{"q8_0", GgmlType::kQ8_0}}) {
    SCOPED_TRACE(quant);
    const io::GgufFile f = convert(quant);
    EXPECT_EQ(f.find("output.weight"), nullptr);
    EXPECT_EQ(f.tensor("token_embd.weight").type, embd);
    check_values(f);
  }
}

// Rows that are not a multiple of 256 values: q8_0 for the K types (llama.cpp: q5_0 /
// q5_1 / q8_0), and f16 for rows not a multiple of 32 either.
TEST_F(GgufQuantConvertTest, RowsNotAMultipleOf256FallBack) {
  Options o;
  o.dim = 96;  // rows of 96: 3 blocks of 32
  o.ff = 80;   // ffn_down rows of 80: not even blocks of 32
  o.heads = 2;
  o.kv_heads = 2;
  o.layers = 2;
  make_checkpoint(o);
  {
    const io::GgufFile f = convert("q4_k_m");
    EXPECT_EQ(f.tensor("token_embd.weight").type, GgmlType::kQ8_0);
    EXPECT_EQ(f.tensor("output.weight").type, GgmlType::kQ8_0);
    EXPECT_EQ(f.tensor("blk.0.attn_q.weight").type, GgmlType::kQ8_0);
    EXPECT_EQ(f.tensor("blk.1.attn_v.weight").type, GgmlType::kQ8_0);  // q6_K -> q8_0
    EXPECT_EQ(f.tensor("blk.0.ffn_up.weight").type, GgmlType::kQ8_0);
    EXPECT_EQ(f.tensor("blk.0.ffn_down.weight").type, GgmlType::kF16);
    EXPECT_EQ(f.tensor("blk.0.ffn_norm.weight").type, GgmlType::kF32);
    check_values(f);
  }
  {
    const io::GgufFile f = convert("q4_0");
    EXPECT_EQ(f.tensor("token_embd.weight").type, GgmlType::kQ4_0);
    EXPECT_EQ(f.tensor("output.weight").type, GgmlType::kQ8_0);  // q6_K -> q8_0
    EXPECT_EQ(f.tensor("blk.0.attn_q.weight").type, GgmlType::kQ4_0);
    EXPECT_EQ(f.tensor("blk.1.ffn_down.weight").type, GgmlType::kF16);
    check_values(f);
  }
}

// A Mixtral: the stacked experts quantise as [E * F, D] rows; ffn_down_exps takes its
// layer from the name; the router stays f32. (4 experts: the 8-expert rules do not apply.)
TEST_F(GgufQuantConvertTest, MixtralExpertsAndRouter) {
  Options o;
  o.experts = 4;
  o.ff = 256;
  o.layers = 2;  // use_more_bits(i, 2): layer 1 only
  make_checkpoint(o);
  const io::GgufFile f = convert("q5_k_m");
  EXPECT_EQ(f.get_u32("general.file_type"), 17u);
  EXPECT_EQ(f.tensor("blk.0.ffn_gate_inp.weight").type, GgmlType::kF32);
  EXPECT_EQ(f.tensor("blk.0.ffn_gate_exps.weight").type, GgmlType::kQ5_K);
  EXPECT_EQ(f.tensor("blk.0.ffn_down_exps.weight").type, GgmlType::kQ5_K);
  EXPECT_EQ(f.tensor("blk.1.ffn_down_exps.weight").type, GgmlType::kQ6_K);
  EXPECT_EQ(f.tensor("blk.0.attn_v.weight").type, GgmlType::kQ5_K);
  EXPECT_EQ(f.tensor("blk.1.attn_v.weight").type, GgmlType::kQ6_K);
  EXPECT_EQ(f.tensor("blk.1.attn_k.weight").type, GgmlType::kQ5_K);
  EXPECT_EQ(f.tensor("output.weight").type, GgmlType::kQ6_K);
  EXPECT_EQ(f.tensor("blk.1.ffn_up_exps.weight").shape, Shape({4, 256, 256}));
  check_values(f);
}

// The rules on layouts too big to convert in a test: the types of a synthetic tensor list.
std::vector<std::pair<std::string, Shape>> layout(int64_t layers, bool moe, bool output = true) {
  std::vector<std::pair<std::string, Shape>> t = {{"token_embd.weight", {32000, 4096}}};
  for (int64_t i = 0; i < layers; ++i) {
    const std::string b = fmt::format("blk.{}.", i);
    t.push_back({b + "attn_norm.weight", {4096}});
    t.push_back({b + "attn_q.weight", {4096, 4096}});
    t.push_back({b + "attn_k.weight", {1024, 4096}});
    t.push_back({b + "attn_v.weight", {1024, 4096}});
    t.push_back({b + "attn_output.weight", {4096, 4096}});
    t.push_back({b + "ffn_norm.weight", {4096}});
    if (moe) {
      t.push_back({b + "ffn_gate_inp.weight", {8, 4096}});
      t.push_back({b + "ffn_gate_exps.weight", {8, 14336, 4096}});
      t.push_back({b + "ffn_down_exps.weight", {8, 4096, 14336}});
      t.push_back({b + "ffn_up_exps.weight", {8, 14336, 4096}});
    } else {
      t.push_back({b + "ffn_gate.weight", {14336, 4096}});
      t.push_back({b + "ffn_down.weight", {4096, 14336}});
      t.push_back({b + "ffn_up.weight", {14336, 4096}});
    }
  }
  t.push_back({"output_norm.weight", {4096}});
  if (output) t.push_back({"output.weight", {32000, 4096}});
  return t;
}

std::map<std::string, GgmlType> types_of(GgufOutType q, const GgufQuantModel& m,
                                         const std::vector<std::pair<std::string, Shape>>& t) {
  const std::vector<GgmlType> ty = gguf_tensor_types(q, m, t);
  std::map<std::string, GgmlType> out;
  for (size_t i = 0; i < t.size(); ++i) out[t[i].first] = ty[i];
  return out;
}

bool more_bits(int64_t i, int64_t n) {  // llama.cpp's use_more_bits, as its comment reads
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

TEST(GgufQuantTypes, SeventyBAndEightExpertRules) {
  // Llama 3 70B (80 layers, 64 heads, 8 kv heads): attn_v q5_K where q4_K_M gives q4_K.
  {
    const auto t = layout(80, false);
    const auto ty = types_of(GgufOutType::kQ4_K_M, {"llama", 80, 64, 8, 0}, t);
    int q6 = 0;
    for (int64_t i = 0; i < 80; ++i) {
      const GgmlType v = ty.at(fmt::format("blk.{}.attn_v.weight", i));
      EXPECT_EQ(v, more_bits(i, 80) ? GgmlType::kQ6_K : GgmlType::kQ5_K) << i;
      q6 += v == GgmlType::kQ6_K;
      EXPECT_EQ(ty.at(fmt::format("blk.{}.ffn_down.weight", i)),
                more_bits(i, 80) ? GgmlType::kQ6_K : GgmlType::kQ4_K);
      EXPECT_EQ(ty.at(fmt::format("blk.{}.attn_q.weight", i)), GgmlType::kQ4_K);
    }
    EXPECT_EQ(q6, 10 + 10 + 20);  // first 10, last 10, every third of the 60 between
    EXPECT_EQ(ty.at("output.weight"), GgmlType::kQ6_K);
    EXPECT_EQ(ty.at("token_embd.weight"), GgmlType::kQ4_K);
    // Not 70B: multi-head attention (65B), or another layer count.
    // (Layer 11 is not one use_more_bits picks.)
    EXPECT_EQ(
        types_of(GgufOutType::kQ4_K_M, {"llama", 80, 64, 64, 0}, t).at("blk.11.attn_v.weight"),
        GgmlType::kQ4_K);
    EXPECT_EQ(types_of(GgufOutType::kQ4_K_M, {"qwen2", 80, 64, 8, 0}, t).at("blk.11.attn_v.weight"),
              GgmlType::kQ5_K);
    EXPECT_EQ(
        types_of(GgufOutType::kQ4_K_M, {"gemma2", 80, 64, 8, 0}, t).at("blk.11.attn_v.weight"),
        GgmlType::kQ4_K);
    const auto t79 = layout(79, false);
    EXPECT_EQ(
        types_of(GgufOutType::kQ4_K_M, {"llama", 79, 64, 8, 0}, t79).at("blk.12.attn_v.weight"),
        GgmlType::kQ4_K);
    // q5_k_m: the 70B rule only lifts q4_K.
    EXPECT_EQ(types_of(GgufOutType::kQ5_K_M, {"llama", 80, 64, 8, 0}, t).at("blk.11.attn_v.weight"),
              GgmlType::kQ5_K);
  }
  // Mixtral 8x7B: attn_v and attn_k q8_0 in every mixture; attn_output q5_K in q4_k_m;
  // ffn_down_exps by layer; the router f32.
  {
    const auto t = layout(32, true);
    for (const GgufOutType q :
         {GgufOutType::kQ4_K_M, GgufOutType::kQ5_K_M, GgufOutType::kQ6_K, GgufOutType::kQ4_0}) {
      const auto ty = types_of(q, {"llama", 32, 32, 8, 8}, t);
      for (int64_t i = 0; i < 32; ++i) {
        const std::string b = fmt::format("blk.{}.", i);
        EXPECT_EQ(ty.at(b + "attn_v.weight"), GgmlType::kQ8_0);
        EXPECT_EQ(ty.at(b + "attn_k.weight"), GgmlType::kQ8_0);
        EXPECT_EQ(ty.at(b + "ffn_gate_inp.weight"), GgmlType::kF32);
      }
    }
    const auto ty = types_of(GgufOutType::kQ4_K_M, {"llama", 32, 32, 8, 8}, t);
    for (int64_t i = 0; i < 32; ++i) {
      const std::string b = fmt::format("blk.{}.", i);
      EXPECT_EQ(ty.at(b + "attn_output.weight"), GgmlType::kQ5_K);
      EXPECT_EQ(ty.at(b + "ffn_down_exps.weight"),
                more_bits(i, 32) ? GgmlType::kQ6_K : GgmlType::kQ4_K);
      EXPECT_EQ(ty.at(b + "ffn_gate_exps.weight"), GgmlType::kQ4_K);
    }
    EXPECT_EQ(
        types_of(GgufOutType::kQ5_K_M, {"llama", 32, 32, 8, 8}, t).at("blk.0.attn_output.weight"),
        GgmlType::kQ5_K);
    // 4 experts: none of the 8-expert rules.
    const auto four = types_of(GgufOutType::kQ4_K_M, {"llama", 32, 32, 8, 4}, t);
    EXPECT_EQ(four.at("blk.5.attn_v.weight"), GgmlType::kQ4_K);
    EXPECT_EQ(four.at("blk.0.attn_v.weight"), GgmlType::kQ6_K);
    EXPECT_EQ(four.at("blk.0.attn_output.weight"), GgmlType::kQ4_K);
  }
  // Plain types: every matrix the one type, 1-D and norms f32; q8_0 rows of 80 -> f16.
  {
    const std::vector<std::pair<std::string, Shape>> t = {{"blk.0.attn_q.weight", {64, 64}},
                                                          {"blk.0.ffn_down.weight", {64, 80}},
                                                          {"blk.0.attn_q.bias", {64}},
                                                          {"blk.0.attn_norm.weight", {64}}};
    EXPECT_EQ(
        gguf_tensor_types(GgufOutType::kF16, {"llama", 1, 4, 4, 0}, t),
        (std::vector<GgmlType>{GgmlType::kF16, GgmlType::kF16, GgmlType::kF32, GgmlType::kF32}));
    EXPECT_EQ(
        gguf_tensor_types(GgufOutType::kQ8_0, {"llama", 1, 4, 4, 0}, t),
        (std::vector<GgmlType>{GgmlType::kQ8_0, GgmlType::kF16, GgmlType::kF32, GgmlType::kF32}));
  }
}

TEST(GgufQuantTypes, NamesAndFileTypes) {
  const std::pair<const char*, uint32_t> cases[] = {{"f32", 0},     {"f16", 1},  {"bf16", 32},
                                                    {"q8_0", 7},    {"q4_0", 2}, {"q4_k_m", 15},
                                                    {"q5_k_m", 17}, {"q6_k", 18}};
  for (const auto& [name, ft] : cases) {
    const auto t = parse_gguf_out_type(name);
    ASSERT_TRUE(t.has_value()) << name;
    EXPECT_EQ(gguf_file_type(*t), ft) << name;
  }
  for (const char* bad : {"q4_k", "Q4_K_M", "q5_0", "q4_k_s", ""})
    EXPECT_FALSE(parse_gguf_out_type(bad).has_value()) << bad;
}

TEST_F(GgufQuantConvertTest, UnknownQuantIsRefusedByName) {
  Options o;
  o.layers = 1;
  make_checkpoint(o);
  out_ = dir_.file("bad.gguf");
  expect_error([&] { convert_checkpoint_to_gguf(ckpt_, out_, "q3_k_m"); },
               {ckpt_, "'q3_k_m'", "q4_k_m"});
  EXPECT_FALSE(fs::exists(out_));
}

}  // namespace
}  // namespace hyperion::convert
