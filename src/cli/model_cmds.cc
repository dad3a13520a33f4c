// `hyperion eval`, `hyperion generate` and `hyperion convert` on a checkpoint directory.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/utf8.h"
#include "cli/commands.h"
#include "cli/diffusion_cmd.h"
#include "cli/flags.h"
#include "cli/grammar_constraint.h"
#include "cli/loaded_checkpoint.h"
#include "convert/gguf_convert.h"
#include "convert/gguf_model.h"
#include "convert/peft_adapter.h"
#include "diffusion/pipeline.h"
#include "diffusion/single_file.h"
#include "io/atomic_file.h"
#include "io/file_identity.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "kernels/backend.h"
#include "kernels/block_quant.h"
#include "kernels/hardware.h"
#include "model/generator.h"
#include "model/lora.h"
#include "model/sampler.h"
#include "serve/text_stream.h"
#include "text/gguf_tokenizer.h"
#include "text/tokenizer.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"

namespace hyperion::cli {

namespace {

// A llama.cpp GGUF file (convert/gguf_model.h): its quantised matrices stay in their
// blocks, read in place from the mapped file; the tokenizer is the file's vocabulary.
LoadedCheckpoint load_gguf_checkpoint(const std::string& path, bool bf16,
                                      const std::function<void(const DecoderConfig&)>& before_load,
                                      Device device, const std::string& adapter) {
  HYP_USAGE_CHECK(adapter.empty(),
                  "{}: --adapter {}: LoRA adapters merge into safetensors checkpoints; a GGUF "
                  "model's quantised weights cannot take one",
                  path, adapter);
  // A file that is not a readable GGUF (truncated, a type not read, offsets past its end)
  // is bad input: exit status 2, as a bad config.json is.
  std::shared_ptr<const io::GgufFile> file;
  try {
    file = std::make_shared<const io::GgufFile>(io::GgufFile::open(path));
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw_usage_error(e.what());
  }
  DecoderConfig config = convert::decoder_config_from_gguf(*file);
  const bool quantised = std::any_of(file->tensors().begin(), file->tensors().end(), [](const io::GgufTensor& t) {
    return block_format_of_ggml(static_cast<uint32_t>(t.type)) != nullptr;
  });
  HYP_USAGE_CHECK(!quantised || device == Device::kHost,
                  "{}: quantised GGUF weights ({}) run on the CPU; use hardware=cpu or an "
                  "f16/bf16/f32 GGUF",
                  path, convert::gguf_type_summary(*file));
  if (before_load) before_load(config);
  LoadedCheckpoint c{path, "", config, nullptr, text::tokenizer_from_gguf(*file)};
  HYP_USAGE_CHECK(c.tokenizer.fits_model_vocab(config.vocab_size),
                  "{}: the vocabulary has {} tokens but token_embd.weight has {} rows", path,
                  c.tokenizer.vocab_size(), config.vocab_size);
  c.params = std::make_unique<ParamStore>(c.config, bf16, /*gradients=*/false,
                                          backend_for(device).allocator());
  convert::load_gguf_weights(file, *c.params);
  return c;
}

}  // namespace

LoadedCheckpoint load_checkpoint(const std::string& path, bool bf16,
                                 const std::function<void(const DecoderConfig&)>& before_load,
                                 Device device, std::string adapter) {
  if (convert::is_gguf_file(path)) return load_gguf_checkpoint(path, bf16, before_load, device, adapter);
  std::string dir = resolve_checkpoint_dir(path);
  std::string tokenizer_dir = dir;
  if (convert::is_peft_adapter_dir(dir) && !has_full_model_weights(dir)) {
    // A LoRA run's checkpoint: its base, named in adapter_config.json.
    HYP_USAGE_CHECK(adapter.empty(), "{} is a LoRA adapter; give its base model as the checkpoint with --adapter {}",
                    dir, adapter);
    adapter = dir;
    dir = convert::peft_base_model(adapter);
    HYP_USAGE_CHECK(std::filesystem::is_directory(dir),
                    "{} is a LoRA adapter whose base_model_name_or_path ({}) is not a directory here; give the base "
                    "model as the checkpoint and the adapter with --adapter {}",
                    adapter, dir, adapter);
    dir = resolve_checkpoint_dir(dir);
    if (text::tokenizer_file_in(adapter).empty()) tokenizer_dir = dir;
    else tokenizer_dir = adapter;
  }
  DecoderConfig config = read_checkpoint_config(dir);
  // Everything that can be checked is, before the weights are allocated.
  check_weights_match_config(dir, config);
  check_load_fits_in_memory(dir, config, bf16);
  if (!adapter.empty()) {
    const LoraConfig lc = convert::read_peft_config(adapter);
    lora_layout(config, lc);  // a rank the model cannot have is refused here
  }
  if (before_load) before_load(config);
  LoadedCheckpoint c{dir, adapter, config, nullptr, load_checkpoint_tokenizer(tokenizer_dir, config)};
  c.params = std::make_unique<ParamStore>(c.config, bf16, /*gradients=*/false,
                                         backend_for(device).allocator());
  load_model_weights(c.dir, *c.params);
  if (!adapter.empty()) {
    const std::unique_ptr<LoraAdapter> a = convert::load_peft_adapter(adapter, *c.params);
    merge_lora(*a, *c.params);
  }
  return c;
}

namespace {

bool parse_dtype_flag(const Flags& f) {
  const std::string d = f.get("dtype", "float32");
  HYP_USAGE_CHECK(d == "float32" || d == "bfloat16",
                  "{}: --dtype must be float32 or bfloat16, got '{}'", f.spec().name, d);
  return d == "bfloat16";
}

const FlagSpec kCheckpointFlag = {"checkpoint", "DIR",
                                  "checkpoint directory, or a training run directory (its latest "
                                  "checkpoint)"};
const FlagSpec kDtypeFlag = {"dtype", "T", "float32 (default) or bfloat16 compute"};
const FlagSpec kAdapterFlag = {"adapter", "DIR",
                               "a PEFT LoRA adapter directory (adapter_config.json, adapter_model.safetensors) "
                               "merged into the checkpoint's weights"};

}  // namespace

const CommandSpec kEvalSpec = {
    "eval",
    "",
    "held-out loss and perplexity of a checkpoint",
    {kCheckpointFlag,
     {"text", "FILE", "text file to score (tokenized with the checkpoint's tokenizer)"},
     {"shard", "FILE", "token shard to score (.bin from `hyperion data prepare`)"},
     {"seq-len", "N", "window length (default: min(context, 1024))"},
     {"batch", "N", "windows per forward pass (default 4)"},
     {"ppl-chunk", "N",
      "perplexity as llama.cpp's llama-perplexity -c N computes it: the whole --text file "
      "tokenized as one string (BOS first), cut into chunks of N tokens each starting with BOS, "
      "the second half of each chunk scored"},
     kAdapterFlag,
     kDtypeFlag,
     {"json", "", "print the result as one JSON object"}},
    "Give exactly one of --text or --shard.",
    "eval --checkpoint runs/tiny --text data/corpus/fortunes.txt --json"};

const CommandSpec kGenerateSpec = {
    "generate",
    "",
    "sample a continuation from a checkpoint with a KV cache",
    {kCheckpointFlag,
     {"prompt", "TEXT", "prompt text (default: empty, after BOS)"},
     {"max-tokens", "N", "tokens to generate at most (default 64)"},
     {"temperature", "T", "sampling temperature; 0 is greedy (default 0.8)"},
     {"top-k", "K", "sample from the K most likely tokens (default 0: all)"},
     {"top-p", "P", "nucleus sampling mass (default 1)"},
     {"seed", "S", "random seed (default 0)"},
     {"ignore-eos", "", "keep going past the end-of-sequence token"},
     {"json-schema", "FILE", "structured output: the text is JSON valid against this JSON schema (docs/SERVING.md lists the supported keywords)"},
     {"grammar", "FILE", "structured output: the text follows this GBNF grammar (docs/SERVING.md)"},
     kAdapterFlag,
     kDtypeFlag,
     {"hardware", "H", "cpu (default) or gpu: where the model (and a language model's KV cache) lives"},
     {"json", "", "print the result as one JSON object"},
     {"output", "FILE.png", "diffusion: where the image goes (FILE-N.png for N > 0 with --batch)"},
     {"negative-prompt", "TEXT", "diffusion: what to steer away from (default: empty)"},
     {"width", "W", "diffusion: image width (default: the model's)"},
     {"height", "H", "diffusion: image height (default: the model's)"},
     {"steps", "N", "diffusion: denoising steps (default 30)"},
     {"guidance", "G", "diffusion: classifier-free guidance scale (default 7.5; <= 1: off)"},
     {"scheduler", "S", "diffusion: ddim, euler, euler_a or dpm++2m (default: the model's scheduler class, else dpm++2m)"},
     {"karras", "", "diffusion: Karras sigmas (euler, euler_a, dpm++2m)"},
     {"batch", "N", "diffusion: images of the prompt (default 1)"},
     {"config", "DIR", "diffusion, with a single-file checkpoint (--checkpoint FILE.safetensors in the original SD 1.x layout): the diffusers directory of the same model whose configs and tokenizer it uses"}},
    "A checkpoint directory holding model_index.json is a diffusers text-to-image model (Stable "
    "Diffusion 1.x/2.x, SDXL, or one `hyperion train sd-tiny` wrote): --prompt is the image's "
    "description and the image is written to --output; the language-model flags do not apply, "
    "and the diffusion flags apply to nothing else.",
    "generate --checkpoint runs/tiny --prompt \"Once upon a time\" --top-p 0.9 --seed 1"};

const CommandSpec kConvertSpec = {
    "convert",
    "",
    "convert a checkpoint to GGUF (llama.cpp) or to one Hugging Face safetensors file",
    {kCheckpointFlag,
     {"to", "FORMAT", "gguf or safetensors"},
     {"type", "T", "GGUF tensor type: f32, f16 (default), bf16 or q8_0"},
     {"quant", "Q",
      "GGUF quantisation as llama-quantize's: q8_0, q4_0, q4_k_m, q5_k_m or q6_k (each tensor's "
      "type chosen by llama.cpp's rules: output and some attn_v/ffn_down layers q6_K, norms "
      "f32); instead of --type"},
     {"merge-lora", "DIR",
      "safetensors: a PEFT LoRA adapter directory folded into the weights (W + s B A): the output is the "
      "merged model, a Hugging Face directory"},
     {"output", "PATH",
      "output file (gguf; default: beside the checkpoint directory, DIR-TYPE.gguf) or "
      "directory (safetensors; required)"}},
    "A sharded (multi-process) checkpoint converts to safetensors first; that output then "
    "converts to gguf. An output that is one of the checkpoint's own files, or the "
    "checkpoint directory itself, is refused.",
    "convert --checkpoint runs/tiny --to gguf --type q8_0\n"
    "  hyperion convert --checkpoint runs/tiny --to gguf --quant q4_k_m\n"
    "  hyperion convert --checkpoint BASE --merge-lora runs/lora --to safetensors --output merged"};

int cmd_eval(const Args& args) {
  const Flags f(kEvalSpec, args);
  HYP_USAGE_CHECK(f.positional().empty(), "eval: unexpected argument '{}'", f.positional()[0]);
  HYP_USAGE_CHECK(f.has("text") != f.has("shard"),
                  "eval: give exactly one of --text FILE or --shard FILE");
  const int64_t batch = f.integer("batch", 4);
  const int64_t seq_flag = f.integer("seq-len", 0);  // checked before the (slow) load
  HYP_USAGE_CHECK(batch >= 1, "eval: --batch must be >= 1, got {}", batch);
  LoadedCheckpoint c = load_checkpoint(f.require("checkpoint"), parse_dtype_flag(f), nullptr, Device::kHost,
                                       f.get("adapter"));
  const int64_t seq = f.has("seq-len") ? seq_flag : std::min<int64_t>(c.config.max_seq_len, 1024);
  HYP_USAGE_CHECK(seq > 0 && seq <= c.config.max_seq_len,
                  "eval: --seq-len must be in [1, {}], got {}", c.config.max_seq_len, seq);
  const int64_t ppl_chunk = f.integer("ppl-chunk", 0);
  HYP_USAGE_CHECK(!f.has("ppl-chunk") || (f.has("text") && ppl_chunk >= 4 && ppl_chunk <= c.config.max_seq_len),
                  "eval: --ppl-chunk needs --text and a chunk in [4, {}], got {}", c.config.max_seq_len,
                  ppl_chunk);
  EvalReport r;
  if (ppl_chunk > 0) {
    r = evaluate_llama_perplexity(*c.params, c.tokenizer, io::read_file(f.get("text")), ppl_chunk);
  } else {
    const std::vector<int32_t> tokens = f.has("text")
                                            ? tokenize_file(c.tokenizer, f.get("text"))
                                            : read_shard_tokens(f.get("shard"), c.config.vocab_size);
    r = evaluate_stream(*c.params, tokens, seq, batch);
  }
  if (f.has("json")) {
    nlohmann::ordered_json j;
    j["loss"] = r.loss;
    j["perplexity"] = r.perplexity;
    j["tokens"] = r.tokens;
    j["checkpoint"] = c.dir;
    if (!c.adapter.empty()) j["adapter"] = c.adapter;
    j["seq_len"] = ppl_chunk > 0 ? ppl_chunk : seq;
    if (ppl_chunk > 0) j["protocol"] = "llama-perplexity";
    j["seconds"] = r.seconds;
    print_json(j, 2);
  } else {
    std::printf("checkpoint %s\nloss %.4f  perplexity %.3f  tokens %lld  (%.2f s)\n", c.dir.c_str(),
                r.loss, r.perplexity, static_cast<long long>(r.tokens), r.seconds);
  }
  return 0;
}

int cmd_generate(const Args& args) {
  const Flags f(kGenerateSpec, args);
  HYP_USAGE_CHECK(f.positional().empty(), "generate: unexpected argument '{}'", f.positional()[0]);
  if (diffusion::DiffusionPipeline::is_pipeline_dir(f.require("checkpoint")) ||
      diffusion::is_single_file_checkpoint(f.require("checkpoint")))
    return generate_image(f);
  HYP_USAGE_CHECK(!f.has("adapter") || !diffusion::DiffusionPipeline::is_pipeline_dir(f.require("checkpoint")),
                  "generate: --adapter applies to language models");
  for (const char* flag : {"output", "negative-prompt", "width", "height", "steps", "guidance", "scheduler",
                           "karras", "batch", "config"})
    HYP_USAGE_CHECK(!f.has(flag), "generate: --{} applies to diffusion models (a directory with model_index.json)",
                    flag);
  // Every flag is checked before the (slow) checkpoint load, with the ranges and meanings
  // the server gives the same knobs (model/sampler.h: top_k -1 or 0 is off).
  GenerateOptions go;
  const double temperature = f.number("temperature", 0.8);
  const int64_t top_k = f.integer("top-k", 0);
  const double top_p = f.number("top-p", 1.0);
  const int64_t seed = f.integer("seed", 0);
  const std::pair<const char*, std::string> checks[] = {
      {"temperature", temperature_error(temperature)},
      {"top-k", top_k_error(top_k)},
      {"top-p", top_p_error(top_p)}};
  for (const auto& [flag, error] : checks)
    HYP_USAGE_CHECK(error.empty(), "generate: --{} {}", flag, error);
  HYP_USAGE_CHECK(seed >= 0, "generate: --seed must be >= 0, got {}", seed);
  go.sampling.temperature = static_cast<float>(temperature);
  go.sampling.top_k = top_k_param(top_k);
  go.sampling.top_p = static_cast<float>(top_p);
  go.sampling.seed = static_cast<uint64_t>(seed);
  go.max_tokens = f.integer("max-tokens", 64);
  HYP_USAGE_CHECK(go.max_tokens >= 0, "generate: --max-tokens must be >= 0, got {}", go.max_tokens);
  go.stop_at_eos = !f.has("ignore-eos");
  const std::string prompt = f.get("prompt");
  if (const size_t bad = utf8_invalid_at(prompt); bad != std::string::npos)
    usage_fail("generate: --prompt is not valid UTF-8 (byte {} of {})", bad, prompt.size());
  HYP_USAGE_CHECK(!(f.has("json-schema") && f.has("grammar")), "generate: give --json-schema or --grammar, not both");
  std::string gbnf;  // structured output, read and checked before the model loads
  for (const char* flag : {"json-schema", "grammar"})
    if (f.has(flag)) gbnf = read_grammar_file(flag, f.get(flag));
  const std::string hw = f.get("hardware", "cpu");
  HYP_USAGE_CHECK(hw == "cpu" || hw == "gpu", "generate: --hardware must be cpu or gpu, got '{}'",
                  hw);
  const Device device = parse_hardware(hw, "generate: --hardware");
  require_hardware(device, "generate: --hardware");
  LoadedCheckpoint c = load_checkpoint(f.require("checkpoint"), parse_dtype_flag(f), nullptr, device,
                                       f.get("adapter"));
  go.eos_id = c.tokenizer.eos_id();
  go.end_ids = c.tokenizer.end_ids();
  std::vector<int32_t> ids = c.tokenizer.encode_with_special_tokens(prompt);
  HYP_USAGE_CHECK(!ids.empty(),
                  "generate: the prompt is empty and the tokenizer {} adds no BOS token; give "
                  "--prompt",
                  c.tokenizer.origin());
  HYP_CHECK(static_cast<int64_t>(ids.size()) < c.config.max_seq_len,
            "generate: --prompt is {} tokens, the model's context is {}", ids.size(),
            c.config.max_seq_len);
  const int64_t ctx =
      std::min<int64_t>(c.config.max_seq_len, static_cast<int64_t>(ids.size()) + go.max_tokens);
  Generator gen(*c.params, std::max<int64_t>(ctx, 1));
  std::unique_ptr<GrammarConstraint> constraint;
  if (!gbnf.empty()) {
    try {
      constraint = std::make_unique<GrammarConstraint>(gbnf, c.tokenizer, gen.vocab_size());
    } catch (const text::GrammarError& e) {
      usage_fail("generate: --{} {}: {}", f.has("grammar") ? "grammar" : "json-schema",
                 f.get(f.has("grammar") ? "grammar" : "json-schema"), e.what());
    }
    go.constraint = constraint.get();
  }
  const bool json = f.has("json");
  if (!json) std::printf("%s", prompt.c_str());
  // The server's incremental detokeniser: text as a continuation of the prompt, printed
  // once final (a character split over byte-fallback tokens waits for its last byte).
  serve::TextStream stream(&c.tokenizer, ids, {});
  std::vector<int32_t> out = generate_tokens(gen, ids, go, [&](int32_t tok) {
    if (json || c.tokenizer.is_end(tok)) return;
    bool stopped = false;
    const std::string text = stream.push(tok, &stopped);
    if (!text.empty()) {
      std::fputs(text.c_str(), stdout);
      std::fflush(stdout);
    }
  });
  if (!json) std::fputs(stream.flush().c_str(), stdout);
  const bool eos = !out.empty() && c.tokenizer.is_end(out.back());
  if (eos) out.pop_back();
  if (json) {
    nlohmann::ordered_json j;
    j["prompt"] = prompt;
    j["text"] = c.tokenizer.decode(out);
    j["tokens"] = out;
    j["finish_reason"] = eos || (constraint && constraint->finished()) ? "stop" : "length";
    print_json(j, 2);
  } else {
    std::printf("\n");
  }
  return 0;
}

int cmd_convert(const Args& args) {
  const Flags f(kConvertSpec, args);
  HYP_USAGE_CHECK(f.positional().empty(), "convert: unexpected argument '{}'", f.positional()[0]);
  const std::string to = f.require("to");
  HYP_USAGE_CHECK(to == "gguf" || to == "safetensors",
                  "convert: --to must be gguf or safetensors, got '{}'", to);
  // Every flag is checked before the checkpoint is looked at: a usage error is reported
  // as one (exit 2) even when the checkpoint is also wrong.
  HYP_USAGE_CHECK(!(f.has("type") && f.has("quant")),
                  "convert: give --type or --quant, not both");
  const std::string type = f.has("quant") ? f.get("quant", "") : f.get("type", "f16");
  if (f.has("quant"))
    HYP_USAGE_CHECK(type == "q8_0" || type == "q4_0" || type == "q4_k_m" || type == "q5_k_m" ||
                        type == "q6_k",
                    "convert: --quant must be q8_0, q4_0, q4_k_m, q5_k_m or q6_k, got '{}'", type);
  else
    HYP_USAGE_CHECK(type == "f32" || type == "f16" || type == "bf16" || type == "q8_0",
                    "convert: --type must be f32, f16, bf16 or q8_0, got '{}'", type);
  HYP_USAGE_CHECK(to == "gguf" || (!f.has("type") && !f.has("quant")),
                  "convert: --{} applies to --to gguf only", f.has("quant") ? "quant" : "type");
  if (to == "safetensors") f.require("output");
  HYP_USAGE_CHECK(!f.has("merge-lora") || to == "safetensors",
                  "convert: --merge-lora writes safetensors (--to safetensors); convert the merged directory to gguf "
                  "after");
  const std::string dir = resolve_checkpoint_dir(f.require("checkpoint"));
  // The checkpoint's files: an output written over one of them would destroy it.
  std::vector<std::string> inputs;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_regular_file()) inputs.push_back(e.path().string());
  if (to == "safetensors") {
    // One model.safetensors (f32) + config.json + tokenizer.model, from a single-file or
    // sharded (multi-process) checkpoint: what Hugging Face tools load most simply.
    const std::string out = f.require("output");
    HYP_CHECK(!io::same_file(out, dir),
              "convert: the output directory {} is the checkpoint {} itself; choose another", out,
              dir);
    io::check_output_is_not_an_input(out + "/model.safetensors", inputs, "convert");
    io::check_output_is_not_an_input(out + "/config.json", inputs, "convert");
    for (const char* name : text::kTokenizerFileNames)
      io::check_output_is_not_an_input(out + "/" + name, inputs, "convert");
    if (f.has("merge-lora")) {
      for (const auto& e : std::filesystem::directory_iterator(resolve_checkpoint_dir(f.get("merge-lora"))))
        if (e.is_regular_file()) inputs.push_back(e.path().string());
      io::check_output_is_not_an_input(out + "/model.safetensors", inputs, "convert");
    }
    // (Checked, then loaded: the adapter merged in when given.)
    const LoadedCheckpoint c = load_checkpoint(dir, false, [&](const DecoderConfig&) { io::make_directories(out); },
                                               Device::kHost,
                                               f.has("merge-lora") ? resolve_checkpoint_dir(f.get("merge-lora")) : "");
    const ParamStore& params = *c.params;
    io::SafetensorsWriter w;
    for (size_t i = 0; i < params.infos().size(); ++i) {
      const ParamInfo& p = params.infos()[i];
      w.add(p.name, DType::kF32, p.shape, params.params() + p.offset);
    }
    w.set_metadata("format", "pt");
    w.write(out + "/model.safetensors");
    io::write_file_atomic(out + "/config.json", io::read_file(c.dir + "/config.json"));
    // The tokenizer: the adapter's when it carries one (a LoRA run saves it), else the base's.
    const std::string tok_dir =
        !c.adapter.empty() && !text::tokenizer_file_in(c.adapter).empty() ? c.adapter : c.dir;
    for (const char* name : text::kTokenizerFileNames)
      if (std::filesystem::exists(tok_dir + "/" + name))
        io::write_file_atomic(out + "/" + name, io::read_file(tok_dir + "/" + name));
    std::printf("wrote %s/model.safetensors (%zu tensors%s)\n", out.c_str(), params.infos().size(),
                c.adapter.empty() ? "" : (", LoRA adapter " + c.adapter + " merged").c_str());
    return 0;
  }
  // The default output sits beside the checkpoint directory, not inside it: a checkpoint
  // directory is the trainer's (runs/x/checkpoints/200 -> runs/x/checkpoints/200-f16.gguf).
  std::filesystem::path ckpt = std::filesystem::absolute(dir).lexically_normal();
  if (!ckpt.has_filename()) ckpt = ckpt.parent_path();
  const std::string out = f.get(
      "output", (ckpt.parent_path() / (ckpt.filename().string() + "-" + type + ".gguf")).string());
  io::check_output_is_not_an_input(out, inputs, "convert");
  // The config must describe these weights exactly (the writer then checks every tensor
  // for non-finite values as it converts it), and the tokenizer must be the model's, as
  // eval, generate and serve require: the GGUF embeds it.
  const DecoderConfig config = read_checkpoint_config(dir);
  check_weights_match_config(dir, config);
  load_checkpoint_tokenizer(dir, config);
  convert::convert_checkpoint_to_gguf(dir, out, type);
  std::printf("wrote %s (%s, %.1f MiB)\n", out.c_str(), type.c_str(),
              double(std::filesystem::file_size(out)) / (1024.0 * 1024.0));
  return 0;
}

}  // namespace hyperion::cli
