// Reading an OpenAI-style JSON request body field by field: every failure is an
// ApiException (HTTP 400, or what `status` says) naming the field at fault, and a body that
// is not JSON or not UTF-8 is named down to the member being read ("messages[0].content").
// Shared by the text routes (openai_api.cc) and the image route (image_api.cc).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "serve/openai_api.h"

namespace hyperion::serve {

[[noreturn]] void bad(const std::string& param, const std::string& message, int status = 400);
// The body as a JSON object (else a 400 naming where it failed).
nlohmann::json parse_body(const std::string& body);
// JSON out: bytes that are not valid UTF-8 become U+FFFD instead of failing the response.
std::string dump(const nlohmann::json& j);
const char* type_name(const nlohmann::json& v);
// j[key] as an integer in [lo, hi], a number, a boolean (else a 400 naming key).
int64_t get_int(const nlohmann::json& j, const char* key, int64_t lo, int64_t hi);
double get_number(const nlohmann::json& j, const char* key);
bool get_bool(const nlohmann::json& j, const char* key);

}  // namespace hyperion::serve
