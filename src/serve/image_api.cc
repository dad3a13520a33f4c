#include "serve/image_api.h"

#include <fmt/format.h>

#include <charconv>
#include <random>

#include "diffusion/image_dataset.h"
#include "io/image_file.h"
#include "serve/api_fields.h"

namespace hyperion::serve {

using nlohmann::json;

namespace {

std::string get_string(const json& j, const char* key) {
  const json& v = j.at(key);
  if (!v.is_string()) bad(key, fmt::format("'{}' must be a string, got {}", key, type_name(v)));
  return v.get<std::string>();
}

// "WxH" (both positive integers) or "auto" (0 x 0: the model's default).
void parse_size(const std::string& s, int64_t* width, int64_t* height) {
  if (s == "auto") {
    *width = *height = 0;
    return;
  }
  const size_t x = s.find('x');
  auto number = [](std::string_view t, int64_t* out) {
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), *out);
    return ec == std::errc() && end == t.data() + t.size() && !t.empty() && *out > 0;
  };
  if (x == std::string::npos || !number(std::string_view(s).substr(0, x), width) ||
      !number(std::string_view(s).substr(x + 1), height))
    bad("size", fmt::format("'size' must be \"WIDTHxHEIGHT\" (e.g. \"512x512\") or \"auto\", got \"{}\"",
                            s.substr(0, 64)));
}

}  // namespace

diffusion::ImageRequest parse_image_request(const std::string& body, const ApiContext& ctx) {
  const json j = parse_body(body);
  diffusion::ImageRequest r;
  bool have_prompt = false, have_seed = false;
  for (const auto& [key, value] : j.items()) {
    if (key == "prompt") {
      r.prompt = get_string(j, "prompt");
      have_prompt = true;
    } else if (key == "negative_prompt") {
      r.negative_prompt = get_string(j, "negative_prompt");
    } else if (key == "model") {
      if (value.is_null()) continue;
      const std::string m = get_string(j, "model");
      if (m != ctx.model_name)
        bad("model", fmt::format("the model '{}' does not exist; this server serves '{}'", m, ctx.model_name), 404);
    } else if (key == "n") {
      if (!value.is_null()) r.count = get_int(j, "n", 1, 10);
    } else if (key == "size") {
      if (!value.is_null()) parse_size(get_string(j, "size"), &r.width, &r.height);
    } else if (key == "response_format") {
      if (value.is_null()) continue;
      const std::string f = get_string(j, "response_format");
      if (f == "url")
        bad(key, "'response_format' \"url\" is not served (the server keeps no image files); use \"b64_json\"");
      if (f != "b64_json") bad(key, fmt::format("'response_format' must be \"b64_json\", got \"{}\"", f.substr(0, 64)));
    } else if (key == "output_format") {
      if (value.is_null()) continue;
      const std::string f = get_string(j, "output_format");
      if (f != "png") bad(key, fmt::format("'output_format' must be \"png\", got \"{}\"", f.substr(0, 64)));
    } else if (key == "quality" || key == "style" || key == "user") {
      if (!value.is_null()) get_string(j, key.c_str());  // accepted and ignored
    } else if (key == "seed") {
      if (value.is_null()) continue;
      if (!value.is_number_integer() && !value.is_number_unsigned())
        bad(key, fmt::format("'seed' must be an integer, got {}", type_name(value)));
      r.seed = value.is_number_unsigned() ? value.get<uint64_t>() : static_cast<uint64_t>(value.get<int64_t>());
      have_seed = true;
    } else if (key == "steps") {
      if (!value.is_null()) r.steps = get_int(j, "steps", 1, 1000);
    } else if (key == "guidance_scale") {
      if (value.is_null()) continue;
      r.guidance = get_number(j, "guidance_scale");
      if (!(r.guidance >= 0 && r.guidance <= 100))
        bad(key, fmt::format("'guidance_scale' must be in [0, 100], got {}", r.guidance));
    } else if (key == "scheduler") {
      if (!value.is_null()) r.sampler = get_string(j, "scheduler");
    } else if (key == "karras") {
      if (!value.is_null()) r.karras = get_bool(j, "karras");
    } else {
      bad(key, fmt::format("unknown field '{}'", key));
    }
  }
  if (!have_prompt) bad("prompt", "'prompt' is required");
  for (auto [name, text] : {std::pair<const char*, const std::string*>{"prompt", &r.prompt},
                            {"negative_prompt", &r.negative_prompt}})
    if (text->size() > kMaxImagePromptBytes)
      bad(name, fmt::format("'{}' is {} bytes; at most {} are accepted (the text encoder reads 77 tokens)", name,
                            text->size(), kMaxImagePromptBytes));
  if (!have_seed) {
    // OpenAI's API has no seed, and its users expect a new image per call.
    std::random_device rd;
    r.seed = (uint64_t(rd()) << 32 | rd()) & ((uint64_t{1} << 53) - 1);  // exact in a JSON double
  }
  return r;
}

std::string image_response(const diffusion::GeneratedImages& images, uint64_t seed, int64_t created) {
  json data = json::array();
  const int64_t per = images.height * images.width * images.channels;
  for (int64_t i = 0; i < images.count; ++i) {
    const io::Image img = diffusion::to_image(images.pixels.data() + i * per, images.height, images.width,
                                              images.channels);
    data.push_back({{"b64_json", base64_encode(io::encode_png(img))}});
  }
  return dump(json{{"created", created},
                   {"data", std::move(data)},
                   {"seed", seed},
                   {"size", fmt::format("{}x{}", images.width, images.height)},
                   {"output_format", "png"}});
}

std::string base64_encode(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16 | uint32_t(uint8_t(bytes[i + 1])) << 8 | uint8_t(bytes[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out += kAlphabet[(v >> s) & 63];
  }
  if (const size_t left = bytes.size() - i; left > 0) {
    uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    if (left == 2) v |= uint32_t(uint8_t(bytes[i + 1])) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += left == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

}  // namespace hyperion::serve
