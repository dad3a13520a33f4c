// A Tokenizer from the vocabulary a GGUF file carries in its metadata (the tokenizer.ggml.*
// keys and tokenizer.chat_template), so that a model read from a llama.cpp file tokenizes
// as its original tokenizer did. The inverse of text/gguf_vocab.h's write_gguf_vocab; it
// also reads what llama.cpp's convert_hf_to_gguf.py writes for Llama 2/3.x, Qwen 2/2.5/3,
// Mistral and Gemma 1/2/3.
//
//   "gpt2"   (byte-level BPE: Llama 3, Qwen, Mistral's Tekken) becomes a Hugging Face
//            tokenizer.json run by text/hf_tokenizer.h: every token in model.vocab, the
//            merges in rank order, CONTROL (type 3) and USER_DEFINED (4) tokens also as added
//            tokens (special, and not), the pre-tokenizer that `tokenizer.ggml.pre` names
//            (gguf_pre_tokenizer_names()), a TemplateProcessing post-processor adding BOS and
//            EOS as add_bos_token / add_eos_token say; with a tokenizer_config.json (the
//            bos/eos/pad/unk strings, the chat template) and, where the file names
//            end-of-turn tokens (eot/eom ids), a generation_config.json listing them.
//            files() are those texts, so a checkpoint made from the GGUF carries a tokenizer
//            every command reads.
//   "llama"  (SentencePiece: Llama 2, Mistral 7B, Gemma) becomes a SentencePiece model: BPE
//            over the pieces with their scores and types, byte fallback when the 256 byte
//            pieces are there, identity normalisation that keeps whitespace and escapes it
//            as U+2581, a dummy prefix as add_space_prefix says. Control, user-defined and
//            unknown tokens are found whole in the text first and SentencePiece encodes the
//            stretches between them (Tokenizer's SentencePieceExtras), as llama.cpp and
//            transformers do; SentencePiece alone would spell a chat template's <bos> or
//            <start_of_turn> out in pieces.
//
// What the file leaves out is what llama.cpp assumes: SentencePiece bos 1, eos 2, unk 0 and
// add_bos; no "tokenizer.ggml.pre" is llama.cpp's "default" split. Where llama.cpp and the
// original tokenizer differ, the original wins: Qwen's NFC normaliser runs (llama.cpp skips
// it, which only matters for text not in NFC), the pre-tokenizers' case-insensitive
// contractions are Hugging Face's (?i:'s|...) rather than llama.cpp's '[sS]...'. The
// trailing UNUSED tokens of a "gpt2" vocabulary (the "[PADi]" rows converters pad the
// embedding with) are left out, as the original tokenizer.json has them not: vocab_size()
// may be below the model's rows (Tokenizer::fits_model_vocab).
//
// Errors are hyperion::UsageError naming the file and the key: a key missing or of
// another type, tokens/scores/types of different lengths, ids past the vocabulary, a
// duplicate token, a malformed merge or byte token, an unknown model or pre-tokenizer name
// (listing the supported ones), sizes past 2^24 tokens.
#pragma once

#include <string>
#include <vector>

#include "io/gguf.h"
#include "text/tokenizer.h"

namespace hyperion::text {

Tokenizer tokenizer_from_gguf(const io::GgufFile& f);

// The `tokenizer.ggml.pre` values a "gpt2" vocabulary may name, in the order the errors list
// them.
std::vector<std::string> gguf_pre_tokenizer_names();

}  // namespace hyperion::text
