// Embedding gather / scatter-add. The gather is a row copy (memcpy or a bulk dtype
// conversion); the scatter-add is vectorised with Highway dynamic dispatch and split
// across threads by column blocks so repeated ids never race and the summation order
// (ascending position) is fixed.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/embedding.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include "kernels/simd-inl.h"

#include "kernels/embedding.h"
#include "tensor/convert.h"

HWY_BEFORE_NAMESPACE();
namespace hyperion {
namespace HWY_NAMESPACE {

// Columns [h0, h1) of every referenced dtable row. A plain add (no FMA) is the same
// in the vector body and the scalar tail, so results do not depend on where the
// column split falls.
// kScaled: dtable += scale * dout (a scaled embedding's gradient), one rounding of the
// product as in the scalar tail.
template <bool kScaled, typename T>
void ScatterAddT(const int32_t* ids, size_t count, const T* dout, size_t hidden, float* dtable,
                 size_t h0, size_t h1, float scale) {
  const DF d;
  const size_t n = hn::Lanes(d);
  const size_t width = h1 - h0;
  const VF vs = hn::Set(d, scale);
  for (size_t p = 0; p < count; ++p) {
    const T* src = dout + p * hidden + h0;
    float* dst = dtable + static_cast<size_t>(ids[p]) * hidden + h0;
    size_t i = 0;
    for (; i + n <= width; i += n) {
      VF v = LoadF(d, src + i);
      if constexpr (kScaled) v = hn::Mul(v, vs);
      hn::StoreU(hn::Add(hn::LoadU(d, dst + i), v), d, dst + i);
    }
    for (; i < width; ++i) dst[i] += kScaled ? ToF32(src[i]) * scale : ToF32(src[i]);
  }
}

void ScatterAddCols(const int32_t* ids, size_t count, const void* dout, DType dtype, size_t hidden,
                    float* dtable, size_t h0, size_t h1, float scale) {
  const bool scaled = scale != 1.0f;
  if (dtype == DType::kF32) {
    const auto* src = static_cast<const float*>(dout);
    if (scaled)
      ScatterAddT<true>(ids, count, src, hidden, dtable, h0, h1, scale);
    else
      ScatterAddT<false>(ids, count, src, hidden, dtable, h0, h1, scale);
  } else {
    const auto* src = static_cast<const bf16*>(dout);
    if (scaled)
      ScatterAddT<true>(ids, count, src, hidden, dtable, h0, h1, scale);
    else
      ScatterAddT<false>(ids, count, src, hidden, dtable, h0, h1, scale);
  }
}

// x[i] *= scale (a gathered f32 row of a scaled embedding).
void ScaleRow(float* x, size_t count, float scale) {
  const DF d;
  const size_t n = hn::Lanes(d);
  const VF vs = hn::Set(d, scale);
  size_t i = 0;
  for (; i + n <= count; i += n) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), vs), d, x + i);
  for (; i < count; ++i) x[i] *= scale;
}

}  // namespace HWY_NAMESPACE
}  // namespace hyperion
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "base/threads.h"

namespace hyperion {

HWY_EXPORT(ScatterAddCols);
HWY_EXPORT(ScaleRow);

namespace {

// Columns per scatter-add work unit: one cache line of f32, so threads never write
// the same line of a 64-byte-aligned row.
constexpr int64_t kColumnBlock = 16;

void check_float(const char* op, const char* name, const TensorView& t) {
  HYP_CHECK(t.dtype == DType::kF32 || t.dtype == DType::kBF16, "{}: {} must be f32 or bf16, got {}",
            op, name, t.str());
  check_rank(op, name, t, 2);
  check_contiguous(op, name, t);
}

// Checks ids (i32 [N], each in [0, V)) before any output is written.
void check_ids(const char* op, const TensorView& ids, const TensorView& table, const char* what) {
  ids.check_dtype(DType::kI32, op);
  check_rank(op, "ids", ids, 1);
  check_contiguous(op, "ids", ids);
  const int32_t* p = static_cast<const int32_t*>(ids.data);
  const int64_t vocab = table.shape[0];
  for (int64_t i = 0; i < ids.shape[0]; ++i) {
    HYP_CHECK(p[i] >= 0 && p[i] < vocab, "{}: id {} at position {} is out of range for {} {}", op,
              p[i], i, what, table.str());
  }
}

void check_forward(const char* op, const TensorView& table, const TensorView& ids,
                   const TensorView& out) {
  check_float(op, "table", table);
  check_float(op, "out", out);
  check_ids(op, ids, table, "table");
  HYP_CHECK(out.shape[0] == ids.shape[0] && out.shape[1] == table.shape[1],
            "{}: out {} must be [{}, {}] for ids {} and table {}", op, out.str(), ids.shape[0],
            table.shape[1], ids.str(), table.str());
}

void check_backward(const char* op, const TensorView& ids, const TensorView& dout,
                    const TensorView& dtable) {
  check_float(op, "dout", dout);
  dtable.check_dtype(DType::kF32, op);
  check_rank(op, "dtable", dtable, 2);
  check_contiguous(op, "dtable", dtable);
  check_ids(op, ids, dtable, "dtable");
  HYP_CHECK(dout.shape[0] == ids.shape[0] && dout.shape[1] == dtable.shape[1],
            "{}: dout {} must be [{}, {}] for ids {} and dtable {}", op, dout.str(), ids.shape[0],
            dtable.shape[1], ids.str(), dtable.str());
}

}  // namespace

void embedding_forward(const TensorView& table, const TensorView& ids, const TensorView& out,
                       float scale) {
  check_forward("embedding_forward", table, ids, out);
  HYP_CHECK(scale == 1.0f || out.dtype == DType::kF32,
            "embedding_forward: a scaled embedding ({}) needs an f32 out, got {}", scale,
            out.str());
  const int64_t rows = ids.shape[0], hidden = table.shape[1];
  if (rows == 0 || hidden == 0) return;
  const int32_t* id = static_cast<const int32_t*>(ids.data);
  const size_t ts = dtype_size(table.dtype), os = dtype_size(out.dtype);
  const auto* src = static_cast<const unsigned char*>(table.data);
  auto* dst = static_cast<unsigned char*>(out.data);
  const DType tt = table.dtype, ot = out.dtype;
  const size_t h = static_cast<size_t>(hidden);
  parallel_chunks(rows, std::max<int64_t>(1, 32768 / hidden), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const unsigned char* s = src + static_cast<size_t>(id[r]) * h * ts;
      unsigned char* o = dst + static_cast<size_t>(r) * h * os;
      if (tt == ot) {
        std::memcpy(o, s, h * ts);
      } else if (tt == DType::kBF16) {
        convert_bf16_to_f32(reinterpret_cast<const bf16*>(s), reinterpret_cast<float*>(o), h);
      } else {
        convert_f32_to_bf16(reinterpret_cast<const float*>(s), reinterpret_cast<bf16*>(o), h);
      }
      if (scale != 1.0f) HWY_DYNAMIC_DISPATCH(ScaleRow)(reinterpret_cast<float*>(o), h, scale);
    }
  });
}

void embedding_backward(const TensorView& ids, const TensorView& dout, const TensorView& dtable,
                        float scale) {
  check_backward("embedding_backward", ids, dout, dtable);
  const int64_t count = ids.shape[0], hidden = dtable.shape[1];
  if (count == 0 || hidden == 0) return;
  const int64_t blocks = (hidden + kColumnBlock - 1) / kColumnBlock;
  // Each block costs count * 16 adds; aim for >= 16K adds per thread chunk.
  const int64_t grain = std::max<int64_t>(1, 1024 / count);
  parallel_chunks(blocks, grain, [&](int64_t begin, int64_t end) {
    const int64_t h0 = begin * kColumnBlock, h1 = std::min(hidden, end * kColumnBlock);
    HWY_DYNAMIC_DISPATCH(ScatterAddCols)
    (static_cast<const int32_t*>(ids.data), size_t(count), dout.data, dout.dtype, size_t(hidden),
     static_cast<float*>(dtable.data), size_t(h0), size_t(h1), scale);
  });
}

namespace ref {

void embedding_forward(const TensorView& table, const TensorView& ids, const TensorView& out,
                       float scale) {
  check_forward("ref::embedding_forward", table, ids, out);
  const int32_t* id = static_cast<const int32_t*>(ids.data);
  const int64_t hidden = table.shape[1];
  for (int64_t r = 0; r < ids.shape[0]; ++r) {
    for (int64_t j = 0; j < hidden; ++j) {
      const float v = load_as_f32(table.data, table.dtype, size_t(id[r] * hidden + j));
      const size_t o = size_t(r * hidden + j);
      if (out.dtype == DType::kF32) {
        static_cast<float*>(out.data)[o] = v * scale;
      } else {
        static_cast<bf16*>(out.data)[o] = f32_to_bf16(v);
      }
    }
  }
}

void embedding_backward(const TensorView& ids, const TensorView& dout, const TensorView& dtable,
                        float scale) {
  check_backward("ref::embedding_backward", ids, dout, dtable);
  const int32_t* id = static_cast<const int32_t*>(ids.data);
  const int64_t hidden = dtable.shape[1];
  float* g = static_cast<float*>(dtable.data);
  for (int64_t r = 0; r < ids.shape[0]; ++r) {
    for (int64_t j = 0; j < hidden; ++j)
      g[id[r] * hidden + j] += load_as_f32(dout.data, dout.dtype, size_t(r * hidden + j)) * scale;
  }
}

}  // namespace ref
}  // namespace hyperion
#endif  // HWY_ONCE
