#include "base/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "base/error.h"

namespace hyperion {
namespace {

const char* type_name(ConfigType t) {
  switch (t) {
    case ConfigType::kInt:
      return "an integer";
    case ConfigType::kFloat:
      return "a number";
    case ConfigType::kBool:
      return "true or false";
    case ConfigType::kString:
      return "a string";
  }
  return "?";
}

bool parse_int(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

bool parse_float(const std::string& s, double* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

bool parse_bool(const std::string& s, bool* out) {
  std::string l = s;
  std::transform(l.begin(), l.end(), l.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  if (l == "true" || l == "yes" || l == "on" || l == "1") {
    *out = true;
    return true;
  }
  if (l == "false" || l == "no" || l == "off" || l == "0") {
    *out = false;
    return true;
  }
  return false;
}

// Levenshtein distance, for "did you mean" suggestions.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] =
          std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// `seen`: every (dotted) key of this file with its line, so that a key given twice
// (`steps: 5` ... `steps: 50`, or `a: {b: 1}` and `a.b: 2`) is an error rather than
// one of them silently winning.
void flatten(const YAML::Node& node, const std::string& prefix, const std::string& source,
             std::map<std::string, int>& seen, Config* config) {
  for (const auto& item : node) {
    const std::string key =
        prefix.empty() ? item.first.Scalar() : prefix + "." + item.first.Scalar();
    const YAML::Node& value = item.second;
    const int line = item.first.Mark().line + 1;
    const std::string where = source + ":" + std::to_string(line);
    if (value.IsMap()) {
      flatten(value, key, source, seen, config);
      continue;
    }
    const auto [it, fresh] = seen.emplace(key, line);
    if (!fresh) usage_fail("{}: key '{}' is given twice (first on line {})", where, key, it->second);
    if (value.IsScalar()) {
      config->set(key, value.Scalar(), where);
    } else if (value.IsNull()) {
      usage_fail("{}: key '{}' has no value", where, key);
    } else {
      usage_fail("{}: key '{}' must be a single value, not a list", where, key);
    }
  }
}

}  // namespace

Config::Config(std::vector<ConfigKey> schema) : schema_(std::move(schema)) {
  for (size_t i = 0; i < schema_.size(); ++i) {
    HYP_CHECK(index_.emplace(schema_[i].name, i).second,
              "config schema: key '{}' is declared twice", schema_[i].name);
    set(schema_[i].name, schema_[i].default_value, "default");
  }
}

const ConfigKey& Config::key_info(const std::string& key, const std::string& source) const {
  auto it = index_.find(key);
  if (it != index_.end()) return schema_[it->second];
  std::string best;
  size_t best_distance = 4;  // only suggest close matches
  for (const auto& k : schema_) {
    size_t d = edit_distance(key, k.name);
    if (d < best_distance) {
      best_distance = d;
      best = k.name;
    }
  }
  if (!best.empty())
    usage_fail("{}: unknown config key '{}' (did you mean '{}'?)", source, key, best);
  usage_fail("{}: unknown config key '{}'", source, key);
}

void Config::set(const std::string& key, const std::string& value, const std::string& source) {
  const ConfigKey& info = key_info(key, source);
  std::string canonical = value;
  bool ok = true;
  switch (info.type) {
    case ConfigType::kInt: {
      int64_t v;
      ok = parse_int(value, &v);
      if (ok) canonical = std::to_string(v);
      break;
    }
    case ConfigType::kFloat: {
      double v;
      ok = parse_float(value, &v);
      break;
    }
    case ConfigType::kBool: {
      bool v;
      ok = parse_bool(value, &v);
      if (ok) canonical = v ? "true" : "false";
      break;
    }
    case ConfigType::kString:
      break;
  }
  HYP_USAGE_CHECK(ok, "{}: config key '{}' must be {}, got '{}'", source, key,
                  type_name(info.type), value);
  values_[key] = Value{canonical, source};
}

void Config::load_yaml_string(const std::string& text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    fail("{}:{}: invalid YAML: {}", source, e.mark.line + 1, e.msg);
  }
  if (root.IsNull()) return;  // empty file
  HYP_CHECK(root.IsMap(), "{}: a config file must be a mapping of keys to values", source);
  std::map<std::string, int> seen;
  flatten(root, "", source, seen, this);
}

void Config::load_yaml_file(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    fail("{}: cannot open config file", path);
  } catch (const YAML::Exception& e) {
    fail("{}:{}: invalid YAML: {}", path, e.mark.line + 1, e.msg);
  }
  if (root.IsNull()) return;
  HYP_CHECK(root.IsMap(), "{}: a config file must be a mapping of keys to values", path);
  std::map<std::string, int> seen;
  flatten(root, "", path, seen, this);
}

void Config::apply_override(const std::string& kv) {
  const size_t eq = kv.find('=');
  HYP_USAGE_CHECK(eq != std::string::npos && eq > 0, "command line: expected key=value, got '{}'",
                  kv);
  set(kv.substr(0, eq), kv.substr(eq + 1), "command line");
}

const Config::Value& Config::value_of(const std::string& key, ConfigType type) const {
  const ConfigKey& info = key_info(key, "config");
  HYP_CHECK(info.type == type, "config: key '{}' is {}, read as {}", key, type_name(info.type),
            type_name(type));
  return values_.at(key);
}

int64_t Config::get_int(const std::string& key) const {
  int64_t v = 0;
  parse_int(value_of(key, ConfigType::kInt).text, &v);
  return v;
}

double Config::get_float(const std::string& key) const {
  double v = 0;
  parse_float(value_of(key, ConfigType::kFloat).text, &v);
  return v;
}

bool Config::get_bool(const std::string& key) const {
  bool v = false;
  parse_bool(value_of(key, ConfigType::kBool).text, &v);
  return v;
}

const std::string& Config::get_string(const std::string& key) const {
  return value_of(key, ConfigType::kString).text;
}

const std::string& Config::source_of(const std::string& key) const {
  key_info(key, "config");
  return values_.at(key).source;
}

std::map<std::string, std::string> Config::values() const {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : values_) out[k] = v.text;
  return out;
}

}  // namespace hyperion
