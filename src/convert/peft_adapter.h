// LoRA adapter directories in Hugging Face PEFT's layout, read and written:
//
//   adapter_config.json        peft_type LORA, r, lora_alpha, lora_dropout, target_modules,
//                              use_rslora, base_model_name_or_path, task_type ...
//   adapter_model.safetensors  "base_model.model.<module>.lora_A.weight" [r, in] and
//                              ".lora_B.weight" [out, r] per adapted matrix
//
// so PeftModel.from_pretrained(base, dir) loads what hyperion trains, and hyperion loads
// what PEFT saved (f32, bf16 or f16 tensors). Options PEFT has and hyperion does not
// implement are refused by name rather than silently computing something else.
#pragma once

#include <memory>
#include <string>

#include "model/lora.h"

namespace hyperion::convert {

// Whether `dir` holds adapter_config.json.
bool is_peft_adapter_dir(const std::string& dir);

// Reads dir/adapter_config.json. Throws (a usage error) naming the file and the key for a
// non-LoRA peft_type, r < 1, use_dora, modules_to_save, layers_to_transform,
// rank_pattern / alpha_pattern, a bias other than "none", fan_in_fan_out, lora_bias, a
// target_modules regex or an unknown module.
LoraConfig read_peft_config(const std::string& dir);

// adapter_config.json's base_model_name_or_path ("" when absent).
std::string peft_base_model(const std::string& dir);

// adapter_config.json for `config` (PEFT's keys; base_model names the base's directory).
std::string peft_config_json(const LoraConfig& config, const std::string& base_model);

// Loads dir's adapter (config and tensors) for `base`: every tensor the config implies must
// be in adapter_model.safetensors with its shape, and the file must hold no other, else
// an error names the adapter directory and the tensor (a base of another shape, other
// target modules). The adapter lives on the base's device, with the base's compute dtype.
std::unique_ptr<LoraAdapter> load_peft_adapter(const std::string& dir, const ParamStore& base,
                                               bool gradients = false);
// Reads dir's tensors into `adapter` (same checks).
void read_peft_tensors(const std::string& dir, LoraAdapter& adapter);

// Writes adapter_config.json and adapter_model.safetensors (f32) into dir (created if
// missing), each file atomically.
void save_peft_adapter(const std::string& dir, const LoraAdapter& adapter, const std::string& base_model);

}  // namespace hyperion::convert
