#include "train/train_config.h"

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/log.h"
#include "base/source_dir.h"
#include "io/atomic_file.h"
#include "kernels/hardware.h"
#include "diffusion/train_config.h"
#include "recsys/dlrm_config.h"
#include "text/tokenizer.h"
#include "train/checkpoint.h"

namespace hyperion {

namespace fs = std::filesystem;

const char* const kTinyPresetYaml =
    R"(# tiny: the embedded default of `hyperion train`. A small Llama trained on the bundled
# corpus in a few minutes on two cores, then evaluated and sampled.
model_name: tiny
vocab_size: 2048
base_emb_dim: 256
base_num_decoder_layers: 4
base_num_query_heads: 8
base_num_kv_heads: 4
base_mlp_dim: 704
max_target_length: 256
per_device_batch_size: 16
steps: 600
learning_rate: 3.0e-3
warmup_steps_fraction: 0.05
lr_schedule: cosine
cosine_learning_rate_final_fraction: 0.1
adam_weight_decay: 0.1
dtype: bfloat16
remat_policy: none
log_period: 50
eval_interval: 200
checkpoint_period: 200
)";

std::vector<ConfigKey> train_config_schema() {
  using T = ConfigType;
  std::vector<ConfigKey> keys = {
      // Model (MaxText names; Hugging Face config.json equivalents in the help).
      {"model_name", T::kString, "", "preset name, for logs"},
      {"model_type", T::kString, "decoder",
       "decoder (a language model: the keys below), dlrm (a DLRM-V2 recommender: the dlrm.* "
       "keys) or diffusion (a latent diffusion model: the diffusion.* keys)"},
      {"decoder_block", T::kString, "llama2",
       "decoder family: llama2 (also llama3, mistral, mixtral), gemma ((1 + w) RMSNorm, "
       "GELU-tanh MLP, embeddings scaled by sqrt(base_emb_dim), head tied to the embedding), "
       "qwen2 (q/k/v biases) or qwen3 (q/k RMSNorm per head)"},
      {"vocab_size", T::kInt, "32000",
       "vocabulary size (also the tokenizer's when one is trained)"},
      {"base_emb_dim", T::kInt, "4096", "hidden_size"},
      {"base_num_decoder_layers", T::kInt, "32", "num_hidden_layers"},
      {"base_num_query_heads", T::kInt, "32", "num_attention_heads"},
      {"base_num_kv_heads", T::kInt, "32", "num_key_value_heads (GQA when fewer)"},
      {"head_dim", T::kInt, "0", "attention head size (0: base_emb_dim / heads)"},
      {"base_mlp_dim", T::kInt, "11008", "intermediate_size of the SwiGLU MLP"},
      {"normalization_layer_epsilon", T::kFloat, "1e-5", "rms_norm_eps"},
      {"rope_max_timescale", T::kFloat, "10000", "rope_theta"},
      {"rope_type", T::kString, "default",
       "RoPE scaling (rope_scaling.rope_type): default | linear | llama3 (Llama 3.1, also "
       "llama3.1) | yarn"},
      {"rope_factor", T::kFloat, "1", "rope_scaling.factor (linear, llama3, yarn)"},
      {"rope_low_freq_factor", T::kFloat, "1", "rope_scaling.low_freq_factor (llama3)"},
      {"rope_high_freq_factor", T::kFloat, "4", "rope_scaling.high_freq_factor (llama3)"},
      {"original_max_position_embeddings", T::kInt, "0",
       "rope_scaling.original_max_position_embeddings: the trained context (llama3, yarn)"},
      {"beta_fast", T::kFloat, "32", "rope_scaling.beta_fast (yarn)"},
      {"beta_slow", T::kFloat, "1", "rope_scaling.beta_slow (yarn)"},
      {"rope_attention_factor", T::kFloat, "0",
       "rope_scaling.attention_factor (yarn; 0: 0.1 ln(factor) + 1)"},
      {"attention_bias", T::kBool, "false",
       "biases on q_proj, k_proj, v_proj and o_proj (attention_bias; qwen2 always has q/k/v "
       "biases)"},
      {"sliding_window_size", T::kInt, "-1",
       "local attention window in tokens (sliding_window; Mistral v0.1: 4096); 0: global; "
       "-1: the family's (gemma2 4096, gemma3 4096, others 0)"},
      {"sliding_window_pattern", T::kInt, "-1",
       "with a window: 0 = every layer local; N >= 2 = every N-th layer global; -1: the "
       "family's (gemma2 2, gemma3 6, others 0)"},
      {"attn_logits_soft_cap", T::kFloat, "-1",
       "attention scores capped by cap * tanh(s / cap) (attn_logit_softcapping); 0: off; -1: "
       "the family's (gemma2 50)"},
      {"final_logits_soft_cap", T::kFloat, "-1",
       "logits capped by cap * tanh(z / cap) (final_logit_softcapping); 0: off; -1: the "
       "family's (gemma2 30)"},
      {"query_pre_attn_scalar", T::kFloat, "-1",
       "attention scale 1/sqrt(this); 0: 1/sqrt(head_dim); -1: the family's (gemma2/3 256)"},
      {"local_rope_max_timescale", T::kFloat, "-1",
       "RoPE base of the sliding-window layers, unscaled (rope_local_base_freq); 0: the global "
       "RoPE; -1: the family's (gemma3 10000)"},

      {"logits_via_embedding", T::kBool, "false", "tie lm_head to the embedding"},
      {"max_position_embeddings", T::kInt, "0", "0: max_target_length"},
      // Mixture of experts (MaxText names; Hugging Face MixtralConfig in the help).
      {"num_experts", T::kInt, "0", "experts per MoE layer (num_local_experts); 0: dense"},
      {"num_experts_per_tok", T::kInt, "2", "experts each token is routed to (top-k)"},
      {"base_moe_mlp_dim", T::kInt, "0", "intermediate_size of one expert (0: base_mlp_dim)"},
      {"first_num_dense_layers", T::kInt, "0", "leading layers that keep a dense MLP"},
      {"interleave_moe_layer_step", T::kInt, "1",
       "every N-th layer after those is MoE (1: all of them)"},
      {"norm_topk_prob", T::kBool, "true",
       "renormalise the k chosen router probabilities (Mixtral)"},
      {"capacity_factor", T::kFloat, "-1",
       "> 0: capped experts (capacity per expert = max(ceil(T*k/E)*cf, cf) per sequence, "
       "tokens past it dropped); -1: dropless"},
      {"sparse_matmul", T::kBool, "true",
       "grouped GEMM over the tokens sorted by expert (dropless needs it)"},
      {"load_balance_loss_weight", T::kFloat, "0.01", "Switch load-balance loss weight"},
      {"router_z_loss_weight", T::kFloat, "0", "router z-loss weight (0: off)"},
      // Data.
      {"dataset_path", T::kString, "",
       "prepared dataset dir, or a .txt/.jsonl file; empty: the bundled corpus"},
      {"tokenizer_path", T::kString, "",
       "existing tokenizer: a SentencePiece .model, a tokenizer.json or a directory holding "
       "one (else one is trained)"},
      {"load_parameters_path", T::kString, "",
       "fine-tune: start from this Hugging Face model directory's (or checkpoint's) weights; "
       "the model's shape is its config.json, its tokenizer the default tokenizer_path, the "
       "optimizer fresh"},
      {"max_target_length", T::kInt, "2048", "sequence length"},
      {"per_device_batch_size", T::kInt, "8", "sequences per micro-batch"},
      {"gradient_accumulation_steps", T::kInt, "1", "micro-batches per optimizer step"},
      {"data_shuffle_seed", T::kInt, "0", "seed of the per-epoch sequence order"},
      {"eval_fraction", T::kFloat, "0.05",
       "held-out fraction of documents when preparing (use_sft: of the conversations, the file's last)"},
      {"use_sft", T::kBool, "false",
       "supervised fine-tuning: dataset_path is a JSONL file of conversations (messages, or "
       "prompt and completion), rendered with the tokenizer's chat template (docs/POST_TRAINING.md)"},
      {"sft_train_on_completion_only", T::kBool, "true",
       "use_sft: the loss on the assistant's tokens only (false: on every token)"},
      {"use_dpo", T::kBool, "false",
       "direct preference optimisation: dataset_path is a JSONL file of prompt, chosen and rejected "
       "(strings or messages), rendered with the tokenizer's chat template (docs/POST_TRAINING.md)"},
      {"dpo_beta", T::kFloat, "0.1", "use_dpo: the loss's beta (how far from the reference)"},
      {"dpo_label_smoothing", T::kFloat, "0", "use_dpo: in [0, 0.5), the chance a preference is flipped"},
      {"lora_rank", T::kInt, "0",
       "LoRA: the adapters' rank r (>= 1 trains adapters on a frozen base, saved in PEFT's layout; 0: "
       "the whole model trains)"},
      {"lora_alpha", T::kFloat, "16", "LoRA: the adapters' scale is lora_alpha / lora_rank"},
      {"lora_dropout", T::kFloat, "0", "LoRA: dropout on the adapters' input while training (PEFT's lora_dropout)"},
      {"lora_target_modules", T::kString, "all-linear",
       "LoRA: the adapted matrices, PEFT's names (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj) "
       "or all-linear"},
      {"packing", T::kBool, "false",
       "use_sft: several conversations per sequence, each attending to itself only (false: one "
       "conversation per sequence, padded)"},
      // Optimizer and schedule.
      {"steps", T::kInt, "100", "optimizer steps"},
      {"learning_rate", T::kFloat, "3e-4", "peak learning rate"},
      {"lr_schedule", T::kString, "cosine", "cosine | wsd | constant"},
      {"warmup_steps_fraction", T::kFloat, "0.1", "linear warmup, fraction of steps"},
      {"cosine_learning_rate_final_fraction", T::kFloat, "0.1", "final lr / peak lr"},
      {"wsd_decay_steps_fraction", T::kFloat, "0.1", "WSD: fraction of steps that decay"},
      {"wsd_decay_style", T::kString, "linear", "WSD decay: linear | cosine"},
      {"adam_b1", T::kFloat, "0.9", "AdamW beta1"},
      {"adam_b2", T::kFloat, "0.95", "AdamW beta2"},
      {"adam_eps", T::kFloat, "1e-8", "AdamW epsilon"},
      {"adam_weight_decay", T::kFloat, "0.1", "decoupled weight decay"},
      {"weight_decay_exclude_norms_and_embeddings", T::kBool, "true",
       "no decay on norms and embeddings"},
      {"gradient_clipping_threshold", T::kFloat, "1.0", "global grad-norm clip (0: off)"},
      {"init_weights_seed", T::kInt, "0", "parameter initialisation seed"},
      // Precision and memory.
      {"hardware", T::kString, "cpu", "cpu | gpu (docs/GPU.md)"},
      {"dtype", T::kString, "bfloat16", "compute dtype: bfloat16 | float32"},
      {"weight_dtype", T::kString, "float32", "master weights and optimizer state: float32"},
      {"remat_policy", T::kString, "minimal", "full | minimal | none"},
      {"quantization", T::kString, "",
       "quantised training matmuls: int8 | fp8 (empty: off; needs dtype bfloat16)"},
      {"quantize_logits", T::kBool, "false", "quantise the LM head's matmul too"},
      {"fp8_amax_history_len", T::kInt, "1024", "fp8 delayed scaling: amax history length"},
      {"fp8_amax_margin", T::kFloat, "0", "fp8 delayed scaling: scale x 2^margin"},
      // Checkpointing and logging.
      {"base_output_directory", T::kString, "runs", "parent of run directories"},
      {"run_name", T::kString, "", "run directory name (empty: preset + timestamp)"},
      {"enable_checkpointing", T::kBool, "true", "save checkpoints"},
      {"checkpoint_period", T::kInt, "0", "save every N steps (0: only at the end)"},
      {"max_num_checkpoints_to_keep", T::kInt, "2", "older checkpoints are deleted"},
      {"checkpoint_max_shard_bytes", T::kInt, "5000000000",
       "past this size a checkpoint's weights are split into Hugging Face's sharded layout "
       "(model-0000k-of-0000n.safetensors + index), as save_pretrained's max_shard_size "
       "(5 GB); 0: one file"},
      {"async_checkpointing", T::kBool, "true", "write checkpoints off the training thread"},
      {"log_period", T::kInt, "10", "print a metrics line every N steps"},
      {"eval_interval", T::kInt, "0", "held-out eval every N steps (0: only at the end)"},
      {"eval_batches", T::kInt, "8", "micro-batches per held-out eval (0: whole split)"},
      {"peak_tflops", T::kFloat, "0", "MFU denominator (0: measure this machine's peak)"},
      {"sample_count", T::kInt, "2", "samples printed after training"},
      {"sample_max_tokens", T::kInt, "64", "tokens per sample"},
      {"sample_temperature", T::kFloat, "0.8", "sampling temperature"},
      // Multi-process (MPI) training: the mesh and its communication.
      {"data_parallelism", T::kInt, "-1", "data-parallel ranks (-1: the ranks left over)"},
      {"fsdp_parallelism", T::kInt, "1", "FSDP (ZeRO-3) ranks (-1: the ranks left over)"},
      {"expert_parallelism", T::kInt, "1", "ranks the MoE experts are sharded over (-1: rest)"},
      {"shard_optimizer_over_data", T::kBool, "false",
       "ZeRO-1: shard the optimizer state over the data-parallel ranks"},
      {"communicator", T::kString, "auto", "auto | single | mpi"},
      {"collective_timeout_s", T::kFloat, "300",
       "a collective not finished after this long aborts the job, naming the lagging ranks"},
      {"check_links", T::kBool, "true",
       "several hosts: time every host's link before the first step and name a slow one"},
      {"check_links_period", T::kInt, "0",
       "with check_links: time the links again every N steps (0: before the first step only)"},
      {"overlap_communication", T::kBool, "true",
       "reduce gradient buckets during the backward (false: after it, for measurement)"},
      // Monitoring (docs/MONITORING.md).
      {"enable_monitoring", T::kBool, "true",
       "event log (goodput), per-rank gathers (ranks.jsonl, stragglers), stack dumps"},
      {"metrics_port", T::kInt, "0", "serve Prometheus metrics on metrics_port + rank (0: off)"},
      {"metrics_host", T::kString, "0.0.0.0", "address the metrics endpoints listen on"},
      {"monitor_top_n", T::kInt, "3", "ranks listed per metric by mean and by max"},
      {"straggler_periods", T::kInt, "2",
       "log periods a rank must stay above median + 3 MAD to be named a straggler"},
      {"hang_timeout_s", T::kFloat, "1800",
       "dump every thread's stack when no step finishes for this long (0: off)"},
      {"abort_on_hang", T::kBool, "false", "end the job after a hang dump"},
      {"crash_at_step", T::kInt, "0",
       "fault injection: the run's first process aborts after this step (0: off)"},
  };
  for (ConfigKey& k : recsys::dlrm_config_schema()) keys.push_back(std::move(k));
  for (ConfigKey& k : diffusion::diffusion_config_schema()) keys.push_back(std::move(k));
  return keys;
}

namespace {

std::string resolve_preset(const std::string& arg) {
  if (fs::exists(arg)) return arg;
  for (const std::string& dir : {std::string("configs"), std::string(source_dir()) + "/configs"}) {
    const std::string p = dir + "/" + arg + ".yml";
    if (fs::exists(p)) return p;
  }
  fail(
      "config '{}': no such file, and no preset configs/{}.yml (presets: tiny, llama-25m, "
      "llama-110m, llama2-7b, llama2-70b, llama3-8b, mixtral-tiny, mixtral-8x7b, moe-e4, "
      "moe-e8, moe-e16, moe-e32)",
      arg, arg);
}

}  // namespace

Config load_train_config(const std::string& config_arg, const std::vector<std::string>& overrides) {
  Config c(train_config_schema());
  if (config_arg.empty() || config_arg == "tiny")
    c.load_yaml_string(kTinyPresetYaml, "tiny (embedded preset)");
  else
    c.load_yaml_file(resolve_preset(config_arg));
  for (const std::string& o : overrides) c.apply_override(o);
  return c;
}

bool is_model_shape_key(const std::string& key) {
  static const char* const kShape[] = {"vocab_size",
                                       "base_emb_dim",
                                       "base_num_decoder_layers",
                                       "base_num_query_heads",
                                       "base_num_kv_heads",
                                       "head_dim",
                                       "base_mlp_dim",
                                       "logits_via_embedding",
                                       "num_experts",
                                       "num_experts_per_tok",
                                       "base_moe_mlp_dim",
                                       "first_num_dense_layers",
                                       "interleave_moe_layer_step",
                                       "decoder_block",
                                       "model_type",
                                       "dlrm.dense_features",
                                       "dlrm.table_rows",
                                       "dlrm.embedding_dim",
                                       "dlrm.bottom_mlp",
                                       "dlrm.top_mlp",
                                       "dlrm.cross_layers",
                                       "dlrm.cross_rank",
                                       "dlrm.embedding_dtype",
                                       "dlrm.sparse_optimizer"};
  for (const char* k : kShape)
    if (key == k) return true;
  return false;
}

namespace {

std::string shape_change_error(const std::string& checkpoint, const std::string& key,
                               const std::string& saved, const std::string& now,
                               const std::string& source) {
  return fmt::format(
      "resume from {}: {} cannot change on resume (the checkpoint's model has {}, {} asks {}); "
      "start a new run (another run_name) to train another shape",
      checkpoint, key, saved, source, now);
}

}  // namespace

void check_resume_shape(const Config& config, const std::string& checkpoint_dir) {
  nlohmann::json saved;
  try {
    saved = nlohmann::json::parse(io::read_file(checkpoint_dir + "/trainer_state.json")).at("config");
  } catch (const std::exception&) {
    return;
  }
  if (!saved.is_object()) return;
  for (const auto& [key, value] : config.values()) {
    if (!is_model_shape_key(key) || !saved.contains(key) || !saved[key].is_string()) continue;
    const std::string before = saved[key].get<std::string>();
    if (before != value)
    {
      const std::string& source = config.source_of(key);
      usage_fail("{}", shape_change_error(checkpoint_dir, key, before, value,
                                          source == "command line" ? "the command line"
                                          : source == "default"    ? "the default"
                                                                   : source));
    }
  }
}

Config load_resumed_train_config(const std::string& resume,
                                 const std::vector<std::string>& overrides,
                                 std::vector<std::string>* changes) {
  const std::string dir = resolve_checkpoint_dir(resume);
  const std::string state_path = dir + "/trainer_state.json";
  nlohmann::json saved;
  try {
    saved = nlohmann::json::parse(io::read_file(state_path)).at("config");
  } catch (const nlohmann::json::exception& e) {
    fail("--resume {}: {} holds no saved config ({}); resume with the run's CONFIG instead", resume,
         state_path, e.what());
  }
  HYP_CHECK(saved.is_object(), "--resume {}: {}: 'config' must be an object", resume, state_path);
  Config c(train_config_schema());
  for (const auto& [key, value] : saved.items()) {
    HYP_CHECK(value.is_string(), "{}: config.{} must be a string", state_path, key);
    c.set(key, value.get<std::string>(), state_path);
  }
  for (const std::string& o : overrides) {
    const size_t eq = o.find('=');
    HYP_USAGE_CHECK(eq != std::string::npos && eq > 0, "command line: expected key=value, got '{}'",
                    o);
    const std::string key = o.substr(0, eq);
    Config probe = c;  // canonical form of the new value, checked against the schema
    probe.apply_override(o);
    const std::string before = c.values().at(key), after = probe.values().at(key);
    if (before == after) continue;
    HYP_USAGE_CHECK(!is_model_shape_key(key), "{}",
                    shape_change_error(dir, key, before, after, "the command line"));
    c.apply_override(o);
    if (changes != nullptr) changes->push_back(fmt::format("{}: {} -> {}", key, before, after));
  }
  return c;
}

TrainConfig parse_train_config(const Config& c, const std::string& name) {
  TrainConfig t;
  t.name = c.get_string("model_name").empty() ? name : c.get_string("model_name");
  auto where = [&](const char* key) { return std::string(key) + " (" + c.source_of(key) + ")"; };
  const std::string& model_type = c.get_string("model_type");
  HYP_CHECK(model_type == "decoder" || model_type == "dlrm" || model_type == "diffusion",
            "config key {} must be decoder, dlrm or diffusion, got '{}'", where("model_type"), model_type);
  t.dlrm_model = model_type == "dlrm";
  if (t.dlrm_model) t.dlrm = recsys::parse_dlrm_config(c);
  t.diffusion_model = model_type == "diffusion";
  if (t.diffusion_model) t.diffusion = diffusion::parse_diffusion_config(c);
  auto positive = [&](const char* key) {
    const int64_t v = c.get_int(key);
    HYP_CHECK(v > 0, "config key {} must be > 0, got {}", where(key), v);
    return v;
  };
  auto non_negative = [&](const char* key) {
    const int64_t v = c.get_int(key);
    HYP_CHECK(v >= 0, "config key {} must be >= 0, got {}", where(key), v);
    return v;
  };
  // Keys that size buffers are bounded far past any real run, so a typo (1e12) is named
  // here rather than overflowing the memory plan or failing inside malloc.
  auto positive_at_most = [&](const char* key, int64_t hi) {
    const int64_t v = positive(key);
    HYP_CHECK(v <= hi, "config key {} = {} is out of range (at most {})", where(key), v, hi);
    return v;
  };
  DecoderConfig& m = t.model;
  const FamilyInfo* family = find_family(c.get_string("decoder_block"));
  HYP_CHECK(family != nullptr, "config key {} = '{}' is not a known decoder (known: {})",
            where("decoder_block"), c.get_string("decoder_block"), family_names());
  m.arch = family->defaults;
  m.vocab_size = positive("vocab_size");
  m.dim = positive("base_emb_dim");
  m.n_layers = positive("base_num_decoder_layers");
  m.n_heads = positive("base_num_query_heads");
  m.n_kv_heads = positive("base_num_kv_heads");
  m.head_dim = c.get_int("head_dim") > 0 ? c.get_int("head_dim") : m.dim / m.n_heads;
  m.ffn_dim = positive("base_mlp_dim");
  m.norm_eps = c.get_float("normalization_layer_epsilon");
  m.rope_theta = c.get_float("rope_max_timescale");
  {
    std::string type = c.get_string("rope_type");
    if (type == "llama3.1") type = "llama3";  // MaxText's spelling
    RopeScaling& r = m.rope_scaling;
    HYP_CHECK(parse_rope_type(type, &r.type),
              "config key {} = '{}' is not a RoPE type (default, linear, llama3, yarn)",
              where("rope_type"), c.get_string("rope_type"));
    r.factor = c.get_float("rope_factor");
    r.low_freq_factor = c.get_float("rope_low_freq_factor");
    r.high_freq_factor = c.get_float("rope_high_freq_factor");
    r.original_max_positions = non_negative("original_max_position_embeddings");
    r.beta_fast = c.get_float("beta_fast");
    r.beta_slow = c.get_float("beta_slow");
    r.attention_factor = c.get_float("rope_attention_factor");
    if (r.type != RopeScaling::Type::kNone) {
      try {
        (void)rope_inv_freq(2, 10000.0, r);
      } catch (const Error& e) {
        fail("config key {}: {}", where("rope_type"), e.what());
      }
    }
  }
  if (c.get_bool("attention_bias")) {
    HYP_CHECK(m.arch.family != DecoderFamily::kQwen2,
              "config key {}: qwen2 always has q/k/v biases and never an o_proj bias",
              where("attention_bias"));
    m.arch.qkv_bias = m.arch.o_bias = true;
  }
  // -1: keep the family's value (m.arch starts as its defaults).
  auto family_int = [&](const char* key, int64_t* field) {
    const int64_t v = c.get_int(key);
    HYP_CHECK(v >= -1, "config key {} must be >= 0 (or -1: the family's), got {}", where(key), v);
    if (v >= 0) *field = v;
  };
  auto family_float = [&](const char* key, double* field) {
    const double v = c.get_float(key);
    HYP_CHECK(v == -1.0 || (std::isfinite(v) && v >= 0.0),
              "config key {} must be >= 0 (or -1: the family's), got {}", where(key), v);
    if (v >= 0) *field = v;
  };
  family_int("sliding_window_size", &m.arch.sliding_window);
  family_int("sliding_window_pattern", &m.arch.sliding_window_pattern);
  family_float("attn_logits_soft_cap", &m.arch.attn_logit_softcap);
  family_float("final_logits_soft_cap", &m.arch.final_logit_softcap);
  family_float("query_pre_attn_scalar", &m.arch.query_pre_attn_scalar);
  family_float("local_rope_max_timescale", &m.arch.local_rope_theta);
  // Gemma's head is always the embedding (GemmaForCausalLM ties it).
  m.tie_embeddings = c.get_bool("logits_via_embedding") || family->tied_head;
  // The model's bound (max_position_embeddings), checked here so the error names the key
  // that was set.
  t.max_target_length = positive_at_most("max_target_length", int64_t{1} << 24);
  m.max_seq_len = c.get_int("max_position_embeddings") > 0 ? c.get_int("max_position_embeddings")
                                                           : t.max_target_length;
  HYP_CHECK(m.max_seq_len >= t.max_target_length,
            "config key {} ({}) is below max_target_length ({})", where("max_position_embeddings"),
            m.max_seq_len, t.max_target_length);
  m.n_experts = non_negative("num_experts");
  if (m.n_experts > 0) {
    m.n_experts_per_tok = positive("num_experts_per_tok");
    HYP_CHECK(m.n_experts_per_tok <= m.n_experts,
              "config key {} ({}) must not exceed num_experts ({})", where("num_experts_per_tok"),
              m.n_experts_per_tok, m.n_experts);
    m.moe_ffn_dim = non_negative("base_moe_mlp_dim");
    m.first_dense_layers = non_negative("first_num_dense_layers");
    HYP_CHECK(m.first_dense_layers < m.n_layers,
              "config key {} ({}) leaves no MoE layer among {} layers",
              where("first_num_dense_layers"), m.first_dense_layers, m.n_layers);
    m.moe_layer_step = positive("interleave_moe_layer_step");
    m.norm_topk_prob = c.get_bool("norm_topk_prob");
    MoeOptions& o = t.moe;
    o.capacity_factor = c.get_float("capacity_factor");
    HYP_CHECK(o.capacity_factor > 0 || o.capacity_factor == -1.0,
              "config key {} must be > 0 (capped) or -1 (dropless), got {}",
              where("capacity_factor"), o.capacity_factor);
    HYP_CHECK(o.capacity_factor > 0 || c.get_bool("sparse_matmul"),
              "config key {}: dropless experts (capacity_factor=-1) need sparse_matmul=true; "
              "set a capacity_factor > 0 for capped experts",
              where("sparse_matmul"));
    o.load_balance_weight = static_cast<float>(c.get_float("load_balance_loss_weight"));
    o.z_loss_weight = static_cast<float>(c.get_float("router_z_loss_weight"));
    HYP_CHECK(o.load_balance_weight >= 0, "config key {} must be >= 0",
              where("load_balance_loss_weight"));
    HYP_CHECK(o.z_loss_weight >= 0, "config key {} must be >= 0", where("router_z_loss_weight"));
    m.router_aux_loss_coef = o.load_balance_weight;
  }
  m.validate("config", ConfigKeyNames::kTraining);

  t.dataset_path = c.get_string("dataset_path");
  t.tokenizer_path = c.get_string("tokenizer_path");
  t.load_parameters_path = c.get_string("load_parameters_path");
  if (!t.load_parameters_path.empty()) {
    // The shape is the checkpoint's. A model key given on the command line beside it would
    // be silently overridden (or disagree with the weights), so it is refused by name; a
    // preset's or YAML file's model keys are replaced (and said so).
    static const char* const kModelKeys[] = {
        "decoder_block", "vocab_size", "base_emb_dim", "base_num_decoder_layers",
        "base_num_query_heads", "base_num_kv_heads", "head_dim", "base_mlp_dim",
        "normalization_layer_epsilon", "rope_max_timescale", "logits_via_embedding",
        "max_position_embeddings", "rope_type", "rope_factor", "rope_low_freq_factor",
        "rope_high_freq_factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
        "rope_attention_factor", "attention_bias", "sliding_window_size", "sliding_window_pattern",
        "num_experts", "num_experts_per_tok",
        "base_moe_mlp_dim", "first_num_dense_layers", "interleave_moe_layer_step",
        "norm_topk_prob"};
    std::vector<std::string> replaced;
    for (const char* key : kModelKeys) {
      HYP_USAGE_CHECK(c.source_of(key) != "command line",
                      "config key {}: with load_parameters_path the model's shape comes from "
                      "{}'s config.json; remove the key",
                      where(key), t.load_parameters_path);
      if (c.source_of(key) != "default") replaced.push_back(key);
    }
    if (!replaced.empty())
      log_info("load_parameters_path: the model's shape is {}'s config.json; the config's {} "
               "are not used",
               t.load_parameters_path, fmt::join(replaced, ", "));
    const std::string dir = resolve_checkpoint_dir(t.load_parameters_path);
    m = read_checkpoint_config(dir);
    t.load_parameters_path = dir;
    HYP_CHECK(m.max_seq_len >= t.max_target_length,
              "config key {} ({}) exceeds the max_position_embeddings ({}) of {}/config.json",
              where("max_target_length"), t.max_target_length, m.max_seq_len, dir);
    if (t.tokenizer_path.empty() && !text::tokenizer_file_in(dir).empty()) t.tokenizer_path = dir;
  }
  t.per_device_batch_size = positive_at_most("per_device_batch_size", 65536);
  t.gradient_accumulation_steps = positive_at_most("gradient_accumulation_steps", 1 << 20);
  t.data_shuffle_seed = static_cast<uint64_t>(c.get_int("data_shuffle_seed"));
  t.eval_fraction = c.get_float("eval_fraction");
  HYP_CHECK(t.eval_fraction > 0 && t.eval_fraction < 1, "config key {} must be in (0, 1), got {}",
            where("eval_fraction"), t.eval_fraction);
  t.use_sft = c.get_bool("use_sft");
  t.sft_completion_only = c.get_bool("sft_train_on_completion_only");
  t.packing = c.get_bool("packing");
  t.use_dpo = c.get_bool("use_dpo");
  t.dpo_beta = c.get_float("dpo_beta");
  t.dpo_label_smoothing = c.get_float("dpo_label_smoothing");
  if (t.use_dpo) {
    HYP_USAGE_CHECK(!t.use_sft, "config key {}: use_sft and use_dpo are two runs; set one", where("use_dpo"));
    HYP_USAGE_CHECK(!t.dataset_path.empty(),
                    "config key {}: use_dpo needs dataset_path, a JSONL file of prompt, chosen and rejected",
                    where("use_dpo"));
    HYP_USAGE_CHECK(!t.tokenizer_path.empty(),
                    "config key {}: use_dpo needs a tokenizer with a chat template (tokenizer_path, or "
                    "load_parameters_path's)",
                    where("use_dpo"));
    HYP_USAGE_CHECK(!t.packing, "config key {}: use_dpo runs unpacked rows; remove packing", where("packing"));
    HYP_USAGE_CHECK(std::isfinite(t.dpo_beta) && t.dpo_beta > 0, "config key {} must be > 0, got {}",
                    where("dpo_beta"), t.dpo_beta);
    HYP_USAGE_CHECK(t.dpo_label_smoothing >= 0 && t.dpo_label_smoothing < 0.5,
                    "config key {} must be in [0, 0.5), got {}", where("dpo_label_smoothing"), t.dpo_label_smoothing);
  } else {
    // Refused when they would change something (a resumed run's saved config repeats
    // every key at its value, defaults included).
    HYP_USAGE_CHECK(t.dpo_beta == 0.1, "config key {} applies with use_dpo=true", where("dpo_beta"));
    HYP_USAGE_CHECK(t.dpo_label_smoothing == 0.0, "config key {} applies with use_dpo=true",
                    where("dpo_label_smoothing"));
  }
  t.lora.rank = c.get_int("lora_rank");
  t.lora.alpha = c.get_float("lora_alpha");
  t.lora.dropout = c.get_float("lora_dropout");
  const std::string lora_targets = c.get_string("lora_target_modules");
  HYP_USAGE_CHECK(t.lora.rank >= 0, "config key {} must be >= 0 (0: no adapters), got {}", where("lora_rank"),
                  t.lora.rank);
  if (t.lora.rank > 0) {
    HYP_USAGE_CHECK(t.lora.alpha > 0 && std::isfinite(t.lora.alpha), "config key {} must be > 0, got {}",
                    where("lora_alpha"), t.lora.alpha);
    HYP_USAGE_CHECK(t.lora.dropout >= 0.0 && t.lora.dropout < 1.0, "config key {} must be in [0, 1), got {}",
                    where("lora_dropout"), t.lora.dropout);
    t.lora.targets = parse_lora_targets(lora_targets, "config key " + where("lora_target_modules"));
  } else {
    HYP_USAGE_CHECK(t.lora.alpha == 16.0, "config key {} applies with lora_rank >= 1", where("lora_alpha"));
    HYP_USAGE_CHECK(t.lora.dropout == 0.0, "config key {} applies with lora_rank >= 1", where("lora_dropout"));
    HYP_USAGE_CHECK(lora_targets == "all-linear", "config key {} applies with lora_rank >= 1",
                    where("lora_target_modules"));
  }
  if (t.use_sft) {
    HYP_USAGE_CHECK(!t.dataset_path.empty(),
                    "config key {}: use_sft needs dataset_path, a JSONL file of conversations", where("use_sft"));
    HYP_USAGE_CHECK(!t.tokenizer_path.empty(),
                    "config key {}: use_sft needs a tokenizer with a chat template (tokenizer_path, or "
                    "load_parameters_path's)",
                    where("use_sft"));
  } else if (!t.use_dpo) {
    HYP_USAGE_CHECK(t.sft_completion_only, "config key {} applies with use_sft=true",
                    where("sft_train_on_completion_only"));
    HYP_USAGE_CHECK(!t.packing, "config key {} applies with use_sft=true", where("packing"));
  }

  t.steps = positive("steps");
  LrSchedule& s = t.schedule;
  s.kind = parse_schedule(c.get_string("lr_schedule"), where("lr_schedule"));
  s.peak_lr = c.get_float("learning_rate");
  s.total_steps = t.steps;
  const double wf = c.get_float("warmup_steps_fraction");
  HYP_CHECK(wf >= 0 && wf <= 1, "config key {} must be in [0, 1], got {}",
            where("warmup_steps_fraction"), wf);
  s.warmup_steps = std::llround(wf * double(t.steps));
  s.final_lr_fraction = c.get_float("cosine_learning_rate_final_fraction");
  s.wsd_decay_fraction = c.get_float("wsd_decay_steps_fraction");
  s.wsd_decay_shape = c.get_string("wsd_decay_style");
  try {
    s.validate();
  } catch (const Error& e) {
    fail("config: learning-rate schedule: {}", e.what());
  }
  t.adam_b1 = c.get_float("adam_b1");
  t.adam_b2 = c.get_float("adam_b2");
  t.adam_eps = c.get_float("adam_eps");
  t.weight_decay = c.get_float("adam_weight_decay");
  HYP_CHECK(t.adam_b1 >= 0 && t.adam_b1 < 1, "config key {} must be in [0, 1)", where("adam_b1"));
  HYP_CHECK(t.adam_b2 >= 0 && t.adam_b2 < 1, "config key {} must be in [0, 1)", where("adam_b2"));
  HYP_CHECK(t.adam_eps > 0, "config key {} must be > 0", where("adam_eps"));
  HYP_CHECK(t.weight_decay >= 0, "config key {} must be >= 0", where("adam_weight_decay"));
  t.weight_decay_exclude_norms_and_embeddings =
      c.get_bool("weight_decay_exclude_norms_and_embeddings");
  t.gradient_clipping_threshold = c.get_float("gradient_clipping_threshold");
  HYP_CHECK(t.gradient_clipping_threshold >= 0, "config key {} must be >= 0",
            where("gradient_clipping_threshold"));
  t.init_weights_seed = static_cast<uint64_t>(c.get_int("init_weights_seed"));

  t.hardware =
      parse_hardware(c.get_string("hardware"), fmt::format("config key {}", where("hardware")));
  const std::string& dtype = c.get_string("dtype");
  HYP_CHECK(dtype == "bfloat16" || dtype == "float32",
            "config key {} must be bfloat16 or float32, got '{}'", where("dtype"), dtype);
  t.bf16 = dtype == "bfloat16";
  HYP_CHECK(c.get_string("weight_dtype") == "float32",
            "config key {} must be float32 (master weights and optimizer state are f32), got '{}'",
            where("weight_dtype"), c.get_string("weight_dtype"));
  t.remat = parse_remat_policy(c.get_string("remat_policy"),
                               fmt::format("config key {}", where("remat_policy")));
  t.quant.mode = parse_quant_mode(c.get_string("quantization"),
                                  fmt::format("config key {}", where("quantization")));
  t.quant.quantize_logits = c.get_bool("quantize_logits");
  t.quant.amax_history_len = positive("fp8_amax_history_len");
  t.quant.amax_margin = static_cast<float>(c.get_float("fp8_amax_margin"));
  t.quant.seed = t.init_weights_seed;
  HYP_CHECK(!t.quant.enabled() || t.bf16, "config key {} = {} needs {} bfloat16, got float32",
            where("quantization"), quant_mode_name(t.quant.mode), where("dtype"));
  HYP_CHECK(!t.quant.enabled() || t.model.n_moe_layers() == 0,
            "config key {} = {}: the MoE experts' grouped GEMMs are not quantised yet (dense "
            "models only)",
            where("quantization"), quant_mode_name(t.quant.mode));

  t.base_output_directory = c.get_string("base_output_directory");
  t.run_name = c.get_string("run_name");
  HYP_CHECK(t.run_name.find('/') == std::string::npos && t.run_name != "." && t.run_name != "..",
            "config key {} must be a plain directory name, got '{}'", where("run_name"),
            t.run_name);
  t.enable_checkpointing = c.get_bool("enable_checkpointing");
  t.checkpoint_period = non_negative("checkpoint_period");
  t.checkpoints_to_keep = positive("max_num_checkpoints_to_keep");
  t.checkpoint_max_shard_bytes = non_negative("checkpoint_max_shard_bytes");
  t.async_checkpointing = c.get_bool("async_checkpointing");
  t.log_period = positive("log_period");
  t.eval_interval = non_negative("eval_interval");
  t.eval_batches = non_negative("eval_batches");
  t.peak_tflops = c.get_float("peak_tflops");
  HYP_CHECK(t.peak_tflops >= 0, "config key {} must be >= 0", where("peak_tflops"));
  t.sample_count = non_negative("sample_count");
  t.sample_max_tokens = non_negative("sample_max_tokens");
  t.sample_temperature = c.get_float("sample_temperature");
  HYP_CHECK(t.sample_temperature >= 0, "config key {} must be >= 0", where("sample_temperature"));
  for (const char* key : {"data_parallelism", "fsdp_parallelism", "expert_parallelism"}) {
    const int64_t v = c.get_int(key);
    HYP_CHECK(v == -1 || v >= 1, "config key {} must be -1 (fill) or >= 1, got {}", where(key), v);
  }
  t.mesh.data = static_cast<int>(c.get_int("data_parallelism"));
  t.mesh.fsdp = static_cast<int>(c.get_int("fsdp_parallelism"));
  t.mesh.expert = static_cast<int>(c.get_int("expert_parallelism"));
  t.shard_optimizer_over_data = c.get_bool("shard_optimizer_over_data");
  t.communicator = c.get_string("communicator");
  HYP_CHECK(t.communicator == "auto" || t.communicator == "single" || t.communicator == "mpi",
            "config key {} must be auto, single or mpi, got '{}'", where("communicator"),
            t.communicator);
  t.collective_timeout_s = c.get_float("collective_timeout_s");
  HYP_CHECK(t.collective_timeout_s > 0, "config key {} must be > 0", where("collective_timeout_s"));
  t.overlap_communication = c.get_bool("overlap_communication");
  t.check_links = c.get_bool("check_links");
  t.check_links_period = non_negative("check_links_period");
  t.monitor.enabled = c.get_bool("enable_monitoring");
  const int64_t metrics_port = c.get_int("metrics_port");
  HYP_CHECK(metrics_port >= 0 && metrics_port <= 65535,
            "config key {} must be a port in [0, 65535] (0: off), got {}", where("metrics_port"),
            metrics_port);
  t.monitor.metrics_port = static_cast<int>(metrics_port);
  t.monitor.metrics_host = c.get_string("metrics_host");
  HYP_CHECK(!t.monitor.metrics_host.empty(), "config key {} must not be empty",
            where("metrics_host"));
  t.monitor.top_n = static_cast<int>(std::min<int64_t>(positive("monitor_top_n"), 1 << 20));
  t.monitor.straggler_periods =
      static_cast<int>(std::min<int64_t>(positive("straggler_periods"), 1 << 20));
  t.monitor.hang_timeout_s = c.get_float("hang_timeout_s");
  HYP_CHECK(t.monitor.hang_timeout_s >= 0 && std::isfinite(t.monitor.hang_timeout_s),
            "config key {} must be >= 0 (0: off)", where("hang_timeout_s"));
  t.monitor.abort_on_hang = c.get_bool("abort_on_hang");
  t.monitor.crash_at_step = non_negative("crash_at_step");
  return t;
}

MeshConfig resolve_mesh(const MeshConfig& m, int world) {
  MeshConfig r = m;
  int* axes[] = {&r.data, &r.fsdp, &r.expert};
  int fills = 0, product = 1;
  for (int* a : axes) {
    if (*a == -1)
      ++fills;
    else
      product *= *a;
  }
  const std::string desc =
      fmt::format("data_parallelism={} x fsdp_parallelism={} x expert_parallelism={}", m.data,
                  m.fsdp, m.expert);
  HYP_CHECK(fills <= 1, "mesh {}: at most one axis may be -1", desc);
  if (fills == 1) {
    HYP_CHECK(world % product == 0, "mesh {}: the fixed axes ({}) do not divide the {} ranks", desc,
              product, world);
    for (int* a : axes)
      if (*a == -1) *a = world / product;
  } else {
    HYP_CHECK(product == world, "mesh {} = {} ranks, but this job has {} ranks", desc, product,
              world);
  }
  int multi = 0;
  for (int* a : axes) multi += *a > 1 ? 1 : 0;
  HYP_CHECK(multi <= 1,
            "mesh data={} fsdp={} expert={}: combining parallel axes is not supported; use one "
            "of data_parallelism, fsdp_parallelism, expert_parallelism = {} and 1 for the others",
            r.data, r.fsdp, r.expert, world);
  return r;
}

}  // namespace hyperion
