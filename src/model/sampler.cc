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
#include <cmath>
#include <cstdint>

#include "base/error.h"
#include "model/sampler.h"

namespace hyperion {

HWY_EXPORT(SamplerScanLogits);
HWY_EXPORT(SamplerFindFirst);
HWY_EXPORT(SamplerExpBlocks);

namespace {

constexpr size_t kBlock = 512;  // = kSamplerBlock of every target

size_t num_blocks(size_t n) {
  return (n + kBlock - 1) / kBlock;
}

// The `m` best tokens of x[0, n) (largest logit first, ties to the lower index) into
// cand[0, m), sorted best first. A heap whose top is the worst kept token: scanning in
// index order, a later token only enters with a strictly larger logit, so one compare
// per element against a cached threshold decides almost every element.
void select_top(const float* x, size_t n, size_t m, std::vector<int32_t>& cand) {
  const auto better = [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
  cand.resize(m);
  for (size_t i = 0; i < m; ++i) cand[i] = static_cast<int32_t>(i);
  std::make_heap(cand.begin(), cand.end(), better);
  float threshold = x[cand[0]];
  for (size_t i = m; i < n; ++i) {
    if (x[i] > threshold) {
      std::pop_heap(cand.begin(), cand.end(), better);
      cand.back() = static_cast<int32_t>(i);
      std::push_heap(cand.begin(), cand.end(), better);
      threshold = x[cand[0]];
    }
  }
  std::sort_heap(cand.begin(), cand.end(), better);
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

  blocks_.resize(num_blocks(n));
  // Sum of exp(x - max) over the raw distribution, when a pass already computed it.
  double raw_sum = -1.0;
  const auto block_total = [this](size_t count) {
    double s = 0.0;
    for (size_t b = 0; b < num_blocks(count); ++b) s += blocks_[b];
    return s;
  };

  int32_t token = 0;
  const float temperature = params_.temperature;
  if (temperature == 0.0f) {
    token = static_cast<int32_t>(HWY_DYNAMIC_DISPATCH(SamplerFindFirst)(logits, n, max));
  } else {
    // 1/T clamped so that (x - max) * scale stays finite for tiny temperatures.
    const float scale = static_cast<float>(std::min(1.0 / temperature, 1e30));
    const bool top_k = params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n;
    const bool nucleus = params_.top_p < 1.0f;
    const double u = next_double();

    if (!nucleus) {
      // Draw over the candidates in a flat array, through the block sums: find the
      // block holding u * total, then scan inside it.
      const float* src = logits;
      size_t count = n;
      if (top_k) {
        count = static_cast<size_t>(params_.top_k);
        select_top(logits, n, count, cand_);
        vals_.resize(count);
        for (size_t j = 0; j < count; ++j) vals_[j] = logits[cand_[j]];
        src = vals_.data();
      }
      probs_.resize(count);
      HWY_DYNAMIC_DISPATCH(SamplerExpBlocks)(src, count, max, scale, probs_.data(), blocks_.data());
      const double total = block_total(count);
      if (!top_k && temperature == 1.0f) raw_sum = total;
      const double target = u * total;
      double cum = 0.0;
      size_t pos = count;
      const size_t nb = num_blocks(count);
      for (size_t b = 0; b < nb; ++b) {
        if (blocks_[b] <= 0.0f) continue;
        // The chosen block, or the last non-empty one if rounding leaves cum short.
        pos = b;
        if (cum + blocks_[b] > target) break;
        cum += blocks_[b];
      }
      const size_t begin = pos * kBlock;
      const size_t len = std::min(kBlock, count - begin);
      const size_t j = begin + scan_weights(probs_.data() + begin, len, target, cum);
      token = top_k ? cand_[j] : static_cast<int32_t>(j);
    } else {
      // Nucleus: candidates best first, with probabilities p[j] aligned to cand_.
      // With top_k the K candidates are all there is; otherwise take the top 64, 1024,
      // ... tokens until their mass reaches top_p of the total.
      double total = 0.0;
      size_t cut = 0;
      double cut_mass = 0.0;
      const auto find_cut = [&](const float* p_of, const int32_t* idx, size_t m) {
        const double target = static_cast<double>(params_.top_p) * total;
        double cum = 0.0;
        for (size_t j = 0; j < m; ++j) {
          cum += p_of[idx ? static_cast<size_t>(idx[j]) : j];
          if (cum >= target) {
            cut = j + 1;
            cut_mass = cum;
            return true;
          }
        }
        cut = m;
        cut_mass = cum;
        return false;
      };
      if (top_k) {
        const size_t k = static_cast<size_t>(params_.top_k);
        select_top(logits, n, k, cand_);
        vals_.resize(k);
        for (size_t j = 0; j < k; ++j) vals_[j] = logits[cand_[j]];
        probs_.resize(k);
        HWY_DYNAMIC_DISPATCH(SamplerExpBlocks)
        (vals_.data(), k, max, scale, probs_.data(), blocks_.data());
        total = block_total(k);
        find_cut(probs_.data(), nullptr, k);
        // Weights of the kept prefix, in order, for the draw.
        std::copy(probs_.begin(), probs_.begin() + static_cast<std::ptrdiff_t>(cut), vals_.begin());
      } else {
        probs_.resize(n);
        HWY_DYNAMIC_DISPATCH(SamplerExpBlocks)
        (logits, n, max, scale, probs_.data(), blocks_.data());
        total = block_total(n);
        if (temperature == 1.0f) raw_sum = total;
        for (size_t m = std::min<size_t>(64, n);; m = std::min(m * 16, n)) {
          select_top(logits, n, m, cand_);
          if (find_cut(probs_.data(), cand_.data(), m) || m == n) break;
        }
        vals_.resize(cut);
        for (size_t j = 0; j < cut; ++j) vals_[j] = probs_[cand_[j]];
      }
      token = cand_[scan_weights(vals_.data(), cut, u * cut_mass, 0.0)];
    }
  }

  if (logprob != nullptr) {
    if (raw_sum < 0.0) {
      HWY_DYNAMIC_DISPATCH(SamplerExpBlocks)(logits, n, max, 1.0f, nullptr, blocks_.data());
      raw_sum = block_total(n);
    }
    *logprob = static_cast<float>(static_cast<double>(logits[token]) - max - std::log(raw_sum));
  }
  return token;
}

}  // namespace hyperion
#endif  // HWY_ONCE
