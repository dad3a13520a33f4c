// A llama.cpp GGUF file as a hyperion model: what convert/gguf_convert.h writes, read
// back, and what llama.cpp's convert_hf_to_gguf.py and llama-quantize write for the
// families hyperion runs (general.architecture llama incl. Mistral and Mixtral, gemma,
// gemma2, gemma3, qwen2, qwen3).
//
//   config     the architecture's metadata (<arch>.block_count, .embedding_length, ...),
//              turned into the config.json keys of the family and read by
//              decoder_config_from_hf_json, so a GGUF is checked as a config.json is.
//              Llama 3.1's rope_freqs tensor is matched to its rope_scaling parameters.
//   tensors    each of the model's parameters from its llama.cpp name
//              (convert/family_formats.h). F32, F16 and BF16 are read into the f32
//              masters. Q4_0, Q8_0, Q4_K, Q5_K and Q6_K matrices (and the embedding) stay
//              in their blocks, read in place from the mapped file
//              (ParamStore::hold_in_blocks); only the llama architecture's q/k rows are
//              copied, to undo the RoPE row permutation convert_hf_to_gguf.py applies.
//              Norms stored as Gemma's (1 + w) get the 1 taken back off; MoE experts and
//              norms in blocks are dequantised into the masters.
//
// Every error names the file and the key or tensor; what the file says is checked against
// the file's size before anything is allocated from it (io::GgufFile validates the
// structure on open).
#pragma once

#include <memory>
#include <string>

#include "io/gguf.h"
#include "model/decoder_config.h"
#include "model/param_store.h"

namespace hyperion::convert {

// Whether `path` is a GGUF file (a regular file beginning with "GGUF").
bool is_gguf_file(const std::string& path);

// The model's config, from the file's metadata (and its rope_freqs tensor). A usage error
// (exit status 2) names the file and key for an architecture, key or value hyperion
// cannot run.
DecoderConfig decoder_config_from_gguf(const io::GgufFile& file);

// Loads every parameter of `params` (a host store of decoder_config_from_gguf's config,
// nothing written yet) from `file`, which the store keeps alive while it holds blocks.
// Returns the number of matrices held in blocks.
int load_gguf_weights(std::shared_ptr<const io::GgufFile> file, ParamStore& params);

// What a GGUF model at `path` holds in memory once loaded, for the serving engine's memory
// plan: its file's size (the blocks, packed in about the same bytes) plus a tenth for the
// f32 norms and reordered rows; -1 when `path` is not a GGUF file.
int64_t gguf_weight_bytes(const std::string& path);

// The matrix types of a file, for messages: "q4_K x 113, q6_K x 17, f32 x 33".
std::string gguf_type_summary(const io::GgufFile& file);

}  // namespace hyperion::convert
