#include "text/grammar/json_schema_numbers.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "text/grammar/json_schema_converter.h"

namespace hyperion::text {

namespace {

// ---------------------------------------------------------------------------------------
// Unsigned magnitudes as canonical digit strings.

int compare_mag(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  return a < b ? -1 : a > b ? 1 : 0;
}

std::string increment(std::string m) {
  for (size_t i = m.size(); i-- > 0;) {
    if (m[i] != '9') {
      ++m[i];
      return m;
    }
    m[i] = '0';
  }
  return "1" + m;
}

std::string decrement(std::string m) {  // m > 0
  for (size_t i = m.size(); i-- > 0;) {
    if (m[i] != '0') {
      --m[i];
      break;
    }
    m[i] = '9';
  }
  const size_t nz = m.find_first_not_of('0');
  return nz == std::string::npos ? "0" : m.substr(nz);
}

std::string nines(size_t n) {
  return std::string(n, '9');
}

// A signed integer: canonical magnitude, zero never negative.
struct Int {
  bool negative = false;
  std::string mag = "0";
};

int compare_int(const Int& a, const Int& b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  const int c = compare_mag(a.mag, b.mag);
  return a.negative ? -c : c;
}

Int plus_one(const Int& v) {
  if (!v.negative) return {false, increment(v.mag)};
  const std::string m = decrement(v.mag);
  return {m != "0", m};
}

Int minus_one(const Int& v) {
  if (v.negative) return {true, increment(v.mag)};
  if (v.mag == "0") return {true, "1"};
  return {false, decrement(v.mag)};
}

Int floor_of(const Decimal& d) {
  if (d.frac_digits.empty() || !d.negative) return {d.negative, d.int_digits};
  return {true, increment(d.int_digits)};
}

Int ceil_of(const Decimal& d) {
  if (d.frac_digits.empty()) return {d.negative, d.int_digits};
  if (d.negative) return {d.int_digits != "0", d.int_digits};
  return {false, increment(d.int_digits)};
}

// ---------------------------------------------------------------------------------------
// Writing GBNF.

using schema_gbnf::cat;  // (text/grammar/json_schema_converter.h)

std::string lit(char d) {
  return fmt::format("\"{}\"", d);
}
std::string lit(const std::string& digits) {
  return "\"" + digits + "\"";
}

// `"d" rest` with d joined to rest's leading literal ("3" "0" is "30").
std::string lead(char d, const std::string& rest) {
  if (rest.size() >= 2 && rest[0] == '"') {
    const size_t close = rest.find('"', 1);
    if (close != std::string::npos && (close + 1 == rest.size() || rest[close + 1] == ' '))
      return "\"" + std::string(1, d) + rest.substr(1);
  }
  return cat({lit(d), rest});
}

std::string digit_class(char lo, char hi) {
  if (lo == hi) return lit(lo);
  if (hi == lo + 1) return fmt::format("[{}{}]", lo, hi);
  return fmt::format("[{}-{}]", lo, hi);
}

// [0-9]{min,max}
std::string any_digits(size_t min, size_t max) {
  if (max == 0) return "";
  if (min == max) return min == 1 ? "[0-9]" : fmt::format("[0-9]{{{}}}", min);
  if (min == 0 && max == 1) return "[0-9]?";
  return fmt::format("[0-9]{{{},{}}}", min, max);
}

// A set of texts: alternatives, and whether the empty text is one.
struct Alts {
  bool eps = false;
  std::vector<std::string> items;  // each non-empty, a sequence at most

  bool none() const { return !eps && items.empty(); }
  // The set as one item of a sequence.
  std::string text() const {
    if (items.empty()) return "";
    std::string s = items[0];
    for (size_t i = 1; i < items.size(); ++i) s += " | " + items[i];
    if (items.size() == 1 && !eps) return s;
    return "(" + s + ")" + (eps ? "?" : "");
  }
};

// Digit strings x..y of one length (x <= y, both that length), from position `pos` on,
// `tight_lo` / `tight_hi` when the digits so far equal x's / y's.
std::string same_length(const std::string& x, const std::string& y, size_t pos, bool tight_lo,
                        bool tight_hi) {
  if (pos == x.size()) return "";
  const char lo = tight_lo ? x[pos] : '0', hi = tight_hi ? y[pos] : '9';
  const size_t rest = x.size() - pos - 1;
  if (lo == hi) return lead(lo, same_length(x, y, pos + 1, tight_lo, tight_hi));
  // After the low digit, any rest when x's rest is all zeros; after the high one, when y's is all
  // nines.
  const bool low_free = !tight_lo || x.find_first_not_of('0', pos + 1) == std::string::npos;
  const bool high_free = !tight_hi || y.find_first_not_of('9', pos + 1) == std::string::npos;
  Alts a;
  if (!low_free) a.items.push_back(lead(lo, same_length(x, y, pos + 1, true, false)));
  const char mid_lo = low_free ? lo : static_cast<char>(lo + 1);
  const char mid_hi = high_free ? hi : static_cast<char>(hi - 1);
  if (mid_lo <= mid_hi)
    a.items.push_back(cat({digit_class(mid_lo, mid_hi), any_digits(rest, rest)}));
  if (!high_free) a.items.push_back(lead(hi, same_length(x, y, pos + 1, false, true)));
  return a.text();
}

bool is_power_of_ten(const std::string& m) {
  return m[0] == '1' && m.find_first_not_of('0', 1) == std::string::npos;
}

// Canonical integer texts (no sign) for the magnitudes [a, b], a <= b.
std::vector<std::string> magnitude_range(std::string a, const std::string& b) {
  std::vector<std::string> alts;
  if (a == "0") {
    alts.push_back("\"0\"");
    if (b == "0") return alts;
    a = "1";
  }
  // Full digit counts (10^(L-1) .. 10^L - 1) in a row become one [1-9] [0-9]{m,n}.
  size_t full_from = 0, full_to = 0;
  auto flush_full = [&] {
    if (full_from == 0) return;
    alts.push_back(cat({"[1-9]", any_digits(full_from - 1, full_to - 1)}));
    full_from = 0;
  };
  for (size_t len = a.size(); len <= b.size(); ++len) {
    std::string x = a;
    if (len != a.size()) x.assign(1, '1').append(len - 1, '0');
    const std::string y = len == b.size() ? b : nines(len);
    if (is_power_of_ten(x) && y == nines(len)) {
      if (full_from == 0) full_from = len;
      full_to = len;
      continue;
    }
    flush_full();
    alts.push_back(same_length(x, y, 0, true, true));
  }
  flush_full();
  return alts;
}

std::string group(const std::vector<std::string>& alts) {
  Alts a;
  a.items = alts;
  return a.text();
}

void check_digits(const Decimal& d) {
  if (d.int_digits.size() > static_cast<size_t>(kMaxBoundDigits) ||
      d.frac_digits.size() > static_cast<size_t>(kMaxBoundDigits))
    throw GrammarError(
        "", fmt::format("the bound {} has more than {} digits on a side of the point", d.str(),
                        kMaxBoundDigits));
}

// ---------------------------------------------------------------------------------------
// Decimal magnitudes between bounds.

struct MagBound {
  std::string int_digits, frac_digits;
  bool exclusive = false;
};

int compare_mag_bound(const MagBound& a, const MagBound& b) {
  const int c = compare_mag(a.int_digits, b.int_digits);
  if (c != 0) return c;
  return a.frac_digits < b.frac_digits ? -1 : a.frac_digits > b.frac_digits ? 1 : 0;
}

class Magnitudes {
 public:
  Magnitudes(size_t int_cap, size_t frac_cap) : int_cap_(int_cap), frac_cap_(frac_cap) {}

  // Texts `int ("." digits)?` whose value is in [lo, hi] (each end inclusive unless
  // exclusive; no hi: up to int_cap integer digits).
  std::optional<std::string> range(const MagBound& lo, const std::optional<MagBound>& hi) {
    if (hi) {
      const int c = compare_mag_bound(lo, *hi);
      if (c > 0 || (c == 0 && (lo.exclusive || hi->exclusive))) return std::nullopt;
    }
    lo_ = &lo;
    hi_ = hi ? &*hi : nullptr;
    std::vector<std::string> alts;
    auto with_fraction = [&](const std::string& int_text, bool tight_lo, bool tight_hi) {
      const Alts f = fraction(tight_lo, tight_hi);
      if (!f.none()) alts.push_back(cat({int_text, f.text()}));
    };
    if (hi && lo.int_digits == hi->int_digits) {
      with_fraction(lit(lo.int_digits), true, true);
    } else {
      with_fraction(lit(lo.int_digits), true, false);
      const std::string mid_lo = increment(lo.int_digits);
      const std::string mid_hi = hi ? decrement(hi->int_digits) : nines(int_cap_);
      if (compare_mag(mid_lo, mid_hi) <= 0)
        alts.push_back(cat({group(magnitude_range(mid_lo, mid_hi)),
                            fmt::format("(\".\" {})?", any_digits(1, frac_cap_))}));
      if (hi) with_fraction(lit(hi->int_digits), false, true);
    }
    if (alts.empty()) return std::nullopt;
    return group(alts);
  }

 private:
  // After the integer part: nothing, or "." and digits, keeping the value within the
  // bounds that are still tight (the integer part equal to theirs).
  Alts fraction(bool tight_lo, bool tight_hi) const {
    const Alts d = digits(0, tight_lo, tight_hi);
    Alts out;
    out.eps = d.eps;
    if (!d.items.empty()) {
      Alts nonempty = d;
      nonempty.eps = false;
      out.items.push_back(cat({"\".\"", nonempty.text()}));
    }
    return out;
  }

  // Fraction digit strings from position `pos` on (any length up to frac_cap_ in all),
  // given that the digits so far equal the lower (tight_lo) / upper (tight_hi) bound's.
  Alts digits(size_t pos, bool tight_lo, bool tight_hi) const {
    const std::string& lf = lo_->frac_digits;
    const std::string hf = hi_ ? hi_->frac_digits : std::string();
    Alts out;
    // Ending here: the value so far is the lower bound's when its digits are used up
    // (equal), below it otherwise; below the upper bound while its digits remain.
    out.eps = (!tight_lo || (pos >= lf.size() && !lo_->exclusive)) &&
              (!tight_hi || pos < hf.size() || !hi_->exclusive);
    if (pos >= frac_cap_) return out;
    const size_t room = frac_cap_ - pos;
    if (!tight_lo && !tight_hi) {
      out.items.push_back(any_digits(1, room));
      return out;
    }
    if (tight_hi &&
        pos >= hf.size()) {  // at the upper bound (so at a tight lower one too): zeros only
      if (out.eps) out.items.push_back(fmt::format("\"0\"{{1,{}}}", room));
      return out;
    }
    if (!tight_hi &&
        pos >= lf.size()) {  // at the lower bound: anything, or a nonzero digit if exclusive
      if (!lo_->exclusive) {
        out.items.push_back(any_digits(1, room));
      } else {
        for (size_t zeros = 0; zeros < room; ++zeros)
          out.items.push_back(cat({zeros == 0   ? ""
                                   : zeros == 1 ? "\"0\""
                                                : fmt::format("\"0\"{{{}}}", zeros),
                                   "[1-9]", any_digits(0, room - zeros - 1)}));
      }
      return out;
    }
    const char lo = tight_lo ? (pos < lf.size() ? lf[pos] : '0') : '0';
    const char hi = tight_hi ? (pos < hf.size() ? hf[pos] : '0') : '9';
    auto then = [&](char first, const Alts& rest) {
      if (!rest.none()) out.items.push_back(lead(first, rest.text()));
    };
    if (lo == hi) {
      then(lo, digits(pos + 1, tight_lo, tight_hi));
      return out;
    }
    const bool low_free = !tight_lo || (pos + 1 >= lf.size() && !lo_->exclusive);
    if (!low_free) then(lo, digits(pos + 1, true, false));
    const char mid_lo = low_free ? lo : static_cast<char>(lo + 1);
    const char mid_hi = tight_hi ? static_cast<char>(hi - 1) : hi;
    if (mid_lo <= mid_hi)
      out.items.push_back(cat({digit_class(mid_lo, mid_hi), any_digits(0, room - 1)}));
    if (tight_hi) then(hi, digits(pos + 1, false, true));
    return out;
  }

  size_t int_cap_, frac_cap_;
  const MagBound* lo_ = nullptr;
  const MagBound* hi_ = nullptr;
};

}  // namespace

std::optional<Decimal> Decimal::parse(std::string_view s) {
  Decimal d;
  size_t p = 0;
  if (p < s.size() && s[p] == '-') d.negative = true, ++p;
  std::string digits;
  const size_t int_begin = p;
  while (p < s.size() && s[p] >= '0' && s[p] <= '9') digits += s[p++];
  if (p == int_begin) return std::nullopt;
  long point = static_cast<long>(digits.size());  // digits before the point
  if (p < s.size() && s[p] == '.') {
    ++p;
    const size_t b = p;
    while (p < s.size() && s[p] >= '0' && s[p] <= '9') digits += s[p++];
    if (p == b) return std::nullopt;
  }
  if (p < s.size() && (s[p] == 'e' || s[p] == 'E')) {
    ++p;
    bool neg = false;
    if (p < s.size() && (s[p] == '+' || s[p] == '-')) neg = s[p] == '-', ++p;
    const size_t b = p;
    long e = 0;
    while (p < s.size() && s[p] >= '0' && s[p] <= '9')
      e = std::min(e * 10 + (s[p++] - '0'), 100000L);
    if (p == b || e > 1000) return std::nullopt;
    point += neg ? -e : e;
  }
  if (p != s.size()) return std::nullopt;
  if (point < 0) digits.insert(0, static_cast<size_t>(-point), '0'), point = 0;
  if (static_cast<size_t>(point) > digits.size())
    digits.append(static_cast<size_t>(point) - digits.size(), '0');
  std::string ip = digits.substr(0, static_cast<size_t>(point));
  std::string fp = digits.substr(static_cast<size_t>(point));
  const size_t nz = ip.find_first_not_of('0');
  d.int_digits = nz == std::string::npos ? "0" : ip.substr(nz);
  const size_t last = fp.find_last_not_of('0');
  d.frac_digits = last == std::string::npos ? "" : fp.substr(0, last + 1);
  if (d.int_digits == "0" && d.frac_digits.empty()) d.negative = false;
  return d;
}

std::string Decimal::str() const {
  return (negative ? "-" : "") + int_digits + (frac_digits.empty() ? "" : "." + frac_digits);
}

int compare(const Decimal& a, const Decimal& b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  const int c =
      compare_mag_bound({a.int_digits, a.frac_digits, false}, {b.int_digits, b.frac_digits, false});
  return a.negative ? -c : c;
}

std::optional<std::string> integer_range_gbnf(const std::optional<NumberBound>& lo,
                                              const std::optional<NumberBound>& hi) {
  std::optional<Int> l, h;
  if (lo)
    check_digits(lo->value), l = lo->exclusive ? plus_one(floor_of(lo->value)) : ceil_of(lo->value);
  if (hi)
    check_digits(hi->value),
        h = hi->exclusive ? minus_one(ceil_of(hi->value)) : floor_of(hi->value);
  if (l && h && compare_int(*l, *h) > 0) return std::nullopt;
  std::vector<std::string> alts;
  if (!l || l->negative) {  // negatives: "-" and magnitudes [max(1, -h), -l]
    const std::string mag_lo = h && h->negative ? h->mag : "1";
    const std::string mag_hi =
        l ? l->mag : nines(std::max<size_t>(kMaxIntegerDigits, mag_lo.size()));
    alts.push_back(cat({"\"-\"", group(magnitude_range(mag_lo, mag_hi))}));
  }
  if (!h || !h->negative) {
    const std::string mag_lo = l && !l->negative ? l->mag : "0";
    const std::string mag_hi =
        h ? h->mag : nines(std::max<size_t>(kMaxIntegerDigits, mag_lo.size()));
    for (std::string& a : magnitude_range(mag_lo, mag_hi)) alts.push_back(std::move(a));
  }
  std::string out = alts[0];
  for (size_t i = 1; i < alts.size(); ++i) out += " | " + alts[i];
  return out;
}

std::optional<std::string> decimal_range_gbnf(const std::optional<NumberBound>& lo,
                                              const std::optional<NumberBound>& hi) {
  if (lo) check_digits(lo->value);
  if (hi) check_digits(hi->value);
  if (lo && hi) {
    const int c = compare(lo->value, hi->value);
    if (c > 0 || (c == 0 && (lo->exclusive || hi->exclusive))) return std::nullopt;
  }
  size_t int_cap = kMaxIntegerDigits, frac_cap = kMaxFractionDigits;
  for (const auto* b : {&lo, &hi}) {
    if (!*b) continue;
    int_cap = std::max(int_cap, (*b)->value.int_digits.size());
    frac_cap = std::max(frac_cap, (*b)->value.frac_digits.size());
  }
  Magnitudes mags(int_cap, frac_cap);
  std::vector<std::string> alts;
  // Negatives: "-" m with m > 0 and -m in the interval, so m in [max(0+, -hi), -lo].
  if (!lo || lo->value.negative) {
    const MagBound m_lo = hi && hi->value.negative
                              ? MagBound{hi->value.int_digits, hi->value.frac_digits, hi->exclusive}
                              : MagBound{"0", "", true};
    std::optional<MagBound> m_hi;
    if (lo) m_hi = MagBound{lo->value.int_digits, lo->value.frac_digits, lo->exclusive};
    if (auto e = mags.range(m_lo, m_hi)) alts.push_back(cat({"\"-\"", *e}));
  }
  // Non-negatives: m in [max(0, lo), hi].
  if (!hi || !hi->value.negative) {
    const MagBound m_lo = lo && !lo->value.negative
                              ? MagBound{lo->value.int_digits, lo->value.frac_digits, lo->exclusive}
                              : MagBound{"0", "", false};
    std::optional<MagBound> m_hi;
    if (hi) m_hi = MagBound{hi->value.int_digits, hi->value.frac_digits, hi->exclusive};
    if (auto e = mags.range(m_lo, m_hi)) alts.push_back(*e);
  }
  if (alts.empty()) return std::nullopt;
  std::string out = alts[0];
  for (size_t i = 1; i < alts.size(); ++i) out += " | " + alts[i];
  return out;
}

}  // namespace hyperion::text
