// A Jinja interpreter for Hugging Face chat templates (tokenizer_config.json's
// `chat_template`), rendering byte for byte what transformers renders: Python jinja2 with
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
// extensions=[loopcontrols]) and the globals raise_exception(msg) and strftime_now(fmt),
// and `tojson` as json.dumps(x, ensure_ascii=False, indent=, separators=, sort_keys=).
//
// Python's semantics are the reference: Undefined (prints as "", is false, iterates as
// empty; using an attribute, item, operator or call of it raises), `and`/`or` returning an
// operand, lists and dicts shared by reference, str() and repr() for printing non-strings,
// string indexing and slicing by code point. As in the immutable sandbox, methods that
// modify a list or dict (append, pop, update...) are refused, and range() is capped at
// 100000 items.
//
// Templates are untrusted input: every limit in RenderOptions ends a render with a
// hyperion::Error, never a hang, a crash or an unbounded allocation. Every error names
// the template and the line and column: "ORIGIN:LINE:COL: message".
//
// Not supported (a syntax error names them): {% call %}, {% include %}/{% import %}/
// {% extends %}/{% block %}, recursive loops, *args/**kwargs in calls. Integers are
// 64-bit (Python's are unbounded: overflow is an error here); case mapping (upper, lower,
// title, capitalize) covers ASCII only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "text/jinja/value.h"

namespace hyperion::text::jinja {

struct RenderOptions {
  size_t max_output_bytes = size_t{16} << 20;  // also the largest string a template may build
  int64_t max_steps = 10'000'000;              // loop iterations, expressions and string work
  int max_call_depth = 256;                    // nested calls (macros calling macros)
  // The clock of strftime_now (local time, as Python's datetime.now()).
  std::function<std::chrono::system_clock::time_point()> now = [] {
    return std::chrono::system_clock::now();
  };
};

class Template {
 public:
  // Parses; throws hyperion::Error "ORIGIN:LINE:COL: message" on a syntax error.
  static Template parse(std::string_view source, std::string origin);

  // Renders with `context` (a dict: its keys are the template's variables). Throws
  // hyperion::Error "ORIGIN:LINE:COL: message" for run-time errors and
  // "ORIGIN:LINE:COL: raise_exception: MSG" for the template's own raise_exception(MSG).
  std::string render(const Value& context, const RenderOptions& options = {}) const;

  const std::string& origin() const { return *origin_; }

 private:
  struct Parsed;
  std::shared_ptr<const Parsed> parsed_;
  std::shared_ptr<const std::string> origin_;
};

// A JSON document as a template value: objects become dicts in their key order (parse
// with nlohmann::ordered_json to keep it), arrays lists, integers int (unsigned beyond
// int64 and fractions float). Throws when it nests deeper than kMaxValueDepth.
Value from_json(const nlohmann::ordered_json& json);
Value from_json(const nlohmann::json& json);

}  // namespace hyperion::text::jinja
