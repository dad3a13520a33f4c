#include "text/grammar/code_points.h"

#include <algorithm>

namespace hyperion::text {

Ranges without_surrogates(const Ranges& r) {
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (hi < 0xD800 || lo > 0xDFFF) {
      out.emplace_back(lo, hi);
      continue;
    }
    if (lo < 0xD800) out.emplace_back(lo, 0xD7FF);
    if (hi > 0xDFFF) out.emplace_back(0xE000, hi);
  }
  return out;
}

Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1)
      out.back().second = std::max(out.back().second, hi);
    else
      out.emplace_back(lo, hi);
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : r) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return without_surrogates(out);
}

Ranges intersect(const Ranges& a, const Ranges& b) {
  Ranges out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const uint32_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (lo <= hi) out.emplace_back(lo, hi);
    (a[i].second < b[j].second ? i : j)++;
  }
  return out;
}

bool contains(const Ranges& r, uint32_t c) {
  return std::any_of(r.begin(), r.end(),
                     [c](const auto& p) { return p.first <= c && c <= p.second; });
}

}  // namespace hyperion::text
