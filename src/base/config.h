// Run configuration in the style of MaxText's base.yml: one YAML file plus `key=value`
// overrides from the command line, checked against a schema of known keys and types.
// Nested YAML maps flatten to dotted keys (`optimizer: {lr: 1}` is `optimizer.lr`).
// Every error names the key and where the value came from (file and line, or
// "command line").
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace hyperion {

enum class ConfigType { kInt, kFloat, kBool, kString };

struct ConfigKey {
  std::string name;
  ConfigType type;
  std::string default_value;  // parsed with the same rules as YAML scalars
  std::string help;
};

class Config {
 public:
  explicit Config(std::vector<ConfigKey> schema);

  // Reads a YAML mapping of keys to scalars; later loads and overrides win.
  void load_yaml_file(const std::string& path);
  void load_yaml_string(const std::string& text, const std::string& source);
  // "key=value" (command line). The value uses the key's type.
  void apply_override(const std::string& key_equals_value);
  void set(const std::string& key, const std::string& value, const std::string& source);

  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  // Where the current value came from: "default", "FILE:LINE" or "command line".
  const std::string& source_of(const std::string& key) const;

  const std::vector<ConfigKey>& schema() const { return schema_; }
  // Canonical text of each value, in key order (for logs and checkpoints).
  std::map<std::string, std::string> values() const;

 private:
  struct Value {
    std::string text;
    std::string source;
  };
  const ConfigKey& key_info(const std::string& key, const std::string& source) const;
  const Value& value_of(const std::string& key, ConfigType type) const;

  std::vector<ConfigKey> schema_;
  std::map<std::string, size_t> index_;
  std::map<std::string, Value> values_;
};

}  // namespace hyperion
