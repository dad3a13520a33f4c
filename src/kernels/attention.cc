// Attention: argument checks, tile packing, per-thread scratch and the naive scalar
// references. The tiled kernels are in attention_forward.cc / attention_backward.cc, the
// tile arithmetic in attention_tiles.cc.
#include "kernels/attention.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "base/aligned.h"
#include "base/error.h"
#include "kernels/attention_tiles.h"
#include "kernels/softcap.h"
#include "tensor/convert.h"

namespace hyperion {
namespace attn {
namespace {

void check_activation(const char* op, const char* name, const TensorView& t, int rank) {
  check_rank(op, name, t, rank);
  HYP_CHECK(t.dtype == DType::kF32 || t.dtype == DType::kBF16, "{}: {} must be f32 or bf16, got {}",
            op, name, t.str());
  check_contiguous(op, name, t);
}

}  // namespace

Dims check_forward(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& out, const TensorView& lse, const AttentionParams& params) {
  check_activation(op, "q", q, 4);
  check_activation(op, "k", k, 4);
  check_activation(op, "v", v, 4);
  check_activation(op, "out", out, 4);
  Dims s;
  s.b = q.shape[0];
  s.tq = q.shape[1];
  s.hq = q.shape[2];
  s.d = q.shape[3];
  s.tk = k.shape[1];
  s.hkv = k.shape[2];
  HYP_CHECK(k.shape[0] == s.b && k.shape[3] == s.d,
            "{}: q {} and k {} disagree on the batch or head size (expect [B, T, H, D])", op,
            q.str(), k.str());
  HYP_CHECK(v.shape == k.shape, "{}: k {} and v {} must have the same shape", op, k.str(), v.str());
  HYP_CHECK(out.shape == q.shape, "{}: out {} must have the shape of q {}", op, out.str(), q.str());
  HYP_CHECK(s.hkv > 0 && s.hq % s.hkv == 0,
            "{}: q heads must be a multiple of kv heads, got q {} and k {}", op, q.str(), k.str());
  HYP_CHECK(s.d > 0, "{}: head size must be positive, got q {}", op, q.str());
  check_rank(op, "lse", lse, 3);
  HYP_CHECK(lse.dtype == DType::kF32 && lse.shape == Shape({s.b, s.hq, s.tq}),
            "{}: lse {} must be f32[{}, {}, {}] ([B, Hq, Tq]) for q {}", op, lse.str(), s.b, s.hq,
            s.tq, q.str());
  check_contiguous(op, "lse", lse);
  HYP_CHECK(s.tk > 0 || s.tq == 0, "{}: queries q {} but no keys k {}", op, q.str(), k.str());
  HYP_CHECK(!params.causal || s.tq <= s.tk,
            "{}: causal attention needs Tq <= Tk (queries are the last Tq positions), got q {} "
            "and k {}",
            op, q.str(), k.str());
  if (params.scale == 0.0f) {
    s.scale = static_cast<float>(1.0 / std::sqrt(double(s.d)));
  } else {
    HYP_CHECK(std::isfinite(params.scale) && params.scale > 0.0f,
              "{}: scale must be finite and positive, got {}", op, params.scale);
    s.scale = params.scale;
  }
  s.dp = static_cast<int64_t>(round_up16(static_cast<size_t>(s.d)));
  s.group = s.hq / s.hkv;
  s.offset = s.tk - s.tq;
  s.nqb = (s.tq + kBq - 1) / kBq;
  s.nkb = (s.tk + kBk - 1) / kBk;
  s.causal = params.causal;
  HYP_CHECK(params.window >= 0 && (params.window == 0 || params.causal),
            "{}: a sliding window needs causal attention and a size >= 1, got {}", op,
            params.window);
  // A window covering every key is no window.
  s.window = params.window > 0 && params.window < s.tk ? params.window : 0;
  HYP_CHECK(params.softcap == 0.0f || (std::isfinite(params.softcap) && params.softcap > 0.0f),
            "{}: softcap must be 0 (off) or finite and > 0, got {}", op, params.softcap);
  s.softcap = params.softcap;
  return s;
}

Dims check_backward(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& out, const TensorView& dout, const TensorView& lse,
                    const TensorView& dq, const TensorView& dk, const TensorView& dv,
                    const AttentionParams& params) {
  Dims s = check_forward(op, q, k, v, out, lse, params);
  check_activation(op, "dout", dout, 4);
  check_activation(op, "dq", dq, 4);
  check_activation(op, "dk", dk, 4);
  check_activation(op, "dv", dv, 4);
  HYP_CHECK(dout.shape == q.shape && dq.shape == q.shape,
            "{}: dout {} and dq {} must have the shape of q {}", op, dout.str(), dq.str(), q.str());
  HYP_CHECK(dk.shape == k.shape && dv.shape == k.shape,
            "{}: dk {} and dv {} must have the shape of k {}", op, dk.str(), dv.str(), k.str());
  return s;
}

int64_t Dims::key_blocks(int64_t qb) const {
  if (!causal) return nkb;
  const int64_t q_last = std::min(tq, (qb + 1) * kBq) - 1 + offset;  // latest position
  return std::min(nkb, q_last / kBk + 1);
}

int64_t Dims::first_key_block(int64_t qb) const {
  if (window == 0) return 0;
  // The oldest key the block's first query sees.
  return std::max<int64_t>(0, qb * kBq + offset - window + 1) / kBk;
}

int64_t Dims::first_query_block(int64_t kb) const {
  if (!causal) return 0;
  return std::max<int64_t>(0, kb * kBk - offset) / kBq;
}

int64_t Dims::end_query_block(int64_t kb) const {
  if (window == 0) return nqb;
  // The latest query that sees the block's last key.
  const int64_t q_last = std::min(tk, (kb + 1) * kBk) - 1 + window - 1 - offset;
  if (q_last < 0) return 0;
  return std::min(nqb, q_last / kBq + 1);
}

BlockMask block_mask(const Dims& s, int64_t q0, int64_t k0, int kn) {
  BlockMask m;
  m.diag = q0 + s.offset - k0;
  // Needed when the block's last key lies after its first query.
  m.active = s.causal && int64_t(kn) - 1 > m.diag;
  if (s.window > 0) {
    m.window_diag = m.diag - s.window;
    // Needed when the block's first key is older than the window of its last query.
    m.windowed = -(kBq - 1) <= m.window_diag;
  }
  return m;
}

const TileOps& window_ops(const TileOps& ops, const BlockMask& mask) {
  return mask.windowed ? portable_tile_ops() : ops;
}

void scores_gemm(const TileOps& ops, int kn, int64_t d, const float* a, int64_t lda,
                 const float* bt, float* st, const BlockMask& mask) {
  const int k = static_cast<int>(d);
  if (!mask.active) return ops.gemm(kn, kBq, k, a, lda, true, bt, kBq, st, kBq, false, {});
  for (int j0 = 0; j0 < kn; j0 += 16) {
    const int64_t first = std::max<int64_t>(0, j0 - mask.diag) / 16 * 16;  // query vector
    if (first >= kBq) break;  // these keys (and all later ones) see no query of the block
    ops.gemm(std::min(16, kn - j0), static_cast<int>(kBq - first), k, a + j0 * lda, lda, true,
             bt + first, kBq, st + j0 * kBq + first, kBq, false, {});
  }
}

void cap_scores(const Dims& s, float* st, int kn, float* dcap) {
  if (s.softcap <= 0.0f) return;
  softcap_scaled(st, int64_t(kn) * kBq, s.scale / s.softcap, s.softcap / s.scale, dcap);
}

float* scratch(int slot, size_t floats) {
  thread_local AlignedBuffer<float> buffers[2];
  AlignedBuffer<float>& buf = buffers[slot];
  if (buf.size() < floats) buf = AlignedBuffer<float>(floats);
  return buf.data();
}

void pack_rows(const void* src, DType dtype, int64_t row_stride, int n, int64_t d, float* dst,
               int64_t dp) {
  for (int r = 0; r < n; ++r) {
    float* o = dst + r * dp;
    if (dtype == DType::kF32) {
      std::memcpy(o, static_cast<const float*>(src) + r * row_stride, size_t(d) * sizeof(float));
    } else {
      convert_bf16_to_f32(static_cast<const bf16*>(src) + r * row_stride, o, size_t(d));
    }
    std::fill(o + d, o + dp, 0.0f);
  }
}

void pack_cols(const void* src, DType dtype, int64_t row_stride, int n, int64_t d, float* dst) {
  // Row by row: contiguous reads, strided writes (each write stream stays in one line of
  // the destination for 16 rows). The tile is reused for a whole row of blocks.
  for (int r = 0; r < n; ++r) {
    if (dtype == DType::kF32) {
      const float* s = static_cast<const float*>(src) + r * row_stride;
      for (int64_t c = 0; c < d; ++c) dst[c * kBq + r] = s[c];
    } else {
      const uint16_t* s =
          reinterpret_cast<const uint16_t*>(static_cast<const bf16*>(src) + r * row_stride);
      for (int64_t c = 0; c < d; ++c) dst[c * kBq + r] = std::bit_cast<float>(uint32_t(s[c]) << 16);
    }
  }
  if (n < kBq)
    for (int64_t c = 0; c < d; ++c) std::fill(dst + c * kBq + n, dst + (c + 1) * kBq, 0.0f);
}

uint64_t next_call_id() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}

const float* kv_head(const Dims& s, const TensorView& k, const TensorView& v, int64_t b, int64_t g,
                     uint64_t call) {
  struct Cache {
    AlignedBuffer<float> buf;
    uint64_t call = 0;
    int64_t b = -1, g = -1;
  };
  thread_local Cache cache;
  const int64_t rows = s.nkb * kBk;
  if (cache.call == call && cache.b == b && cache.g == g) return cache.buf.data();
  if (cache.buf.size() < size_t(2 * rows * s.dp)) cache.buf = AlignedBuffer<float>(2 * rows * s.dp);
  float* kp = cache.buf.data();
  const int64_t at = Dims::at(b, 0, g, s.tk, s.hkv, s.d), stride = s.hkv * s.d;
  pack_rows(element(k, at), k.dtype, stride, static_cast<int>(s.tk), s.d, kp, s.dp);
  pack_rows(element(v, at), v.dtype, stride, static_cast<int>(s.tk), s.d, kp + rows * s.dp, s.dp);
  cache.call = call;
  cache.b = b;
  cache.g = g;
  return kp;
}

void store_row(const float* src, int64_t d, float mul, void* dst, DType dtype) {
  if (dtype == DType::kF32) {
    float* o = static_cast<float*>(dst);
    for (int64_t c = 0; c < d; ++c) o[c] = src[c] * mul;
    return;
  }
  bf16* o = static_cast<bf16*>(dst);
  if (mul == 1.0f) return convert_f32_to_bf16(src, o, size_t(d));
  float tmp[256];
  for (int64_t c0 = 0; c0 < d; c0 += 256) {
    const int64_t n = std::min<int64_t>(256, d - c0);
    for (int64_t c = 0; c < n; ++c) tmp[c] = src[c0 + c] * mul;
    convert_f32_to_bf16(tmp, o + c0, size_t(n));
  }
}

}  // namespace attn

int64_t attention_visible_pairs(int64_t tq, int64_t tk, bool causal, int64_t window) {
  if (!causal) return tq * tk;
  if (window > 0 && window < tk) {
    // Query i sees min(window, tk - tq + i + 1) keys.
    int64_t pairs = 0;
    for (int64_t i = 0; i < tq; ++i) pairs += std::min(window, tk - tq + i + 1);
    return pairs;
  }
  // Query i sees tk - tq + i + 1 keys.
  const int64_t first = tk - tq + 1;
  return tq * first + tq * (tq - 1) / 2;
}

namespace ref {
namespace {

std::vector<double> to_f64(const TensorView& t) {
  std::vector<double> r(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < r.size(); ++i) r[i] = load_as_f32(t.data, t.dtype, i);
  return r;
}

void store(const std::vector<double>& src, const TensorView& t) {
  for (size_t i = 0; i < src.size(); ++i) {
    if (t.dtype == DType::kF32)
      t.as<float>()[i] = static_cast<float>(src[i]);
    else
      t.as<bf16>()[i] = f32_to_bf16(static_cast<float>(src[i]));
  }
}

// Softmax row of query i of (b, h): fills p[j] for the visible keys, returns their count
// and the natural log-sum-exp of the scaled scores. With a soft cap, dcap[j] (when not
// null) is the cap's derivative 1 - tanh^2 at key j.
int64_t softmax_row(const attn::Dims& s, const std::vector<double>& q, const std::vector<double>& k,
                    int64_t b, int64_t h, int64_t i, std::vector<double>& p, double* lse,
                    std::vector<double>* dcap = nullptr) {
  const int64_t visible = s.causal ? s.offset + i + 1 : s.tk;
  // A sliding window: the keys before it get probability 0.
  const int64_t first = s.window > 0 ? std::max<int64_t>(0, visible - s.window) : 0;
  const double* qi = q.data() + attn::Dims::at(b, i, h, s.tq, s.hq, s.d);
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < first; ++j) p[j] = -std::numeric_limits<double>::infinity();
  for (int64_t j = first; j < visible; ++j) {
    const double* kj = k.data() + attn::Dims::at(b, j, h / s.group, s.tk, s.hkv, s.d);
    double dot = 0;
    for (int64_t c = 0; c < s.d; ++c) dot += qi[c] * kj[c];
    p[j] = dot * s.scale;
    if (s.softcap > 0) {
      const double t = std::tanh(p[j] / s.softcap);
      p[j] = s.softcap * t;
      if (dcap != nullptr) (*dcap)[j] = 1.0 - t * t;
    }
    m = std::max(m, p[j]);
  }
  double sum = 0;
  for (int64_t j = 0; j < visible; ++j) sum += std::exp(p[j] - m);
  for (int64_t j = 0; j < visible; ++j) p[j] = std::exp(p[j] - m) / sum;
  *lse = m + std::log(sum);
  return visible;
}

}  // namespace

void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const TensorView& lse,
                       const AttentionParams& params) {
  const attn::Dims s = attn::check_forward("ref::attention_forward", q, k, v, out, lse, params);
  const std::vector<double> qd = to_f64(q), kd = to_f64(k), vd = to_f64(v);
  std::vector<double> o(static_cast<size_t>(out.numel()), 0.0), p(static_cast<size_t>(s.tk));
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t h = 0; h < s.hq; ++h)
      for (int64_t i = 0; i < s.tq; ++i) {
        double row_lse;
        const int64_t visible = softmax_row(s, qd, kd, b, h, i, p, &row_lse);
        double* oi = o.data() + attn::Dims::at(b, i, h, s.tq, s.hq, s.d);
        for (int64_t j = 0; j < visible; ++j) {
          const double* vj = vd.data() + attn::Dims::at(b, j, h / s.group, s.tk, s.hkv, s.d);
          for (int64_t c = 0; c < s.d; ++c) oi[c] += p[j] * vj[c];
        }
        lse.as<float>()[(b * s.hq + h) * s.tq + i] = static_cast<float>(row_lse);
      }
  store(o, out);
}

void attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& dout, const TensorView& lse,
                        const TensorView& dq, const TensorView& dk, const TensorView& dv,
                        const AttentionParams& params) {
  const attn::Dims s =
      attn::check_backward("ref::attention_backward", q, k, v, out, dout, lse, dq, dk, dv, params);
  const std::vector<double> qd = to_f64(q), kd = to_f64(k), vd = to_f64(v), god = to_f64(dout);
  std::vector<double> gq(qd.size(), 0.0), gk(kd.size(), 0.0), gv(vd.size(), 0.0);
  std::vector<double> p(static_cast<size_t>(s.tk)), dp(static_cast<size_t>(s.tk));
  std::vector<double> dcap(static_cast<size_t>(s.tk), 1.0);
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t h = 0; h < s.hq; ++h)
      for (int64_t i = 0; i < s.tq; ++i) {
        double row_lse;
        const int64_t visible = softmax_row(s, qd, kd, b, h, i, p, &row_lse, &dcap);
        const int64_t qi = attn::Dims::at(b, i, h, s.tq, s.hq, s.d);
        // Softmax backward: dS_j = P_j (dP_j - sum_l P_l dP_l), dP_j = dO_i . v_j.
        double pdp = 0;
        for (int64_t j = 0; j < visible; ++j) {
          const int64_t vj = attn::Dims::at(b, j, h / s.group, s.tk, s.hkv, s.d);
          double dot = 0;
          for (int64_t c = 0; c < s.d; ++c) dot += god[qi + c] * vd[vj + c];
          dp[j] = dot;
          pdp += p[j] * dot;
        }
        for (int64_t j = 0; j < visible; ++j) {
          const int64_t kj = attn::Dims::at(b, j, h / s.group, s.tk, s.hkv, s.d);
          const double ds = p[j] * (dp[j] - pdp) * dcap[j] * s.scale;
          for (int64_t c = 0; c < s.d; ++c) {
            gv[kj + c] += p[j] * god[qi + c];
            gq[qi + c] += ds * kd[kj + c];
            gk[kj + c] += ds * qd[qi + c];
          }
        }
      }
  store(gq, dq);
  store(gk, dk);
  store(gv, dv);
}

}  // namespace ref
}  // namespace hyperion
