// Token sampler: SIMD passes (Highway dynamic dispatch) over the logits for the max and
// validity check, the argmax search and the exp / block sums; the selection of top-k or
// nucleus candidates is a scalar heap pass that rarely touches the heap.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/sampler.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include "kernels/simd-inl.h"

#include <cstddef>
#include <limits>

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {

// Elements per block sum: a multiple of every target's lane count, small enough that
// the scan inside the chosen block is short, large enough that the block array is tiny.
constexpr size_t kSamplerBlock = 512;

// Max of x[0, n) into *max_out; false (max not set) if any element is NaN or +inf.
bool SamplerScanLogits(const float* x, size_t n, float* max_out) {
  const DF d;
  const size_t l = hn::Lanes(d);
  const float inf = std::numeric_limits<float>::infinity();
  const VF vinf = hn::Set(d, inf);
  VF m0 = hn::Set(d, -inf), m1 = m0;
  size_t i = 0;
  for (; i + 2 * l <= n; i += 2 * l) {
    const VF a = hn::LoadU(d, x + i);
    const VF b = hn::LoadU(d, x + i + l);
    // x < inf is false for NaN and +inf.
    if (!hn::AllTrue(d, hn::And(hn::Lt(a, vinf), hn::Lt(b, vinf)))) return false;
    m0 = hn::Max(m0, a);
    m1 = hn::Max(m1, b);
  }
  for (; i + l <= n; i += l) {
    const VF a = hn::LoadU(d, x + i);
    if (!hn::AllTrue(d, hn::Lt(a, vinf))) return false;
    m0 = hn::Max(m0, a);
  }
  if (i < n) {
    const VF a = LoadTail(d, x + i, n - i, -inf);
    if (!hn::AllTrue(d, hn::Lt(a, vinf))) return false;
    m0 = hn::Max(m0, a);
  }
  *max_out = hn::GetLane(hn::MaxOfLanes(d, hn::Max(m0, m1)));
  return true;
}

// Index of the first element equal to `value`, or n.
size_t SamplerFindFirst(const float* x, size_t n, float value) {
  const DF d;
  const size_t l = hn::Lanes(d);
  const VF v = hn::Set(d, value);
  size_t i = 0;
  for (; i + l <= n; i += l) {
    const intptr_t pos = hn::FindFirstTrue(d, hn::Eq(hn::LoadU(d, x + i), v));
    if (pos >= 0) return i + static_cast<size_t>(pos);
  }
  for (; i < n; ++i) {
    if (x[i] == value) return i;
  }
  return n;
}

// Index of the first element of x[begin, n) greater than `threshold`, or n.
size_t SamplerFindGreater(const float* x, size_t begin, size_t n, float threshold) {
  const DF d;
  const size_t l = hn::Lanes(d);
  const VF t = hn::Set(d, threshold);
  size_t i = begin;
  for (; i + l <= n; i += l) {
    const intptr_t pos = hn::FindFirstTrue(d, hn::Gt(hn::LoadU(d, x + i), t));
    if (pos >= 0) return i + static_cast<size_t>(pos);
  }
  for (; i < n; ++i) {
    if (x[i] > threshold) return i;
  }
  return n;
}

// e_i = exp((x_i - max) * scale) for i < n, stored to out unless it is null; the sum of
// each kSamplerBlock elements goes to blocks[i / kSamplerBlock].
void SamplerExpBlocks(const float* x, size_t n, float max, float scale, float* out, float* blocks) {
  const DF d;
  const size_t l = hn::Lanes(d);
  const VF vmax = hn::Set(d, max);
  const VF vscale = hn::Set(d, scale);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (size_t b0 = 0, blk = 0; b0 < n; b0 += kSamplerBlock, ++blk) {
    const size_t end = b0 + kSamplerBlock < n ? b0 + kSamplerBlock : n;
    VF s0 = hn::Zero(d), s1 = hn::Zero(d);
    size_t i = b0;
    for (; i + 2 * l <= end; i += 2 * l) {
      const VF e0 = FastExp(d, hn::Mul(hn::Sub(hn::LoadU(d, x + i), vmax), vscale));
      const VF e1 = FastExp(d, hn::Mul(hn::Sub(hn::LoadU(d, x + i + l), vmax), vscale));
      if (out != nullptr) {
        hn::StoreU(e0, d, out + i);
        hn::StoreU(e1, d, out + i + l);
      }
      s0 = hn::Add(s0, e0);
      s1 = hn::Add(s1, e1);
    }
    for (; i + l <= end; i += l) {
      const VF e0 = FastExp(d, hn::Mul(hn::Sub(hn::LoadU(d, x + i), vmax), vscale));
      if (out != nullptr) hn::StoreU(e0, d, out + i);
      s0 = hn::Add(s0, e0);
    }
    if (i < end) {
      const VF e0 =
          FastExp(d, hn::Mul(hn::Sub(LoadTail(d, x + i, end - i, neg_inf), vmax), vscale));
      if (out != nullptr) StoreTail(d, e0, out + i, end - i);
      s0 = hn::Add(s0, e0);
    }
    blocks[blk] = hn::GetLane(hn::SumOfLanes(d, hn::Add(s0, s1)));
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "base/error.h"
#include "model/sampler.h"

namespace hyperion {

HWY_EXPORT(SamplerScanLogits);
HWY_EXPORT(SamplerFindFirst);
HWY_EXPORT(SamplerFindGreater);
HWY_EXPORT(SamplerExpBlocks);

namespace {

constexpr size_t kBlock = 512;  // = kSamplerBlock of every target

size_t num_blocks(size_t n) {
  return (n + kBlock - 1) / kBlock;
}

template <typename T>
void grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// The `m` best tokens of x[0, n) (largest value first, ties to the lower index) into
// cand[0, m) (cand has room for n), sorted best first if `sorted`. For m small against
// n: a heap whose top is the worst kept token; scanning in index order, a later token
// only enters with a strictly larger value, so a SIMD search for the next value above
// the heap's worst skips almost every element. For large m: nth_element on all indices.
void select_top(const float* x, size_t n, size_t m, bool sorted, int32_t* cand) {
  const auto better = [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
  if (m * 8 > n) {
    for (size_t i = 0; i < n; ++i) cand[i] = static_cast<int32_t>(i);
    if (m < n) std::nth_element(cand, cand + m, cand + n, better);
    if (sorted) std::sort(cand, cand + m, better);
    return;
  }
  for (size_t i = 0; i < m; ++i) cand[i] = static_cast<int32_t>(i);
  std::make_heap(cand, cand + m, better);
  const auto find_greater = HWY_DYNAMIC_DISPATCH(SamplerFindGreater);
  for (size_t i = find_greater(x, m, n, x[cand[0]]); i < n;
       i = find_greater(x, i + 1, n, x[cand[0]])) {
    std::pop_heap(cand, cand + m, better);
    cand[m - 1] = static_cast<int32_t>(i);
    std::push_heap(cand, cand + m, better);
  }
  if (sorted) std::sort_heap(cand, cand + m, better);
}

// Nucleus candidates as one integer key each: the bits of p >= 0 (ordered like the
// values) above the complemented token id, so a larger key is a better token (higher
// probability, then lower index) and comparisons are single integer compares.
uint64_t nucleus_key(float p, size_t token) {
  uint32_t bits;
  std::memcpy(&bits, &p, sizeof(bits));
  return (static_cast<uint64_t>(bits) << 32) | (0xffffffffu - static_cast<uint32_t>(token));
}
float key_prob(uint64_t key) {
  const auto bits = static_cast<uint32_t>(key >> 32);
  float p;
  std::memcpy(&p, &bits, sizeof(p));
  return p;
}
int32_t key_token(uint64_t key) {
  return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(key));
}

// Nucleus over all tokens: the smallest set of the most probable tokens whose mass
// reaches `target`. A weighted quickselect: partition around a pivot, keep the better
// side whole when it does not reach the target, recurse into it when it does; O(n)
// expected, no sort. The set is keys[0, returned count), in no particular order.
size_t nucleus_select(uint64_t* a, size_t count, double target) {
  size_t lo = 0, hi = count;
  double need = target;
  while (lo < hi) {
    // Median of three as the pivot, moved to hi - 1.
    const size_t mid = lo + (hi - lo) / 2;
    if (a[mid] > a[lo]) std::swap(a[mid], a[lo]);
    if (a[hi - 1] > a[lo]) std::swap(a[hi - 1], a[lo]);
    if (a[mid] > a[hi - 1]) std::swap(a[mid], a[hi - 1]);
    const uint64_t pivot = a[hi - 1];
    uint64_t* split = std::partition(a + lo, a + hi - 1, [pivot](uint64_t k) { return k > pivot; });
    const auto s = static_cast<size_t>(split - a);
    double mass = 0.0;
    for (size_t j = lo; j < s; ++j) mass += key_prob(a[j]);
    if (mass >= need) {
      hi = s;  // the cut lies among the better ones; the rest is dropped
      continue;
    }
    std::swap(a[s], a[hi - 1]);  // pivot right after the better ones
    const double with_pivot = mass + key_prob(pivot);
    if (with_pivot >= need) return s + 1;
    need -= with_pivot;
    lo = s + 1;
  }
  return lo;  // rounding left the target just out of reach: everything up to here
}

// Position of the first positive weight whose running sum exceeds `target`; the last
// positive weight if rounding leaves the sum short of it (never a zero-weight token).
size_t scan_weights(const float* w, size_t count, double target, double cum) {
  size_t last = count;
  for (size_t j = 0; j < count; ++j) {
    if (w[j] > 0.0f) {
      cum += w[j];
      last = j;
      if (cum > target) return j;
    }
  }
  return last;
}

}  // namespace

void validate(const SamplingParams& p) {
  HYP_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.0f,
            "sampling: temperature must be finite and >= 0, got {}", p.temperature);
  HYP_CHECK(p.top_k >= 0, "sampling: top_k must be >= 0 (0 = off), got {}", p.top_k);
  HYP_CHECK(p.top_p > 0.0f && p.top_p <= 1.0f, "sampling: top_p must be in (0, 1], got {}",
            p.top_p);
}

// The checks run on the number as sent (a double), and refuse what the sampler's f32 would
// turn into another setting: a temperature of 1e-300 is not 0 (greedy), a top_p of 1e-300
// is not 0 (invalid); the message prints the number as sent.
std::string temperature_error(double t) {
  if (!(t >= 0.0 && t <= 2.0)) return fmt::format("must be in [0, 2], got {}", t);
  if (t > 0.0 && static_cast<float>(t) == 0.0f)
    return fmt::format("must be 0 (greedy) or at least {}, got {}",
                       std::numeric_limits<float>::denorm_min(), t);
  return "";
}

std::string top_k_error(int64_t k) {
  return k >= -1 && k <= INT32_MAX ? ""
                                   : fmt::format("must be -1 or 0 (off) or a count >= 1, got {}", k);
}

std::string top_p_error(double p) {
  if (!(p > 0.0 && p <= 1.0)) return fmt::format("must be in (0, 1], got {}", p);
  if (static_cast<float>(p) == 0.0f)
    return fmt::format("must be in (0, 1] and at least {}, got {}",
                       std::numeric_limits<float>::denorm_min(), p);
  return "";
}

Sampler::Sampler(const SamplingParams& p) : params_(p), state_(p.seed) {
  validate(p);
}

uint64_t Sampler::next_u64() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double Sampler::next_double() {
  return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
}

int32_t Sampler::sample(const float* logits, int64_t vocab, float* logprob) {
  HYP_CHECK(logits != nullptr, "sampler: logits is null (vocab {})", vocab);
  HYP_CHECK(vocab > 0 && vocab <= std::numeric_limits<int32_t>::max(),
            "sampler: vocab must be in [1, 2^31), got {}", vocab);
  const size_t n = static_cast<size_t>(vocab);

  float max = 0.0f;
  if (!HWY_DYNAMIC_DISPATCH(SamplerScanLogits)(logits, n, &max)) {
    size_t bad = 0;
    while (bad < n && logits[bad] < std::numeric_limits<float>::infinity()) ++bad;
    fail("sampler: logits[{}] is {} (vocab {}); logits must be finite or -inf", bad, logits[bad],
         vocab);
  }
  HYP_CHECK(max > -std::numeric_limits<float>::infinity(),
            "sampler: all {} logits are -inf, no token can be sampled", vocab);
  // Scratch for the largest case (all tokens as candidates); grows only, without
  // value-initialising on every call as a resize after a shrink would.
  grow(probs_, n);
  grow(vals_, n);
  grow(cand_, n);
  grow(blocks_, num_blocks(n));

  // Sum of exp(x - max) over the raw distribution, if the draw computed it on the way.
  double raw_sum = -1.0;
  int32_t token = 0;
  if (params_.temperature == 0.0f) {
    token = static_cast<int32_t>(HWY_DYNAMIC_DISPATCH(SamplerFindFirst)(logits, n, max));
  } else {
    const double u = next_double();
    token = params_.top_p < 1.0f ? draw_nucleus(logits, n, max, u, &raw_sum)
                                 : draw_all(logits, n, max, u, &raw_sum);
  }
  if (logprob != nullptr) {
    if (raw_sum < 0.0) raw_sum = exp_blocks(logits, n, max, 1.0f, nullptr);
    *logprob = static_cast<float>(static_cast<double>(logits[token]) - max - std::log(raw_sum));
  }
  return token;
}

float Sampler::logprob(const float* logits, int64_t vocab, int32_t token) {
  HYP_CHECK(token >= 0 && token < vocab, "sampler: logprob of token {} outside the vocabulary [0, {})",
            token, vocab);
  const size_t n = static_cast<size_t>(vocab);
  float max = 0.0f;
  HYP_CHECK(HWY_DYNAMIC_DISPATCH(SamplerScanLogits)(logits, n, &max),
            "sampler: logits hold a NaN or +inf (vocab {})", vocab);
  grow(blocks_, num_blocks(n));
  const double sum = exp_blocks(logits, n, max, 1.0f, nullptr);
  return static_cast<float>(static_cast<double>(logits[token]) - max - std::log(sum));
}

float Sampler::scale() const {
  // 1/T, clamped so that (x - max) * scale stays finite for tiny temperatures.
  return static_cast<float>(std::min(1.0 / params_.temperature, 1e30));
}

size_t Sampler::top_k(size_t n) const {
  const auto k = static_cast<size_t>(params_.top_k);
  return k > 0 && k < n ? k : n;
}

double Sampler::exp_blocks(const float* x, size_t n, float max, float scale, float* out) {
  HWY_DYNAMIC_DISPATCH(SamplerExpBlocks)(x, n, max, scale, out, blocks_.data());
  double total = 0.0;
  for (size_t b = 0; b < num_blocks(n); ++b) total += blocks_[b];
  return total;
}

// No nucleus: all tokens (or the top k, in heap order) in a flat array, drawn through
// the block sums: find the block holding u * total, then scan inside it.
int32_t Sampler::draw_all(const float* logits, size_t n, float max, double u, double* raw_sum) {
  const size_t count = top_k(n);
  const float* x = logits;
  if (count < n) {
    select_top(logits, n, count, /*sorted=*/false, cand_.data());
    for (size_t j = 0; j < count; ++j) vals_[j] = logits[cand_[j]];
    x = vals_.data();
  }
  const double total = exp_blocks(x, count, max, scale(), probs_.data());
  if (count == n && params_.temperature == 1.0f) *raw_sum = total;

  const double target = u * total;
  double cum = 0.0;
  size_t block = 0;
  for (size_t b = 0; b < num_blocks(count); ++b) {
    if (blocks_[b] <= 0.0f) continue;
    block = b;  // the chosen block, or the last non-empty one if rounding leaves cum short
    if (cum + blocks_[b] > target) break;
    cum += blocks_[b];
  }
  const size_t begin = block * kBlock;
  const size_t len = std::min(kBlock, count - begin);
  const size_t j = begin + scan_weights(probs_.data() + begin, len, target, cum);
  return count < n ? cand_[j] : static_cast<int32_t>(j);
}

// Nucleus over all n tokens of probs_ when the top 64 do not reach `target`: the
// candidates go to cand_ / vals_[0, returned count), in no particular order.
// One pass sums the probabilities into buckets of 1/16 octave (the float's exponent and
// top 4 mantissa bits, monotone in p); the buckets from the top find the boundary
// bucket; a branchless pass keeps every token above it and collects the boundary
// bucket's tokens, whose best prefix a weighted quickselect picks.
size_t Sampler::nucleus_all(size_t n, double target) {
  constexpr uint32_t kShift = 19;
  constexpr uint32_t kBuckets = 2048;  // p <= 1 (~1 + ulp) gives buckets <= 2032
  const auto bucket = [](float p) {
    uint32_t bits;
    std::memcpy(&bits, &p, sizeof(bits));
    return std::min(bits >> kShift, kBuckets - 1);
  };
  std::array<double, kBuckets> hist{};
  const float* p = probs_.data();
  for (size_t i = 0; i < n; ++i) hist[bucket(p[i])] += p[i];

  // Boundary bucket: the mass of the buckets above it is < target, with it >= target.
  // If rounding leaves the target out of reach, everything down to bucket 1 is kept
  // and bucket 0 (p == 0 or denormal) is the boundary.
  uint32_t boundary = 0;
  double above = 0.0;
  for (uint32_t b = kBuckets; b-- > 1;) {
    if (above + hist[b] >= target) {
      boundary = b;
      break;
    }
    above += hist[b];
  }

  grow(keys_, n);
  size_t kept = 0, edge = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = bucket(p[i]);
    cand_[kept] = static_cast<int32_t>(i);
    vals_[kept] = p[i];
    kept += b > boundary ? 1 : 0;
    keys_[edge] = nucleus_key(p[i], i);
    edge += b == boundary ? 1 : 0;
  }
  const size_t take = nucleus_select(keys_.data(), edge, target - above);
  for (size_t j = 0; j < take; ++j) {
    cand_[kept] = key_token(keys_[j]);
    vals_[kept] = key_prob(keys_[j]);
    ++kept;
  }
  return kept;
}

// Nucleus: the smallest set of most probable tokens (within the top k if set) whose
// mass reaches top_p of the total, then a draw over that set.
int32_t Sampler::draw_nucleus(const float* logits, size_t n, float max, double u, double* raw_sum) {
  const double top_p = params_.top_p;
  const size_t k = top_k(n);
  // Prefix of `m` weights (in candidate order) reaching `target`: its length, or 0.
  const auto prefix = [](const float* w, size_t m, double target) -> size_t {
    double cum = 0.0;
    for (size_t j = 0; j < m; ++j) {
      cum += w[j];
      if (cum >= target) return j + 1;
    }
    return 0;
  };
  size_t cut = 0;
  if (k < n) {
    // Top k sorted best first: their exps are already in probability order.
    select_top(logits, n, k, /*sorted=*/true, cand_.data());
    for (size_t j = 0; j < k; ++j) vals_[j] = logits[cand_[j]];
    const double total = exp_blocks(vals_.data(), k, max, scale(), probs_.data());
    cut = prefix(probs_.data(), k, top_p * total);
    if (cut == 0) cut = k;  // rounding: keep all
    std::copy(probs_.begin(), probs_.begin() + static_cast<std::ptrdiff_t>(cut), vals_.begin());
  } else {
    const double total = exp_blocks(logits, n, max, scale(), probs_.data());
    if (params_.temperature == 1.0f) *raw_sum = total;
    // Usually the nucleus is small: try the 64 most probable tokens first.
    const size_t m = std::min<size_t>(64, n);
    select_top(probs_.data(), n, m, /*sorted=*/true, cand_.data());
    for (size_t j = 0; j < m; ++j) vals_[j] = probs_[cand_[j]];
    cut = prefix(vals_.data(), m, top_p * total);
    if (cut == 0 && m == n) cut = n;  // rounding: keep all
    if (cut == 0) cut = nucleus_all(n, top_p * total);
  }
  double mass = 0.0;
  for (size_t j = 0; j < cut; ++j) mass += vals_[j];
  return cand_[scan_weights(vals_.data(), cut, u * mass, 0.0)];
}

}  // namespace hyperion
#endif  // HWY_ONCE
