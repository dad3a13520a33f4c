// OpenAI's image API as `hyperion serve` answers it on a diffusion checkpoint:
// POST /v1/images/generations. No sockets here (serve/http_server.h).
//
// Accepted request fields (anything else is a 400 naming the field):
//   prompt (string, required), model (the served id when given), n (1..10),
//   size ("WxH", or "auto" for the model's default), response_format ("b64_json"; "url" is
//   refused: the server keeps no files), output_format ("png"), quality and style
//   (strings, ignored), user (ignored); extensions: seed (integer; absent: a random one,
//   returned), steps (denoising steps, default 30), guidance_scale (default 7.5),
//   negative_prompt (string), scheduler (ddim | euler | euler_a | dpm++2m), karras (bool).
// Image i of a request is the image `hyperion generate --seed SEED` writes as its i-th.
//
// The response: {"created": unix seconds, "data": [{"b64_json": PNG as base64}, ...],
// "seed": the seed used, "size": "WxH", "output_format": "png"}.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "diffusion/pipeline.h"
#include "serve/openai_api.h"

namespace hyperion::serve {

// The longest prompt or negative prompt accepted, in bytes (the encoder reads 77 tokens;
// longer prompts are truncated with a warning, as diffusers does).
constexpr size_t kMaxImagePromptBytes = 16384;

// Throws ApiException (400, or 404 for another model) naming the field.
diffusion::ImageRequest parse_image_request(const std::string& body, const ApiContext& ctx);

std::string image_response(const diffusion::GeneratedImages& images, uint64_t seed, int64_t created);

// RFC 4648 base64 with padding.
std::string base64_encode(std::string_view bytes);

}  // namespace hyperion::serve
