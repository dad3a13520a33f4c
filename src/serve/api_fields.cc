#include "serve/api_fields.h"

#include <fmt/format.h>

#include <vector>

namespace hyperion::serve {

using nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message, int status) {
  ApiError e;
  e.status = status;
  e.param = param;
  e.message = message;
  if (status == 404) e.type = "not_found_error";
  throw ApiException(std::move(e));
}

namespace {

// Where a JSON parse failed: the path of the value being read ("messages[0].content")
// and the parser's message. Only run after a failed parse, to name the field at fault.
class ErrorLocator : public nlohmann::json_sax<json> {
 public:
  std::string path() const {
    std::string out;
    for (const Level& l : stack_) {
      if (l.array)
        out += fmt::format("[{}]", l.index < 0 ? 0 : l.index);
      else if (!l.key.empty() && !l.done)
        out += (out.empty() ? "" : ".") + l.key;
      else
        break;  // between two members: no field is being read
    }
    return out;
  }
  size_t position = 0;
  std::string message;

  bool null() override { return scalar(); }
  bool boolean(bool) override { return scalar(); }
  bool number_integer(number_integer_t) override { return scalar(); }
  bool number_unsigned(number_unsigned_t) override { return scalar(); }
  bool number_float(number_float_t, const string_t&) override { return scalar(); }
  bool string(string_t&) override { return scalar(); }
  bool binary(binary_t&) override { return scalar(); }
  bool start_object(std::size_t) override { return open(false); }
  bool start_array(std::size_t) override { return open(true); }
  bool key(string_t& k) override {
    stack_.back().key = k;
    stack_.back().done = false;
    return true;
  }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t pos, const std::string&,
                   const nlohmann::detail::exception& e) override {
    position = pos;
    message = e.what();
    // In an array the error is in the element after the last complete one.
    if (!stack_.empty() && stack_.back().array) ++stack_.back().index;
    return false;
  }

 private:
  struct Level {
    bool array;
    int64_t index = -1;  // arrays: the element being read
    std::string key;     // objects: the member being read ...
    bool done = false;   // ... or the last one, complete
  };
  bool scalar() {
    if (!stack_.empty()) {
      if (stack_.back().array)
        ++stack_.back().index;
      else
        stack_.back().done = true;
    }
    return true;
  }
  bool open(bool array) {
    if (!stack_.empty() && stack_.back().array) ++stack_.back().index;
    stack_.push_back(Level{array, -1, "", false});
    return true;
  }
  bool close() {
    stack_.pop_back();
    if (!stack_.empty() && !stack_.back().array) stack_.back().done = true;
    return true;
  }
  std::vector<Level> stack_;
};

// Bytes that are not printable ASCII as \xNN: error messages quote the request, and the
// request may hold anything.
std::string printable(std::string_view text) {
  std::string out;
  for (const unsigned char c : text) {
    if (c >= 0x20 && c < 0x7f)
      out += static_cast<char>(c);
    else
      out += fmt::format("\\x{:02x}", c);
  }
  return out;
}

}  // namespace

json parse_body(const std::string& body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    ErrorLocator where;
    json::sax_parse(body, &where);
    const std::string field = where.path();
    if (where.message.find("UTF-8") != std::string::npos ||
        where.message.find("surrogate") != std::string::npos)
      bad(field,
          fmt::format("{} is not valid UTF-8 (byte {} of the body)",
                      field.empty() ? "the request body" : "'" + field + "'", where.position));
    // nlohmann's message quotes what it read last; keep it, made printable.
    bad(field, fmt::format("the request body is not valid JSON{}: {}",
                           field.empty() ? "" : " (in '" + field + "')", printable(where.message)));
  }
  if (!j.is_object()) bad("", "the request body must be a JSON object");
  return j;
}

// Every JSON this API writes: a string that is not valid UTF-8 (a token sequence that
// stops inside a character) is written with U+FFFD in place of the bad bytes instead of
// making the whole response fail.
std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

const char* type_name(const json& v) {
  return v.type_name();
}

int64_t get_int(const json& j, const char* key, int64_t lo, int64_t hi) {
  const json& v = j.at(key);
  if (!v.is_number_integer() && !v.is_number_unsigned())
    bad(key, fmt::format("'{}' must be an integer, got {}", key, type_name(v)));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    bad(key, fmt::format("'{}' is out of range", key));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) bad(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, x));
  return x;
}

double get_number(const json& j, const char* key) {
  const json& v = j.at(key);
  if (!v.is_number()) bad(key, fmt::format("'{}' must be a number, got {}", key, type_name(v)));
  return v.get<double>();
}

bool get_bool(const json& j, const char* key) {
  const json& v = j.at(key);
  if (!v.is_boolean()) bad(key, fmt::format("'{}' must be a boolean, got {}", key, type_name(v)));
  return v.get<bool>();
}

}  // namespace hyperion::serve
