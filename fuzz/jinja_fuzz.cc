// libFuzzer: the Jinja chat template interpreter. The input is a template; it is parsed
// and rendered with a small fixed conversation under small limits. Any outcome but a
// rendered string or a hyperion::Error (a crash, a hang, a sanitizer report, an output
// over the limit) is a bug.
#include <cstdint>
#include <string>

#include "base/error.h"
#include "text/jinja/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hyperion;
  using namespace hyperion::text::jinja;
  static const Value context = from_json(nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi <think>x</think> there"},
      {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": [true, null, 2.5]}}}]},
      {"role": "tool", "content": [{"type": "text", "text": "ok"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"
  })"));
  RenderOptions options;
  options.max_output_bytes = 64 << 10;
  options.max_steps = 200000;
  options.max_call_depth = 32;
  options.now = [] { return std::chrono::system_clock::from_time_t(1700000000); };
  const std::string source(reinterpret_cast<const char*>(data), size);
  try {
    const Template t = Template::parse(source, "fuzz.jinja");
    const std::string out = t.render(context, options);
    if (out.size() > options.max_output_bytes) __builtin_trap();
  } catch (const Error&) {
  }
  return 0;
}
