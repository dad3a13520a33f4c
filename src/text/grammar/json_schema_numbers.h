// Exact GBNF for the JSON numbers in an interval: JSON Schema's minimum, maximum,
// exclusiveMinimum and exclusiveMaximum (json_schema_gbnf.h), as digit-by-digit grammars.
//
// Integers: canonical JSON integers (no leading zeros, no "-0") in [lo, hi], split by digit
// count, each count's range written as the digits that follow a tight lower or upper
// prefix (llama.cpp's _build_min_max_int, generalised to any digit count). Numbers:
// decimal notation without exponent, `-? int ("." digits)?`, whose value is in the
// interval; trailing zeros count for nothing (0.5 <= x accepts "0.5", "0.50", "0.51", not
// "0.4999"); negative zero ("-0", "-0.0") is not generated.
//
// Digit counts are bounded so that generation ends: at most kMaxIntegerDigits integer
// digits and kMaxFractionDigits fraction digits, or the bounds' own counts where those are
// larger; a bound with more than kMaxBoundDigits digits on either side is refused.
// Every value is exact: bounds are compared as decimal digit strings, never as doubles.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "text/grammar/grammar_error.h"

namespace hyperion::text {

// A decimal number, canonical: no leading zeros in `int_digits` ("0" for none), no
// trailing zeros in `frac_digits`, zero never negative.
struct Decimal {
  bool negative = false;
  std::string int_digits = "0";
  std::string frac_digits;

  // From a JSON number's text ("-12", "0.5", "1e+20", "2.5E-3"); nullopt when malformed.
  static std::optional<Decimal> parse(std::string_view json_number);
  std::string str() const;  // "-1.25"
};

// -1, 0 or 1 as a < b, a == b, a > b (by value).
int compare(const Decimal& a, const Decimal& b);

struct NumberBound {
  Decimal value;
  bool exclusive = false;
};

inline constexpr int kMaxIntegerDigits = 16;
inline constexpr int kMaxFractionDigits = 16;
inline constexpr int kMaxBoundDigits = 32;

// The JSON integers in the interval (a side may be open); nullopt when there is none.
// Throws GrammarError("", ...) for a bound with more than kMaxBoundDigits digits.
std::optional<std::string> integer_range_gbnf(const std::optional<NumberBound>& lo,
                                              const std::optional<NumberBound>& hi);

// The JSON numbers in decimal notation in the interval; nullopt when there is none.
// Throws as integer_range_gbnf does.
std::optional<std::string> decimal_range_gbnf(const std::optional<NumberBound>& lo,
                                              const std::optional<NumberBound>& hi);

}  // namespace hyperion::text
