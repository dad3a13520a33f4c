#include "diffusion/json_fields.h"

#include <utility>

#include "base/error.h"

namespace hyperion::diffusion {

JsonFields::JsonFields(const std::string& text, std::string origin) : origin_(std::move(origin)) {
  try {
    j_ = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON ({})", origin_, e.what());
  }
  HYP_CHECK(j_.is_object(), "{}: must hold a JSON object", origin_);
}

JsonFields::JsonFields(nlohmann::json object, std::string origin)
    : j_(std::move(object)), origin_(std::move(origin)) {
  HYP_CHECK(j_.is_object(), "{}: must be a JSON object", origin_);
}

bool JsonFields::has(const char* key) const {
  return j_.contains(key) && !j_[key].is_null();
}

void JsonFields::refuse(const char* key, const std::string& message) const {
  fail("{}: {} {}", origin_, key, message);
}

int64_t JsonFields::integer(const char* key, int64_t fallback) const {
  if (!has(key)) return fallback;
  const auto& v = j_[key];
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float() && v.get<double>() == double(int64_t(v.get<double>())))
    return int64_t(v.get<double>());
  refuse(key, "must be an integer, got " + v.dump());
}

double JsonFields::number(const char* key, double fallback) const {
  if (!has(key)) return fallback;
  const auto& v = j_[key];
  if (!v.is_number()) refuse(key, "must be a number, got " + v.dump());
  return v.get<double>();
}

bool JsonFields::boolean(const char* key, bool fallback) const {
  if (!has(key)) return fallback;
  const auto& v = j_[key];
  if (!v.is_boolean()) refuse(key, "must be true or false, got " + v.dump());
  return v.get<bool>();
}

std::string JsonFields::string(const char* key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  const auto& v = j_[key];
  if (!v.is_string()) refuse(key, "must be a string, got " + v.dump());
  return v.get<std::string>();
}

std::vector<int64_t> JsonFields::integers(const char* key, size_t count,
                                          const std::vector<int64_t>& fallback) const {
  if (!has(key)) return fallback;
  const auto& v = j_[key];
  if (v.is_number_integer()) return std::vector<int64_t>(count, v.get<int64_t>());
  if (!v.is_array()) refuse(key, "must be an integer or a list of integers, got " + v.dump());
  std::vector<int64_t> out;
  for (const auto& e : v) {
    if (!e.is_number_integer()) refuse(key, "must hold integers, got " + v.dump());
    out.push_back(e.get<int64_t>());
  }
  if (count > 0 && out.size() != count)
    refuse(key, "has " + std::to_string(out.size()) + " entries where " + std::to_string(count) +
                    " are expected: " + v.dump());
  return out;
}

std::vector<std::string> JsonFields::strings(const char* key) const {
  if (!has(key)) return {};
  const auto& v = j_[key];
  if (!v.is_array()) refuse(key, "must be a list of strings, got " + v.dump());
  std::vector<std::string> out;
  for (const auto& e : v) {
    if (!e.is_string()) refuse(key, "must hold strings, got " + v.dump());
    out.push_back(e.get<std::string>());
  }
  return out;
}

}  // namespace hyperion::diffusion
