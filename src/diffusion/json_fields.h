// Typed reads of a diffusers / transformers config.json with errors that name the file
// and the key: every config of a diffusion directory (model_index.json, the scheduler's,
// the UNet's, the VAE's, the text encoders') is read through this.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace hyperion::diffusion {

class JsonFields {
 public:
  // Parses text (an object); origin names the file in errors.
  JsonFields(const std::string& text, std::string origin);
  JsonFields(nlohmann::json object, std::string origin);

  const std::string& origin() const { return origin_; }
  const nlohmann::json& json() const { return j_; }
  // True when the key is present and not null.
  bool has(const char* key) const;

  // The value, or `fallback` when absent or null; a value of the wrong type is an error
  // naming the key.
  int64_t integer(const char* key, int64_t fallback) const;
  double number(const char* key, double fallback) const;
  bool boolean(const char* key, bool fallback) const;
  std::string string(const char* key, const std::string& fallback) const;
  // A list of integers, or one integer repeated `count` times (diffusers' "int or tuple"
  // fields such as attention_head_dim); fallback when absent.
  std::vector<int64_t> integers(const char* key, size_t count,
                                const std::vector<int64_t>& fallback) const;
  std::vector<std::string> strings(const char* key) const;
  // Throws "ORIGIN: KEY ..." with the message.
  [[noreturn]] void refuse(const char* key, const std::string& message) const;

 private:
  nlohmann::json j_;
  std::string origin_;
};

}  // namespace hyperion::diffusion
