// `gguf convert` (convert/gguf_convert.h): a hyperion checkpoint or Hugging Face model
// directory written as llama.cpp's GGUF, its metadata, tensor names, RoPE layout and
// vocabulary per family.
#include "convert/gguf_convert.h"

#include <gtest/gtest.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "../test_files.h"
#include "convert_test_util.h"
#include "../text/bpe_tokenizer_fixture.h"
#include "base/error.h"
#include "convert/hf_config.h"
#include "io/atomic_file.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "kernels/quantize.h"
#include "model/param_store.h"
#include "tensor/convert.h"
#include "tensor/quantize_q8_0.h"

namespace hyperion::convert {
namespace {

using namespace hyperion::testing_util;
using namespace hyperion::io;

namespace fs = std::filesystem;


// A SentencePiece BPE model (vocab 300, byte fallback) trained once on generated text.
class ConvertTest : public ::testing::Test {
 protected:
  static constexpr int kSpVocab = 300;

  static void SetUpTestSuite() {
    tok_dir_ = fs::temp_directory_path() / fmt::format("hyp_gguf_tok_{}", ::getpid());
    fs::remove_all(tok_dir_);
    fs::create_directories(tok_dir_);
    const std::vector<std::string> words = {
        "the",   "model", "learns", "tokens", "quickly", "from",     "small",  "batches",
        "of",    "text",  "while",  "heads",  "attend",  "to",       "every",  "position",
        "layer", "norm",  "scales", "hidden", "states",  "gradient", "flows",  "back",
        "zebra", "jumps", "over",   "lazy",   "dogs",    "vexing",   "quartz", "waltz"};
    std::mt19937 rng(5);
    std::string text;
    for (int line = 0; line < 400; ++line) {
      const int n = 4 + int(rng() % 10);
      for (int k = 0; k < n; ++k) text += (k ? " " : "") + words[rng() % words.size()];
      text += line % 7 == 0 ? ". 42!\n" : "\n";
    }
    const std::string corpus = (tok_dir_ / "corpus.txt").string();
    write_bytes(corpus, text);
    const auto status = sentencepiece::SentencePieceTrainer::Train(fmt::format(
        "--input={} --model_prefix={} --vocab_size={} --model_type=bpe --byte_fallback=true "
        "--character_coverage=1.0 --num_threads=1 --minloglevel=2 "
        "--normalization_rule_name=identity --remove_extra_whitespaces=false",
        corpus, (tok_dir_ / "tok").string(), kSpVocab));
    ASSERT_TRUE(status.ok()) << status.ToString();
    // SentencePiece's defaults (NFKC, whitespace collapsing): llama.cpp cannot reproduce
    // them, so converting a checkpoint with this tokenizer must fail.
    const auto nfkc = sentencepiece::SentencePieceTrainer::Train(fmt::format(
        "--input={} --model_prefix={} --vocab_size={} --model_type=bpe --byte_fallback=true "
        "--character_coverage=1.0 --num_threads=1 --minloglevel=2",
        corpus, (tok_dir_ / "nfkc").string(), kSpVocab));
    ASSERT_TRUE(nfkc.ok()) << nfkc.ToString();
  }
  static void TearDownTestSuite() { fs::remove_all(tok_dir_); }

  struct Options {
    int64_t vocab = 304;  // > kSpVocab: the converter pads with [PADi] tokens
    int64_t dim = 64, ff = 80, layers = 2, heads = 4, kv_heads = 2;
    int64_t head_dim = 0;  // > 0: written to config.json (else dim / heads, not written)
    bool tied = false;
    bool write_lm_head = true;    // only looked at when tied
    std::string drop;             // a tensor to leave out
    std::string reshape;          // a tensor to give a wrong shape
    std::string extra;            // an extra tensor to add
    std::string drop_key;         // a config key to leave out
    bool gemma = false;           // a GemmaForCausalLM checkpoint
    std::string model_type;       // "qwen2", "qwen3" or "" (llama / gemma as above)
    bool attention_bias = false;  // llama: biases on q, k, v and o
    nlohmann::json rope_scaling;  // written when not null
  };

  // Builds model.safetensors + config.json + tokenizer.model in dir.path / "ckpt".
  void make_checkpoint(const Options& o) {
    opt_ = o;
    ckpt_ = (dir_.path / "ckpt").string();
    fs::create_directories(ckpt_);
    fs::copy_file(tok_dir_ / "tok.model", fs::path(ckpt_) / "tokenizer.model",
                  fs::copy_options::overwrite_existing);
    const int64_t hd = o.head_dim > 0 ? o.head_dim : o.dim / o.heads;
    std::vector<std::pair<std::string, Shape>> spec = {
        {"model.embed_tokens.weight", {o.vocab, o.dim}}};
    for (int64_t i = 0; i < o.layers; ++i) {
      const std::string p = fmt::format("model.layers.{}.", i);
      spec.push_back({p + "input_layernorm.weight", {o.dim}});
      const bool qkv_bias = o.model_type == "qwen2" || o.attention_bias;
      spec.push_back({p + "self_attn.q_proj.weight", {o.heads * hd, o.dim}});
      if (qkv_bias) spec.push_back({p + "self_attn.q_proj.bias", {o.heads * hd}});
      spec.push_back({p + "self_attn.k_proj.weight", {o.kv_heads * hd, o.dim}});
      if (qkv_bias) spec.push_back({p + "self_attn.k_proj.bias", {o.kv_heads * hd}});
      spec.push_back({p + "self_attn.v_proj.weight", {o.kv_heads * hd, o.dim}});
      if (qkv_bias) spec.push_back({p + "self_attn.v_proj.bias", {o.kv_heads * hd}});
      if (o.model_type == "qwen3") {
        spec.push_back({p + "self_attn.q_norm.weight", {hd}});
        spec.push_back({p + "self_attn.k_norm.weight", {hd}});
      }
      spec.push_back({p + "self_attn.o_proj.weight", {o.dim, o.heads * hd}});
      if (o.attention_bias) spec.push_back({p + "self_attn.o_proj.bias", {o.dim}});
      spec.push_back({p + "post_attention_layernorm.weight", {o.dim}});
      spec.push_back({p + "mlp.gate_proj.weight", {o.ff, o.dim}});
      spec.push_back({p + "mlp.up_proj.weight", {o.ff, o.dim}});
      spec.push_back({p + "mlp.down_proj.weight", {o.dim, o.ff}});
    }
    spec.push_back({"model.norm.weight", {o.dim}});
    if (!o.tied || o.write_lm_head) spec.push_back({"lm_head.weight", {o.vocab, o.dim}});
    if (!o.extra.empty()) spec.push_back({o.extra, {4}});

    RandomWeights r;
    r.spec = &spec;
    r.seed = 17;
    r.bf16_tensor = "model.layers.1.mlp.gate_proj.weight";
    r.drop = o.drop;
    r.reshape = o.reshape;
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
                          {"rope_theta", 500000.0},
                          {"max_position_embeddings", 256},
                          {"tie_word_embeddings", o.tied},
                          {"bos_token_id", 1},
                          {"eos_token_id", 2},
                          {"torch_dtype", "float32"}};
    if (o.head_dim > 0) cfg["head_dim"] = o.head_dim;
    if (o.gemma) {
      cfg["architectures"] = {"GemmaForCausalLM"};
      cfg["model_type"] = "gemma";
      cfg["hidden_activation"] = "gelu_pytorch_tanh";
    }
    if (o.model_type == "qwen2" || o.model_type == "qwen3") {
      cfg["architectures"] = {o.model_type == "qwen2" ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM"};
      cfg["model_type"] = o.model_type;
    }
    if (o.attention_bias) cfg["attention_bias"] = true;
    if (!o.rope_scaling.is_null()) cfg["rope_scaling"] = o.rope_scaling;
    if (!o.drop_key.empty()) cfg.erase(o.drop_key);
    write_bytes((fs::path(ckpt_) / "config.json").string(), cfg.dump(2));
  }

  GgufFile convert(const std::string& type) {
    out_ = dir_.file("model-" + type + ".gguf");
    convert_checkpoint_to_gguf(ckpt_, out_, type);
    return GgufFile::open(out_);
  }

  // Inverse of the q/k row permutation, written from its definition: GGUF row
  // h*hd + 2*j + t holds Hugging Face row h*hd + t*hd/2 + j.
  static std::vector<float> unpermute(const std::vector<float>& g, int64_t rows, int64_t cols,
                                      int64_t n_head) {
    const int64_t hd = rows / n_head;
    std::vector<float> out(g.size());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t h = r / hd, j = (r % hd) / 2, t = r % 2;
      std::copy_n(g.begin() + r * cols, cols, out.begin() + (h * hd + t * (hd / 2) + j) * cols);
    }
    return out;
  }

  static inline fs::path tok_dir_;
  TempDir dir_;
  Options opt_;
  std::string ckpt_, out_;
  std::map<std::string, std::vector<float>> weights_;
};

TEST_F(ConvertTest, F32UntiedMetadataTensorsAndVocab) {
  make_checkpoint({});
  GgufFile f = convert("f32");
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.keys()[0], "general.architecture");
  EXPECT_EQ(f.get_string("general.name"), "ckpt");
  EXPECT_EQ(f.get_u32("general.file_type"), 0u);
  EXPECT_EQ(f.get_u32("general.alignment"), 32u);
  EXPECT_EQ(f.get_u32("llama.context_length"), 256u);
  EXPECT_EQ(f.get_u32("llama.embedding_length"), 64u);
  EXPECT_EQ(f.get_u32("llama.block_count"), 2u);
  EXPECT_EQ(f.get_u32("llama.feed_forward_length"), 80u);
  EXPECT_EQ(f.get_u32("llama.rope.dimension_count"), 16u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count"), 4u);
  EXPECT_EQ(f.get_u32("llama.attention.head_count_kv"), 2u);
  EXPECT_EQ(f.get_f32("llama.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_EQ(f.get_f32("llama.rope.freq_base"), 500000.0f);
  EXPECT_EQ(f.get_u32("llama.vocab_size"), 304u);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f.get_u32("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(f.get_u32("tokenizer.ggml.eos_token_id"), 2u);
  EXPECT_TRUE(f.get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_TRUE(f.get_bool("tokenizer.ggml.add_space_prefix"));
  EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_eos_token"));

  // Vocabulary, against the SentencePiece model itself.
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load((fs::path(ckpt_) / "tokenizer.model").string()).ok());
  ASSERT_EQ(sp.GetPieceSize(), kSpVocab);
  EXPECT_EQ(f.get_u32("tokenizer.ggml.unknown_token_id"), uint32_t(sp.unk_id()));
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  const auto scores = f.get_f32_array("tokenizer.ggml.scores");
  const auto types = f.get_i32_array("tokenizer.ggml.token_type");
  ASSERT_EQ(tokens.size(), 304u);
  ASSERT_EQ(scores.size(), 304u);
  ASSERT_EQ(types.size(), 304u);
  int bytes = 0, normal = 0;
  for (int i = 0; i < kSpVocab; ++i) {
    EXPECT_EQ(tokens[i], sp.IdToPiece(i));
    EXPECT_EQ(scores[i], sp.GetScore(i));
    bytes += types[i] == 6;
    normal += types[i] == 1;
  }
  EXPECT_EQ(bytes, 256);  // byte_fallback pieces <0x00>..<0xFF>
  EXPECT_EQ(tokens[sp.PieceToId("<0x41>")], "<0x41>");
  EXPECT_EQ(types[sp.PieceToId("<0x41>")], 6);
  EXPECT_EQ(normal, kSpVocab - 256 - 3);
  EXPECT_EQ(types[sp.unk_id()], 2);
  EXPECT_EQ(types[sp.bos_id()], 3);
  EXPECT_EQ(types[sp.eos_id()], 3);
  EXPECT_EQ(tokens[300], "[PAD300]");
  EXPECT_EQ(scores[303], -10000.0f);
  EXPECT_EQ(types[303], 5);

  // Tensors: 1 + 9 per layer + output_norm + output.
  ASSERT_EQ(f.tensors().size(), 1u + 9u * 2u + 2u);
  const int64_t dim = 64, hd = 16;
  EXPECT_EQ(f.tensor("token_embd.weight").shape, Shape({304, dim}));
  EXPECT_EQ(f.tensor("blk.1.attn_k.weight").shape, Shape({2 * hd, dim}));
  EXPECT_EQ(f.tensor("blk.0.ffn_down.weight").shape, Shape({dim, 80}));
  for (const auto& t : f.tensors()) EXPECT_EQ(t.type, GgmlType::kF32) << t.name;
  const std::map<std::string, std::string> plain = {
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output_norm.weight", "model.norm.weight"},
      {"output.weight", "lm_head.weight"},
      {"blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight"},
      {"blk.1.ffn_norm.weight", "model.layers.1.post_attention_layernorm.weight"},
      {"blk.0.attn_v.weight", "model.layers.0.self_attn.v_proj.weight"},
      {"blk.0.attn_output.weight", "model.layers.0.self_attn.o_proj.weight"},
      {"blk.1.ffn_gate.weight", "model.layers.1.mlp.gate_proj.weight"},  // stored as bf16
      {"blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight"},
      {"blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight"},
  };
  for (const auto& [gg, hf] : plain) EXPECT_EQ(f.dequantize(gg), weights_.at(hf)) << gg;
  for (int layer = 0; layer < 2; ++layer) {
    const std::string p = fmt::format("model.layers.{}.self_attn.", layer);
    const std::string b = fmt::format("blk.{}.", layer);
    EXPECT_EQ(unpermute(f.dequantize(b + "attn_q.weight"), 4 * hd, dim, 4),
              weights_.at(p + "q_proj.weight"));
    EXPECT_EQ(unpermute(f.dequantize(b + "attn_k.weight"), 2 * hd, dim, 2),
              weights_.at(p + "k_proj.weight"));
    EXPECT_NE(f.dequantize(b + "attn_q.weight"), weights_.at(p + "q_proj.weight"));
  }
  EXPECT_FALSE(testing_util::temp_files_left(out_));
}

// What the permutation is for: Hugging Face applies RoPE to (i, i + hd/2) pairs of each
// head, llama.cpp's llama graph to adjacent (2i, 2i + 1) pairs. With the permuted weights
// the rotated q/k are the same vectors up to the row permutation, so every attention score
// q.k agrees.
TEST_F(ConvertTest, PermutedWeightsGiveTheSameRopeAttentionScores) {
  make_checkpoint({});
  GgufFile f = convert("f32");
  const int64_t dim = 64, hd = 16, heads = 4, kv = 2, half = hd / 2;
  std::mt19937 rng(23);
  const std::vector<float> xq = randn(dim, rng), xk = randn(dim, rng);
  const int pos_q = 7, pos_k = 3;
  auto matvec = [&](const std::vector<float>& w, const std::vector<float>& x, int64_t rows) {
    std::vector<double> y(size_t(rows), 0.0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < dim; ++c) y[r] += double(w[r * dim + c]) * x[c];
    return y;
  };
  auto angle = [&](int pos, int64_t j) { return pos * std::pow(500000.0, -2.0 * j / hd); };
  auto rope_hf = [&](std::vector<double> y, int pos) {  // rotate-half pairs (j, j + half)
    for (size_t h = 0; h < y.size() / hd; ++h)
      for (int64_t j = 0; j < half; ++j) {
        double& a = y[h * hd + j];
        double& b = y[h * hd + j + half];
        const double c = std::cos(angle(pos, j)), s = std::sin(angle(pos, j));
        const double a0 = a;
        a = a0 * c - b * s;
        b = b * c + a0 * s;
      }
    return y;
  };
  auto rope_gguf = [&](std::vector<double> y, int pos) {  // adjacent pairs (2j, 2j + 1)
    for (size_t h = 0; h < y.size() / hd; ++h)
      for (int64_t j = 0; j < half; ++j) {
        double& a = y[h * hd + 2 * j];
        double& b = y[h * hd + 2 * j + 1];
        const double c = std::cos(angle(pos, j)), s = std::sin(angle(pos, j));
        const double a0 = a;
        a = a0 * c - b * s;
        b = b * c + a0 * s;
      }
    return y;
  };
  const auto q_hf =
      rope_hf(matvec(weights_.at("model.layers.0.self_attn.q_proj.weight"), xq, heads * hd), pos_q);
  const auto k_hf =
      rope_hf(matvec(weights_.at("model.layers.0.self_attn.k_proj.weight"), xk, kv * hd), pos_k);
  const auto q_gg = rope_gguf(matvec(f.dequantize("blk.0.attn_q.weight"), xq, heads * hd), pos_q);
  const auto k_gg = rope_gguf(matvec(f.dequantize("blk.0.attn_k.weight"), xk, kv * hd), pos_k);
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t g = h / (heads / kv);  // grouped-query attention: kv head of q head h
    double s_hf = 0, s_gg = 0;
    for (int64_t i = 0; i < hd; ++i) {
      s_hf += q_hf[h * hd + i] * k_hf[g * hd + i];
      s_gg += q_gg[h * hd + i] * k_gg[g * hd + i];
    }
    EXPECT_NEAR(s_gg, s_hf, 1e-9 * (1 + std::fabs(s_hf))) << "head " << h;
  }
}

// hyperion's config.json always states head_dim, which may differ from hidden / heads.
TEST_F(ConvertTest, ExplicitHeadDim) {
  Options o;
  o.head_dim = 8;  // q_proj [32, 64], o_proj [64, 32]
  make_checkpoint(o);
  GgufFile f = convert("f32");
  EXPECT_EQ(f.get_u32("llama.rope.dimension_count"), 8u);
  EXPECT_EQ(f.get_u32("llama.attention.key_length"), 8u);
  EXPECT_EQ(f.get_u32("llama.attention.value_length"), 8u);
  EXPECT_EQ(f.tensor("blk.0.attn_q.weight").shape, Shape({32, 64}));
  EXPECT_EQ(f.tensor("blk.0.attn_k.weight").shape, Shape({16, 64}));
  EXPECT_EQ(f.tensor("blk.0.attn_output.weight").shape, Shape({64, 32}));
  EXPECT_EQ(unpermute(f.dequantize("blk.1.attn_q.weight"), 32, 64, 4),
            weights_.at("model.layers.1.self_attn.q_proj.weight"));
  EXPECT_EQ(unpermute(f.dequantize("blk.1.attn_k.weight"), 16, 64, 2),
            weights_.at("model.layers.1.self_attn.k_proj.weight"));
  // Where head_dim is hidden / heads (given or not) the keys are absent: llama.cpp derives it.
  make_checkpoint({});
  EXPECT_FALSE(convert("f32").has("llama.attention.key_length"));
  o.head_dim = 16;  // = 64 / 4, written to config.json
  make_checkpoint(o);
  EXPECT_FALSE(convert("f32").has("llama.attention.key_length"));
}

// A Gemma converts to llama.cpp's gemma architecture: gemma.* keys, key/value lengths
// always written, norms stored as 1 + w (the scale llama.cpp applies), q/k rows left in
// Hugging Face's rotate-half order, and the head tied to token_embd.
TEST_F(ConvertTest, GemmaArchitectureNormsAndUnpermutedRope) {
  Options o;
  o.gemma = true;
  o.tied = true;
  o.write_lm_head = false;
  o.head_dim = 24;  // not dim / heads
  make_checkpoint(o);
  GgufFile f = convert("f32");
  EXPECT_EQ(f.get_string("general.architecture"), "gemma");
  EXPECT_EQ(f.get_u32("gemma.block_count"), 2u);
  EXPECT_EQ(f.get_u32("gemma.embedding_length"), 64u);
  EXPECT_EQ(f.get_u32("gemma.attention.key_length"), 24u);
  EXPECT_FALSE(f.has("llama.block_count"));
  EXPECT_EQ(f.find("output.weight"), nullptr);
  EXPECT_EQ(f.dequantize("blk.1.attn_q.weight"),
            weights_.at("model.layers.1.self_attn.q_proj.weight"));
  EXPECT_EQ(f.dequantize("blk.0.attn_k.weight"),
            weights_.at("model.layers.0.self_attn.k_proj.weight"));
  for (const auto& [gg, hf] :
       {std::pair<std::string, std::string>{"blk.0.attn_norm.weight",
                                            "model.layers.0.input_layernorm.weight"},
        {"blk.1.ffn_norm.weight", "model.layers.1.post_attention_layernorm.weight"},
        {"output_norm.weight", "model.norm.weight"}}) {
    const std::vector<float> got = f.dequantize(gg), w = weights_.at(hf);
    ASSERT_EQ(got.size(), w.size());
    for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(got[i], w[i] + 1.0f) << gg << " " << i;
  }
}

// Gemma 2 and Gemma 3 (a checkpoint written from the model's own layout and config.json):
// llama.cpp's gemma2 / gemma3 architectures with their soft caps and window, the four
// norms of a layer (and Gemma 3's q/k norms) stored as 1 + w; a model whose pattern,
// scale or caps llama.cpp's graphs would not reproduce is refused by name.
TEST_F(ConvertTest, Gemma2AndGemma3PostNormsCapsAndWindows) {
  for (DecoderFamily f : {DecoderFamily::kGemma2, DecoderFamily::kGemma3}) {
    const bool g3 = f == DecoderFamily::kGemma3;
    SCOPED_TRACE(g3 ? "gemma3" : "gemma2");
    DecoderConfig c;
    c.arch = family_info(f).defaults;
    c.vocab_size = 304;
    c.dim = 64;
    c.n_layers = g3 ? 6 : 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 24;
    c.ffn_dim = 80;
    c.max_seq_len = 256;
    c.tie_embeddings = true;
    c.arch.sliding_window = 32;
    c.arch.query_pre_attn_scalar = 24;
    ParamStore ps(c, false, false);
    ps.init(5, 0.3);
    ckpt_ = (dir_.path / (g3 ? "g3" : "g2")).string();
    fs::create_directories(ckpt_);
    fs::copy_file(tok_dir_ / "tok.model", fs::path(ckpt_) / "tokenizer.model",
                  fs::copy_options::overwrite_existing);
    auto write_store = [&](const DecoderConfig& cfg, const ParamStore& store) {
      SafetensorsWriter w;
      for (const ParamInfo& p : store.infos())
        w.add(p.name, DType::kF32, p.shape, store.params() + p.offset);
      w.write((fs::path(ckpt_) / "model.safetensors").string());
      write_bytes((fs::path(ckpt_) / "config.json").string(), convert::to_hf_config_json(cfg));
    };
    auto write = [&](const DecoderConfig& cfg) { write_store(cfg, ps); };
    write(c);
    GgufFile g = convert("f32");
    const std::string a = g3 ? "gemma3" : "gemma2";
    EXPECT_EQ(g.get_string("general.architecture"), a);
    EXPECT_EQ(g.get_u32(a + ".attention.sliding_window"), 32u);
    EXPECT_EQ(g.get_u32(a + ".attention.key_length"), 24u);
    if (!g3) {
      EXPECT_EQ(g.get_f32("gemma2.attn_logit_softcapping"), 50.0f);
      EXPECT_EQ(g.get_f32("gemma2.final_logit_softcapping"), 30.0f);
    } else {
      EXPECT_FALSE(g.has("gemma3.attn_logit_softcapping"));
    }
    std::vector<std::pair<std::string, std::string>> norms = {
        {"blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight"},
        {"blk.1.post_attention_norm.weight", "model.layers.1.post_attention_layernorm.weight"},
        {"blk.1.ffn_norm.weight", "model.layers.1.pre_feedforward_layernorm.weight"},
        {"blk.1.post_ffw_norm.weight", "model.layers.1.post_feedforward_layernorm.weight"}};
    if (g3) norms.push_back({"blk.0.attn_k_norm.weight", "model.layers.0.self_attn.k_norm.weight"});
    for (const auto& [gg, hf] : norms) {
      const std::vector<float> got = g.dequantize(gg);
      const ParamInfo* info = ps.find(hf);
      ASSERT_NE(info, nullptr) << hf;
      ASSERT_EQ(int64_t(got.size()), info->numel) << gg;
      for (int64_t i = 0; i < info->numel; ++i)
        ASSERT_EQ(got[size_t(i)], ps.params()[info->offset + i] + 1.0f) << gg << " " << i;
    }
    // What llama.cpp's graph would compute differently: refused, naming the key.
    DecoderConfig other = c;
    other.arch.query_pre_attn_scalar = 16;
    write(other);
    expect_error([&] { convert("f32"); }, {"config.json", "query_pre_attn_scalar"});
    other = c;
    other.arch.sliding_window_pattern = 3;
    write(other);
    expect_error([&] { convert("f32"); }, {"config.json", "layer_types"});
    if (!g3) {
      // llama.cpp's "27B" Gemma 2 (46 layers) scales by 1/sqrt(hidden_size / heads).
      DecoderConfig big = c;
      big.n_layers = 46;
      big.arch.query_pre_attn_scalar = 16;  // 64 / 4
      ParamStore big_ps(big, false, false);
      big_ps.init(6, 0.3);
      write_store(big, big_ps);
      EXPECT_EQ(convert("f32").get_u32("gemma2.block_count"), 46u);
      big.arch.query_pre_attn_scalar = 24;  // head_dim: right for 26 layers, not for 46
      write_store(big, big_ps);
      expect_error([&] { convert("f32"); }, {"query_pre_attn_scalar", "46 layers"});
    }
  }
}

// Qwen2 (q/k/v biases) and Qwen3 (q/k norms) as llama.cpp's qwen2 / qwen3 architectures:
// rows kept in Hugging Face's order (their graphs rotate halves), biases and norms f32.
TEST_F(ConvertTest, QwenArchitecturesBiasesAndQkNorms) {
  for (const char* mt : {"qwen2", "qwen3"}) {
    SCOPED_TRACE(mt);
    Options o;
    o.model_type = mt;
    o.head_dim = mt == std::string("qwen3") ? 24 : 0;
    make_checkpoint(o);
    GgufFile f = convert("f16");
    EXPECT_EQ(f.get_string("general.architecture"), mt);
    const std::string a = mt;
    EXPECT_EQ(f.get_u32(a + ".block_count"), 2u);
    EXPECT_EQ(f.get_u32(a + ".attention.head_count_kv"), 2u);
    const int64_t hd = o.head_dim > 0 ? o.head_dim : 16;
    EXPECT_EQ(f.get_u32(a + ".rope.dimension_count"), uint32_t(hd));
    // q_proj is not permuted.
    std::vector<float> q = f.dequantize("blk.1.attn_q.weight");
    const std::vector<float>& want = weights_.at("model.layers.1.self_attn.q_proj.weight");
    ASSERT_EQ(q.size(), want.size());
    for (size_t i = 0; i < q.size(); ++i)
      ASSERT_NEAR(q[i], want[i], 1e-3f * (1 + std::fabs(want[i])));
    if (a == "qwen2") {
      EXPECT_EQ(f.dequantize("blk.0.attn_k.bias"),
                weights_.at("model.layers.0.self_attn.k_proj.bias"));
      EXPECT_EQ(f.tensor("blk.0.attn_v.bias").type, GgmlType::kF32);
      EXPECT_EQ(f.find("blk.0.attn_output.bias"), nullptr);
    } else {
      EXPECT_EQ(f.dequantize("blk.1.attn_q_norm.weight"),
                weights_.at("model.layers.1.self_attn.q_norm.weight"));
      EXPECT_EQ(f.tensor("blk.1.attn_k_norm.weight").type, GgmlType::kF32);
      EXPECT_EQ(f.get_u32("qwen3.attention.key_length"), 24u);
    }
  }
}

// Llama with attention_bias: the q/k biases are permuted with their rows; Llama 3.1's
// scaled RoPE becomes rope_freqs.weight (plain over scaled frequency), linear and YaRN
// become rope.scaling.* keys.
TEST_F(ConvertTest, AttentionBiasAndRopeScaling) {
  Options o;
  o.attention_bias = true;
  o.rope_scaling = {{"rope_type", "llama3"},
                    {"factor", 8.0},
                    {"low_freq_factor", 1.0},
                    {"high_freq_factor", 4.0},
                    {"original_max_position_embeddings", 64}};
  make_checkpoint(o);
  GgufFile f = convert("f32");
  const std::vector<float> qb = f.dequantize("blk.0.attn_q.bias");
  EXPECT_EQ(unpermute(qb, 64, 1, 4), weights_.at("model.layers.0.self_attn.q_proj.bias"));
  const std::vector<float> kb = f.dequantize("blk.0.attn_k.bias");
  EXPECT_EQ(unpermute(kb, 32, 1, 2), weights_.at("model.layers.0.self_attn.k_proj.bias"));
  EXPECT_EQ(f.dequantize("blk.1.attn_output.bias"),
            weights_.at("model.layers.1.self_attn.o_proj.bias"));
  const std::vector<float> factors = f.dequantize("rope_freqs.weight");
  ASSERT_EQ(factors.size(), 8u);  // head_dim 16
  // theta 500000, head_dim 16: wavelengths 2 pi 500000^(i/8); original context 64 ->
  // high band (< 16) kept (factor 1), low band (> 64) divided by 8.
  for (size_t i = 0; i < factors.size(); ++i) {
    const double wavelen = 2 * M_PI * std::pow(500000.0, double(i) / 8);
    if (wavelen < 16) {
      EXPECT_FLOAT_EQ(factors[i], 1.0f) << i;
    }
    if (wavelen > 64) {
      EXPECT_FLOAT_EQ(factors[i], 8.0f) << i;
    }
    if (wavelen >= 16 && wavelen <= 64) {
      EXPECT_GT(factors[i], 1.0f);
      EXPECT_LT(factors[i], 8.0f);
    }
  }
  EXPECT_FALSE(f.has("llama.rope.scaling.type"));
  o = Options{};
  o.rope_scaling = {
      {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}};
  make_checkpoint(o);
  GgufFile y = convert("f32");
  EXPECT_EQ(y.get_string("llama.rope.scaling.type"), "yarn");
  EXPECT_EQ(y.get_f32("llama.rope.scaling.factor"), 4.0f);
  EXPECT_EQ(y.get_u32("llama.rope.scaling.original_context_length"), 64u);
  o.rope_scaling = {{"rope_type", "linear"}, {"factor", 2.0}};
  make_checkpoint(o);
  GgufFile l = convert("f32");
  EXPECT_EQ(l.get_string("llama.rope.scaling.type"), "linear");
  EXPECT_EQ(l.get_f32("llama.rope.scaling.factor"), 2.0f);
}

TEST_F(ConvertTest, TiedEmbeddingsOmitOutput) {
  Options o;
  o.tied = true;
  o.write_lm_head = false;
  make_checkpoint(o);
  GgufFile f = convert("f16");
  EXPECT_EQ(f.tensors().size(), 1u + 9u * 2u + 1u);
  EXPECT_EQ(f.find("output.weight"), nullptr);
  EXPECT_NE(f.find("output_norm.weight"), nullptr);
  // A saved copy of the tied head is not needed either.
  o.write_lm_head = true;
  make_checkpoint(o);
  EXPECT_EQ(convert("f16").find("output.weight"), nullptr);
}

TEST_F(ConvertTest, HalfPrecisionTypes) {
  make_checkpoint({});
  for (const auto& [name, type, file_type] :
       {std::tuple{"f16", GgmlType::kF16, 1u}, std::tuple{"bf16", GgmlType::kBF16, 32u}}) {
    SCOPED_TRACE(name);
    GgufFile f = convert(name);
    EXPECT_EQ(f.get_u32("general.file_type"), file_type);
    for (const auto& t : f.tensors()) {
      const bool one_d = t.shape.rank() == 1;
      EXPECT_EQ(t.type, one_d ? GgmlType::kF32 : type) << t.name;
    }
    const std::vector<float>& up = weights_.at("model.layers.0.mlp.up_proj.weight");
    const std::vector<float> got = f.dequantize("blk.0.ffn_up.weight");
    for (size_t i = 0; i < up.size(); ++i) {
      const float want =
          type == GgmlType::kF16 ? f16_to_f32(f32_to_f16(up[i])) : bf16_to_f32(f32_to_bf16(up[i]));
      ASSERT_EQ(got[i], want) << i;
    }
    EXPECT_EQ(f.dequantize("blk.0.attn_norm.weight"),
              weights_.at("model.layers.0.input_layernorm.weight"));
  }
}

TEST_F(ConvertTest, Q8_0TypeSelection) {
  make_checkpoint({});
  GgufFile f = convert("q8_0");
  EXPECT_EQ(f.get_u32("general.file_type"), 7u);
  EXPECT_EQ(f.tensor("token_embd.weight").type, GgmlType::kQ8_0);
  EXPECT_EQ(f.tensor("blk.0.attn_q.weight").type, GgmlType::kQ8_0);
  EXPECT_EQ(f.tensor("blk.0.attn_output.weight").type, GgmlType::kQ8_0);
  EXPECT_EQ(f.tensor("blk.0.ffn_gate.weight").type, GgmlType::kQ8_0);  // rows of 64
  EXPECT_EQ(f.tensor("blk.0.ffn_down.weight").type, GgmlType::kF16);   // rows of 80
  EXPECT_EQ(f.tensor("blk.0.attn_norm.weight").type, GgmlType::kF32);
  EXPECT_EQ(f.tensor("output_norm.weight").type, GgmlType::kF32);
  EXPECT_EQ(f.tensor("output.weight").type, GgmlType::kQ8_0);
  // Q8_0 data is exactly llama.cpp's quantisation of the permuted weights.
  const int64_t rows = 64, cols = 64;
  std::vector<float> permuted(size_t(rows * cols));
  permute_rope_rows_for_gguf(weights_.at("model.layers.1.self_attn.q_proj.weight").data(),
                             permuted.data(), rows, cols, 4);
  std::vector<unsigned char> q(ggml_nbytes(GgmlType::kQ8_0, rows * cols));
  ref::quantize_row_q8_0(permuted.data(), q.data(), rows * cols);
  const GgufTensor& t = f.tensor("blk.1.attn_q.weight");
  ASSERT_EQ(t.nbytes, q.size());
  EXPECT_EQ(std::memcmp(t.data, q.data(), q.size()), 0);
  const std::vector<float> down = f.dequantize("blk.1.ffn_down.weight");
  const std::vector<float>& want = weights_.at("model.layers.1.mlp.down_proj.weight");
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(down[i], f16_to_f32(f32_to_f16(want[i])));
}

// A checkpoint trained with quantization: int8 maps its per-channel int8 weights into
// Q8_0 as they are: every block of a row holds the row's int8 values (those of the
// training forward: the weights quantised per output channel) and the row's scale in f16.
TEST_F(ConvertTest, Q8_0KeepsTheInt8OfQuantizedTraining) {
  make_checkpoint({});
  write_bytes((fs::path(ckpt_) / "trainer_state.json").string(),
              R"({"step": 5, "config": {"quantization": "int8", "quantize_logits": "false"}})");
  GgufFile f = convert("q8_0");
  auto check_matrix = [&](const std::string& gg, std::vector<float> w, int64_t rows, int64_t cols) {
    std::vector<int8_t> q(w.size());
    std::vector<float> s(static_cast<size_t>(rows));
    quantize_rows(TensorView(w.data(), DType::kF32, {rows, cols}),
                  TensorView(q.data(), DType::kI8, {rows, cols}), s.data());
    const GgufTensor& t = f.tensor(gg);
    ASSERT_EQ(t.type, GgmlType::kQ8_0) << gg;
    const auto* blocks = static_cast<const unsigned char*>(t.data);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < cols / 32; ++b) {
        const unsigned char* blk = blocks + (r * (cols / 32) + b) * 34;
        uint16_t d;
        std::memcpy(&d, blk, 2);
        ASSERT_EQ(d, f32_to_f16(s[size_t(r)]).bits) << gg << " row " << r;
        ASSERT_EQ(std::memcmp(blk + 2, q.data() + r * cols + b * 32, 32), 0) << gg << " row " << r;
      }
  };
  std::vector<float> permuted(64 * 64);
  permute_rope_rows_for_gguf(weights_.at("model.layers.1.self_attn.q_proj.weight").data(),
                             permuted.data(), 64, 64, 4);
  check_matrix("blk.1.attn_q.weight", permuted, 64, 64);
  check_matrix("blk.0.ffn_gate.weight", weights_.at("model.layers.0.mlp.gate_proj.weight"), opt_.ff,
               64);
  // The embedding and the unquantised head keep llama.cpp's own block quantisation.
  const std::vector<float>& head = weights_.at("lm_head.weight");
  std::vector<unsigned char> want(ggml_nbytes(GgmlType::kQ8_0, int64_t(head.size())));
  ref::quantize_row_q8_0(head.data(), want.data(), int64_t(head.size()));
  EXPECT_EQ(std::memcmp(f.tensor("output.weight").data, want.data(), want.size()), 0);
}

TEST_F(ConvertTest, RejectsTokenizerNormalisationLlamaCppCannotReproduce) {
  make_checkpoint({});
  fs::copy_file(tok_dir_ / "nfkc.model", fs::path(ckpt_) / "tokenizer.model",
                fs::copy_options::overwrite_existing);
  out_ = dir_.file("nfkc.gguf");
  expect_error([&] { convert_checkpoint_to_gguf(ckpt_, out_, "f32"); },
               {ckpt_, "tokenizer.model", "nmt_nfkc", "remove_extra_whitespaces"});
  EXPECT_FALSE(fs::exists(out_));
}

// A Qwen3 checkpoint whose tokenizer is a tokenizer.json (as the Hub ships Qwen and Llama
// 3): the GGUF carries a "gpt2" vocabulary with the qwen2 pre-tokenizer, its merges, no
// BOS, and the chat template, beside the same tensors as with a SentencePiece tokenizer.
TEST_F(ConvertTest, TokenizerJsonBecomesAGpt2Vocabulary) {
  Options o;
  o.model_type = "qwen3";
  make_checkpoint(o);
  fs::remove(fs::path(ckpt_) / "tokenizer.model");
  testing_util::write_hf_tokenizer(
      ckpt_, testing_util::bpe_tokenizer(testing_util::kQwen2Split, true, true), false);
  const GgufFile f = convert("f32");
  EXPECT_EQ(f.get_string("general.architecture"), "qwen3");
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "qwen2");
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), size_t(o.vocab));
  EXPECT_EQ(tokens[300], "<|begin_of_text|>");
  EXPECT_EQ(tokens[303], "[PAD303]");
  EXPECT_EQ(f.array_size("tokenizer.ggml.merges"), 3u);
  EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_FALSE(f.has("tokenizer.ggml.scores"));
  EXPECT_TRUE(f.has("tokenizer.chat_template"));
  EXPECT_EQ(f.get_u32("tokenizer.ggml.bos_token_id"), 1u);  // config.json's ids
  EXPECT_TRUE(f.find("blk.0.attn_q_norm.weight") != nullptr);
}

TEST_F(ConvertTest, ErrorsNameDirectoryFileAndField) {
  auto expect_fails = [&](const Options& o, std::vector<std::string> needles,
                          const std::string& type = "f32") {
    make_checkpoint(o);
    out_ = dir_.file("bad.gguf");
    needles.push_back(ckpt_);
    expect_error([&] { convert_checkpoint_to_gguf(ckpt_, out_, type); }, needles);
    EXPECT_FALSE(fs::exists(out_));
    EXPECT_FALSE(testing_util::temp_files_left(out_));
  };
  Options o;
  o.drop_key = "hidden_size";
  expect_fails(o, {"config.json", "missing key 'hidden_size'"});
  o = {};
  o.drop = "model.layers.1.self_attn.v_proj.weight";
  expect_fails(o, {"model.safetensors", "missing tensor 'model.layers.1.self_attn.v_proj.weight'"});
  o = {};
  o.reshape = "model.layers.0.mlp.down_proj.weight";
  expect_fails(
      o, {"model.safetensors", "'model.layers.0.mlp.down_proj.weight'", "[66, 80]", "[64, 80]"});
  o = {};
  o.drop = "lm_head.weight";
  expect_fails(o, {"missing tensor 'lm_head.weight'", "tie_word_embeddings"});
  o = {};
  o.extra = "model.layers.2.self_attn.q_proj.weight";
  expect_fails(o, {"model.safetensors", "'model.layers.2.self_attn.q_proj.weight'"});
  expect_fails({}, {"unknown output type 'q3_k_m'"}, "q3_k_m");

  make_checkpoint({});
  fs::remove(fs::path(ckpt_) / "tokenizer.model");
  expect_error([&] { convert_checkpoint_to_gguf(ckpt_, dir_.file("x.gguf"), "f32"); },
               {ckpt_, "tokenizer.model"});
  make_checkpoint({});
  write_bytes((fs::path(ckpt_) / "config.json").string(), "{\"vocab_size\": 304,");
  expect_error([&] { convert_checkpoint_to_gguf(ckpt_, dir_.file("x.gguf"), "f32"); },
               {ckpt_, "config.json", "invalid JSON"});
  write_bytes((fs::path(ckpt_) / "config.json").string(),
              R"({"vocab_size": 304, "hidden_size": "64"})");
  expect_error([&] { convert_checkpoint_to_gguf(ckpt_, dir_.file("x.gguf"), "f32"); },
               {ckpt_, "config.json", "'hidden_size'", "not an integer"});
  fs::remove(fs::path(ckpt_) / "config.json");
  expect_error([&] { convert_checkpoint_to_gguf(ckpt_, dir_.file("x.gguf"), "f32"); },
               {ckpt_, "config.json"});
  // A sliding window llama.cpp's llama graph would ignore.
  make_checkpoint({});
  {
    auto cfg = nlohmann::json::parse(read_file((fs::path(ckpt_) / "config.json").string()));
    cfg["model_type"] = "mistral";
    cfg["architectures"] = {"MistralForCausalLM"};
    cfg["sliding_window"] = 16;
    write_bytes((fs::path(ckpt_) / "config.json").string(), cfg.dump());
  }
  expect_error([&] { convert_checkpoint_to_gguf(ckpt_, dir_.file("x.gguf"), "f32"); },
               {ckpt_, "sliding_window", "16"});
  // The tokenizer has more pieces than the model's vocabulary.
  o = {};
  o.vocab = 200;
  expect_fails(o, {"tokenizer.model", "300 pieces", "vocab_size is 200"});
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_.path), fs::directory_iterator()), 1);
}

}  // namespace
}  // namespace hyperion::convert
