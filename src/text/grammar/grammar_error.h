// The error every structured-output front end throws (a GBNF grammar, a regular
// expression, a JSON schema, a tool's parameters): what is wrong, and where. The server
// turns it into HTTP 400 naming the request field plus `where`; the CLI into exit status 2.
#pragma once

#include <string>

#include "base/error.h"

namespace hyperion::text {

struct GrammarError : UsageError {
  // `where`: the position in the source ("line 3, column 7", "offset 12") or the path of
  // the schema keyword at fault ("properties.age.minimum"); empty when nothing narrower
  // than the whole input is at fault.
  GrammarError(std::string where_at, const std::string& message)
      : UsageError(where_at.empty() ? message : where_at + ": " + message),
        where(std::move(where_at)),
        detail(message) {}
  std::string where;
  std::string detail;  // the message without `where`
};

// Bounds that keep a hostile grammar or schema from costing unbounded time or memory.
struct GrammarLimits {
  static constexpr size_t kMaxSourceBytes = 1 << 20;     // grammar / schema / regex text
  static constexpr size_t kMaxRules = 100000;            // rules after lowering
  static constexpr size_t kMaxElements = 1 << 20;        // elements after lowering
  static constexpr int kMaxRepeat = 10000;               // {m,n} bounds
  static constexpr int kMaxNesting = 256;                // parentheses / schema depth
  static constexpr size_t kMaxSchemaNodes = 10000;       // keyword objects in a schema
};

}  // namespace hyperion::text
