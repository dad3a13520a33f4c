// RoPE with Highway dynamic dispatch. One (b, t) row is the unit of work: its cos/sin
// row (D/2 floats each) is read once from the table and reused for all H heads.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/rope.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include "kernels/simd-inl.h"

#include <cstdint>

#include "kernels/rope.h"
#include "tensor/convert.h"

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {

// Rows [row_begin, row_end) of the flattened [B*T] token axis. The position of row r
// (b = r / T, t = r % T) is pos[b * pos_batch_stride + t] if pos is given, else
// start + t. Backward rotates by -angle, i.e. uses -sin.
template <typename T>
void RotateRows(const T* x, T* out, const float* cos_tab, const float* sin_tab, const int32_t* pos,
                int64_t pos_batch_stride, int64_t start, int64_t seq, int64_t row_begin,
                int64_t row_end, int64_t heads, int64_t d, bool backward) {
  const DF df;
  const int64_t n = static_cast<int64_t>(hn::Lanes(df));
  const int64_t half = d / 2;
  const float sign = backward ? -1.0f : 1.0f;
  const VF vsign = hn::Set(df, sign);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t b = r / seq, t = r % seq;
    const int64_t p = pos != nullptr ? pos[b * pos_batch_stride + t] : start + t;
    const float* c = cos_tab + p * half;
    const float* s = sin_tab + p * half;
    for (int64_t h = 0; h < heads; ++h) {
      const T* xr = x + (r * heads + h) * d;
      T* outr = out + (r * heads + h) * d;
      int64_t i = 0;
      for (; i + n <= half; i += n) {
        const VF vc = hn::LoadU(df, c + i), vs = hn::Mul(hn::LoadU(df, s + i), vsign);
        // Both halves are loaded before either is stored, so out may be x.
        const VF x1 = LoadF(df, xr + i), x2 = LoadF(df, xr + half + i);
        StoreF(df, hn::NegMulAdd(x2, vs, hn::Mul(x1, vc)), outr + i);
        StoreF(df, hn::MulAdd(x1, vs, hn::Mul(x2, vc)), outr + half + i);
      }
      for (; i < half; ++i) {
        const float ci = c[i], si = s[i] * sign;
        const float x1 = ToF32(xr[i]), x2 = ToF32(xr[half + i]);
        outr[i] = FromF32<T>(x1 * ci - x2 * si);
        outr[half + i] = FromF32<T>(x2 * ci + x1 * si);
      }
    }
  }
}

void RotateF32(const float* x, float* out, const float* cos_tab, const float* sin_tab,
               const int32_t* pos, int64_t pos_batch_stride, int64_t start, int64_t seq,
               int64_t row_begin, int64_t row_end, int64_t heads, int64_t d, bool backward) {
  RotateRows(x, out, cos_tab, sin_tab, pos, pos_batch_stride, start, seq, row_begin, row_end, heads,
             d, backward);
}
void RotateBF16(const bf16* x, bf16* out, const float* cos_tab, const float* sin_tab,
                const int32_t* pos, int64_t pos_batch_stride, int64_t start, int64_t seq,
                int64_t row_begin, int64_t row_end, int64_t heads, int64_t d, bool backward) {
  RotateRows(x, out, cos_tab, sin_tab, pos, pos_batch_stride, start, seq, row_begin, row_end, heads,
             d, backward);
}

}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "base/error.h"
#include "base/threads.h"

namespace hyperion {

HWY_EXPORT(RotateF32);
HWY_EXPORT(RotateBF16);

const char* rope_type_name(RopeScaling::Type t) {
  switch (t) {
    case RopeScaling::Type::kNone:
      return "default";
    case RopeScaling::Type::kLinear:
      return "linear";
    case RopeScaling::Type::kLlama3:
      return "llama3";
    case RopeScaling::Type::kYarn:
      return "yarn";
  }
  return "?";
}

bool parse_rope_type(const std::string& name, RopeScaling::Type* out) {
  for (RopeScaling::Type t : {RopeScaling::Type::kNone, RopeScaling::Type::kLinear,
                              RopeScaling::Type::kLlama3, RopeScaling::Type::kYarn})
    if (name == rope_type_name(t)) {
      *out = t;
      return true;
    }
  return false;
}

namespace {

double yarn_mscale(double scale, double m) {
  return scale <= 1.0 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

void check_scaling(const RopeScaling& s) {
  using T = RopeScaling::Type;
  if (s.type == T::kNone) return;
  HYP_CHECK(s.factor >= 1.0 && std::isfinite(s.factor),
            "rope_scaling: factor must be >= 1, got {} (rope_type {})", s.factor,
            rope_type_name(s.type));
  if (s.type == T::kLlama3) {
    HYP_CHECK(s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor,
              "rope_scaling: llama3 needs 0 < low_freq_factor < high_freq_factor, got {} and {}",
              s.low_freq_factor, s.high_freq_factor);
  }
  if (s.type == T::kLlama3 || s.type == T::kYarn)
    HYP_CHECK(s.original_max_positions > 0,
              "rope_scaling: {} needs original_max_position_embeddings > 0, got {}",
              rope_type_name(s.type), s.original_max_positions);
  if (s.type == T::kYarn)
    HYP_CHECK(s.beta_fast > 0 && s.beta_slow > 0 && s.attention_factor >= 0,
              "rope_scaling: yarn needs beta_fast, beta_slow > 0 and attention_factor >= 0");
}

}  // namespace

std::vector<double> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& s) {
  using T = RopeScaling::Type;
  check_scaling(s);
  const int64_t half = head_dim / 2;
  const double d = static_cast<double>(head_dim);
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) f[i] = std::pow(theta, -2.0 * double(i) / d);
  if (s.type == T::kLinear) {
    for (double& v : f) v /= s.factor;
  } else if (s.type == T::kLlama3) {
    const double old_len = static_cast<double>(s.original_max_positions);
    const double low_wavelen = old_len / s.low_freq_factor;
    const double high_wavelen = old_len / s.high_freq_factor;
    for (double& v : f) {
      const double wavelen = 2.0 * M_PI / v;
      if (wavelen < high_wavelen) continue;  // high frequency: kept
      if (wavelen > low_wavelen) {           // low frequency: interpolated
        v /= s.factor;
        continue;
      }
      const double smooth =
          (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      v = (1.0 - smooth) * v / s.factor + smooth * v;
    }
  } else if (s.type == T::kYarn) {
    // The dimension at which a frequency makes `rotations` turns over the trained context.
    const double old_len = static_cast<double>(s.original_max_positions);
    auto correction_dim = [&](double rotations) {
      return d * std::log(old_len / (rotations * 2.0 * M_PI)) / (2.0 * std::log(theta));
    };
    double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
    if (s.truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0);
    high = std::min(high, d - 1.0);
    if (low == high) high += 0.001;  // as the reference: no zero-width ramp
    for (int64_t i = 0; i < half; ++i) {
      const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
      const double extrapolation = 1.0 - ramp;  // weight of the unscaled frequency
      f[i] = f[i] / s.factor * (1.0 - extrapolation) + f[i] * extrapolation;
    }
  }
  return f;
}

double rope_attention_factor(const RopeScaling& s) {
  if (s.type != RopeScaling::Type::kYarn) return 1.0;
  if (s.attention_factor > 0) return s.attention_factor;
  if (s.mscale > 0 && s.mscale_all_dim > 0)
    return yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim);
  return yarn_mscale(s.factor, 1.0);
}

RopeTable::RopeTable(int64_t max_positions_, int64_t head_dim_, double theta_,
                     const RopeScaling& scaling_)
    : max_positions(max_positions_), head_dim(head_dim_), theta(theta_), scaling(scaling_) {
  HYP_CHECK(head_dim > 0 && head_dim % 2 == 0, "RopeTable: head dim D={} must be even and > 0",
            head_dim);
  HYP_CHECK(max_positions > 0, "RopeTable: max_positions must be > 0, got {}", max_positions);
  HYP_CHECK(theta > 0 && std::isfinite(theta), "RopeTable: rope_theta must be > 0, got {}", theta);
  const int64_t half = head_dim / 2;
  inv_freq = rope_inv_freq(head_dim, theta, scaling);
  attention_factor = rope_attention_factor(scaling);
  cos = AlignedBuffer<float>(static_cast<size_t>(max_positions * half));
  sin = AlignedBuffer<float>(static_cast<size_t>(max_positions * half));
  parallel_chunks(max_positions, 64, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      for (int64_t i = 0; i < half; ++i) {
        const double angle = double(p) * inv_freq[i];
        cos[p * half + i] = static_cast<float>(std::cos(angle) * attention_factor);
        sin[p * half + i] = static_cast<float>(std::sin(angle) * attention_factor);
      }
    }
  });
}

std::string RopeTable::key() const {
  const RopeScaling& s = scaling;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%lld/%lld/%a/%d/%a/%a/%a/%lld/%a/%a/%a/%a/%a/%d",
                static_cast<long long>(max_positions), static_cast<long long>(head_dim), theta,
                static_cast<int>(s.type), s.factor, s.low_freq_factor, s.high_freq_factor,
                static_cast<long long>(s.original_max_positions), s.beta_fast, s.beta_slow,
                s.attention_factor, s.mscale, s.mscale_all_dim, s.truncate ? 1 : 0);
  return buf;
}

namespace {

// Token positions of the call: an int32 tensor or a start offset.
struct Positions {
  const int32_t* data = nullptr;  // null: start + t
  int64_t batch_stride = 0;       // 0 for positions [T], T for [B, T]
  int64_t start = 0;
};

void check_activation(const char* op, const char* name, const TensorView& t,
                      const RopeTable& table) {
  check_rank(op, name, t, 4);
  HYP_CHECK(t.dtype == DType::kF32 || t.dtype == DType::kBF16, "{}: {} must be f32 or bf16, got {}",
            op, name, t.str());
  check_contiguous(op, name, t);
  HYP_CHECK(t.shape[3] % 2 == 0, "{}: head dim D={} of {} {} must be even", op, t.shape[3], name,
            t.str());
  HYP_CHECK(t.shape[3] == table.head_dim, "{}: {} {} has head dim {} but the RopeTable has {}", op,
            name, t.str(), t.shape[3], table.head_dim);
}

void check_pair(const char* op, const TensorView& in, const char* in_name, const TensorView& out,
                const char* out_name, const RopeTable& table) {
  check_activation(op, in_name, in, table);
  check_contiguous(op, out_name, out);
  HYP_CHECK(out.shape == in.shape && out.dtype == in.dtype, "{}: {} {} must match {} {}", op,
            out_name, out.str(), in_name, in.str());
}

Positions check_positions(const char* op, const TensorView& x, const TensorView& positions,
                          const RopeTable& table) {
  const int64_t batch = x.shape[0], seq = x.shape[1];
  positions.check_dtype(DType::kI32, op);
  check_contiguous(op, "positions", positions);
  Positions p;
  p.data = positions.as<int32_t>();
  if (positions.rank() == 1 && positions.shape[0] == seq) {
    p.batch_stride = 0;
  } else if (positions.rank() == 2 && positions.shape[0] == batch && positions.shape[1] == seq) {
    p.batch_stride = seq;
  } else {
    fail("{}: positions {} must be [T] or [B, T] for x {}", op, positions.str(), x.str());
  }
  for (int64_t i = 0; i < positions.numel(); ++i) {
    HYP_CHECK(p.data[i] >= 0 && p.data[i] < table.max_positions,
              "{}: position {} (index {}) is outside the RopeTable range [0, {})", op, p.data[i], i,
              table.max_positions);
  }
  return p;
}

Positions check_start(const char* op, const TensorView& x, int64_t start, const RopeTable& table) {
  HYP_CHECK(start >= 0 && start + x.shape[1] <= table.max_positions,
            "{}: positions [{}, {}) for x {} are outside the RopeTable range [0, {})", op, start,
            start + x.shape[1], x.str(), table.max_positions);
  Positions p;
  p.start = start;
  return p;
}

void rotate(const TensorView& in, const TensorView& out, const Positions& p, const RopeTable& table,
            bool backward) {
  const int64_t batch = in.shape[0], seq = in.shape[1], heads = in.shape[2], d = in.shape[3];
  const int64_t rows = batch * seq;
  if (rows == 0 || heads == 0) return;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(heads * d, 1));
  parallel_chunks(rows, grain, [&](int64_t begin, int64_t end) {
    if (in.dtype == DType::kF32) {
      HWY_DYNAMIC_DISPATCH(RotateF32)
      (in.as<float>(), out.as<float>(), table.cos.data(), table.sin.data(), p.data, p.batch_stride,
       p.start, seq, begin, end, heads, d, backward);
    } else {
      HWY_DYNAMIC_DISPATCH(RotateBF16)
      (in.as<bf16>(), out.as<bf16>(), table.cos.data(), table.sin.data(), p.data, p.batch_stride,
       p.start, seq, begin, end, heads, d, backward);
    }
  });
}

void rotate_ref(const TensorView& in, const TensorView& out, const Positions& p,
                const RopeTable& table, bool backward) {
  const int64_t batch = in.shape[0], seq = in.shape[1], heads = in.shape[2], d = in.shape[3];
  const int64_t half = d / 2;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      const double pos = p.data != nullptr ? p.data[b * p.batch_stride + t] : p.start + t;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = ((b * seq + t) * heads + h) * d;
        for (int64_t i = 0; i < half; ++i) {
          const double angle = pos * table.inv_freq[static_cast<size_t>(i)];
          const double af = table.attention_factor;
          const double c = std::cos(angle) * af;
          const double s = (backward ? -std::sin(angle) : std::sin(angle)) * af;
          const double x1 = load_as_f32(in.data, in.dtype, static_cast<size_t>(base + i));
          const double x2 = load_as_f32(in.data, in.dtype, static_cast<size_t>(base + half + i));
          const double o1 = x1 * c - x2 * s, o2 = x2 * c + x1 * s;
          if (out.dtype == DType::kF32) {
            out.as<float>()[base + i] = static_cast<float>(o1);
            out.as<float>()[base + half + i] = static_cast<float>(o2);
          } else {
            out.as<bf16>()[base + i] = f32_to_bf16(static_cast<float>(o1));
            out.as<bf16>()[base + half + i] = f32_to_bf16(static_cast<float>(o2));
          }
        }
      }
    }
  }
}

}  // namespace

void rope_forward(const TensorView& x, const TensorView& out, const TensorView& positions,
                  const RopeTable& table) {
  check_pair("rope_forward", x, "x", out, "out", table);
  rotate(x, out, check_positions("rope_forward", x, positions, table), table, false);
}

void rope_forward(const TensorView& x, const TensorView& out, int64_t start_pos,
                  const RopeTable& table) {
  check_pair("rope_forward", x, "x", out, "out", table);
  rotate(x, out, check_start("rope_forward", x, start_pos, table), table, false);
}

void rope_backward(const TensorView& dy, const TensorView& dx, const TensorView& positions,
                   const RopeTable& table) {
  check_pair("rope_backward", dy, "dy", dx, "dx", table);
  rotate(dy, dx, check_positions("rope_backward", dy, positions, table), table, true);
}

void rope_backward(const TensorView& dy, const TensorView& dx, int64_t start_pos,
                   const RopeTable& table) {
  check_pair("rope_backward", dy, "dy", dx, "dx", table);
  rotate(dy, dx, check_start("rope_backward", dy, start_pos, table), table, true);
}

namespace ref {

void rope_forward(const TensorView& x, const TensorView& out, const TensorView& positions,
                  const RopeTable& table) {
  check_pair("rope_forward", x, "x", out, "out", table);
  rotate_ref(x, out, check_positions("rope_forward", x, positions, table), table, false);
}

void rope_backward(const TensorView& dy, const TensorView& dx, const TensorView& positions,
                   const RopeTable& table) {
  check_pair("rope_backward", dy, "dy", dx, "dx", table);
  rotate_ref(dy, dx, check_positions("rope_backward", dy, positions, table), table, true);
}

}  // namespace ref
}  // namespace hyperion
#endif  // HWY_ONCE
