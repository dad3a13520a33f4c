// A decoder's Hugging Face config.json: the keys each family's transformers config class
// reads (LlamaConfig, MistralConfig, MixtralConfig, GemmaConfig, Gemma2Config,
// Gemma3TextConfig, Qwen2Config, Qwen3Config). Every command that reads a model directory
// or writes a checkpoint goes through these two functions.
#pragma once

#include <string>

#include "model/decoder_config.h"

namespace hyperion::convert {

// The family's keys and class: LlamaForCausalLM (MistralForCausalLM with a window on every
// layer), MixtralConfig keys and MixtralForCausalLM for MoE (plus hyperion_* keys for
// dense/MoE interleaving, which Hugging Face's Mixtral cannot express), GemmaForCausalLM,
// Gemma2ForCausalLM, Gemma3ForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM.
std::string to_hf_config_json(const DecoderConfig& config);

// Reads a config.json; every key that would change the computation is checked, and
// errors name `origin` (the file) and the key.
DecoderConfig decoder_config_from_hf_json(const std::string& text, const std::string& origin);

}  // namespace hyperion::convert
