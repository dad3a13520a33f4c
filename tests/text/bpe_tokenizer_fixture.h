// A small byte-level BPE tokenizer.json (with tokenizer_config.json) in Llama 3's or
// Qwen's form, for the GGUF vocabulary tests.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "../test_files.h"
#include "text/bpe_model.h"

namespace hyperion::testing_util {

using text::byte_level_char;

inline constexpr const char* kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr const char* kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A byte-level BPE: the 256 byte tokens (ids 0-255), merges "h e" -> "he" (256),
// "Ġ t" -> "Ġt" (257), "Ġt he" -> "Ġthe" (258), and added tokens <|begin_of_text|> (300,
// special), <|eot_id|> (301, not marked special but looking it), "hyperion" (302, plain).
inline nlohmann::json bpe_tokenizer(const std::string& split, bool nfc, bool pairs) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_char(static_cast<uint8_t>(b))] = b;
  const std::string g = byte_level_char(' ');  // "Ġ"
  vocab["he"] = 256;
  vocab[g + "t"] = 257;
  vocab[g + "the"] = 258;
  nlohmann::json merges = nlohmann::json::array();
  for (auto [l, r] : std::vector<std::pair<std::string, std::string>>{
           {"h", "e"}, {g, "t"}, {g + "t", "he"}})
    merges.push_back(pairs ? nlohmann::json::array({l, r}) : nlohmann::json(l + " " + r));
  nlohmann::json pre = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"},
                           {"pattern", {{"Regex", split}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                          {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", false}}}}};
  return {{"version", "1.0"},
          {"added_tokens",
           {{{"id", 300}, {"content", "<|begin_of_text|>"}, {"special", true}},
            {{"id", 301}, {"content", "<|eot_id|>"}, {"special", false}},
            {{"id", 302}, {"content", "hyperion"}, {"special", false}}}},
          {"normalizer", nfc ? nlohmann::json{{"type", "NFC"}} : nlohmann::json()},
          {"pre_tokenizer", pre},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"byte_fallback", false}}}};
}

inline void write_hf_tokenizer(const std::filesystem::path& dir, const nlohmann::json& tok, bool add_bos) {
  std::filesystem::create_directories(dir);
  write_bytes((dir / "tokenizer.json").string(), tok.dump());
  nlohmann::json cfg = {{"bos_token", "<|begin_of_text|>"},
                        {"eos_token", "<|eot_id|>"},
                        {"add_bos_token", add_bos},
                        {"chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}"}};
  write_bytes((dir / "tokenizer_config.json").string(), cfg.dump());
}

}  // namespace hyperion::testing_util
