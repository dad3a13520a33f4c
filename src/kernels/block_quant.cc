#include "kernels/block_quant.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "base/aligned.h"
#include "base/cpu.h"
#include "base/error.h"
#include "base/threads.h"
#include "kernels/block_dot.h"
#include "kernels/gemm.h"
#include "kernels/quantize.h"
#include "tensor/convert.h"

namespace hyperion {

using block_impl::ActRow;
using block_impl::half_to_float;
using block_impl::k_quant_value;
using block_impl::k_scale_min;
using block_impl::q6_k_value;
using block_impl::load_u16;

namespace {

// ---- Reference dot products on the integer values: the exact integer sums of each
// block, combined in f32 in block order.

float dot_reference(BlockType t, const unsigned char* w, int64_t k, const ActRow& a) {
  const BlockFormat& f = block_format(t);
  const int64_t nb = k / f.values;
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    const unsigned char* blk = w + b * int64_t(f.bytes);
    const int8_t* q8 = a.qs + b * f.values;
    switch (t) {
      case BlockType::kQ4_0:
      case BlockType::kQ4_1:
      case BlockType::kQ5_0:
      case BlockType::kQ5_1: {
        const block_layout::Block32 blk32 = block_layout::block32(t, blk);
        int32_t s = 0;
        for (int j = 0; j < 32; ++j) s += blk32.q(j) * q8[j];
        s -= blk32.offset * a.sums[b];
        sum += blk32.d * a.d[b] * float(s) + blk32.m * a.d[b] * float(a.sums[b]);
        break;
      }
      case BlockType::kQ8_0: {
        int32_t s = 0;
        for (int j = 0; j < 32; ++j) s += int8_t(blk[2 + j]) * q8[j];
        sum += half_to_float(load_u16(blk)) * a.d[b] * float(s);
        break;
      }
      case BlockType::kQ4_K:
      case BlockType::kQ5_K: {
        const bool five = t == BlockType::kQ5_K;
        const unsigned char* qh = five ? blk + 16 : nullptr;
        const unsigned char* qs = five ? blk + 48 : blk + 16;
        int32_t s = 0, mins = 0;
        for (int j = 0; j < 8; ++j) {
          uint8_t sc, m;
          k_scale_min(blk + 4, j, &sc, &m);
          int32_t sj = 0;
          for (int e = 32 * j; e < 32 * j + 32; ++e) sj += k_quant_value(qs, qh, e) * q8[e];
          s += int32_t(sc) * sj;
          mins += int32_t(m) * (a.sums[b * 16 + 2 * j] + a.sums[b * 16 + 2 * j + 1]);
        }
        const float d = half_to_float(load_u16(blk)), dmin = half_to_float(load_u16(blk + 2));
        sum += a.d[b] * (d * float(s) - dmin * float(mins));
        break;
      }
      case BlockType::kQ6_K: {
        const auto* scales = reinterpret_cast<const int8_t*>(blk + 192);
        int32_t s = 0;
        for (int g = 0; g < 16; ++g) {
          int32_t sg = 0;
          for (int e = 16 * g; e < 16 * g + 16; ++e) sg += (q6_k_value(blk, e) - 32) * q8[e];
          s += int32_t(scales[g]) * sg;
        }
        sum += a.d[b] * half_to_float(load_u16(blk + 208)) * float(s);
        break;
      }
    }
  }
  return sum;
}

void portable_row_dot(BlockType t, const unsigned char* w, int64_t k, const ActRow* act, int m,
                      float* out) {
  for (int i = 0; i < m; ++i) out[i] = dot_reference(t, w, k, act[i]);
}

// ---- Instruction-set dispatch.

BlockIsa g_isa = BlockIsa::kAuto;

BlockIsa effective_isa() {
  const CpuFeatures& cpu = cpu_features();
  const bool vnni = cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512_vnni;
  const bool avx2 = cpu.avx2 && cpu.fma && cpu.f16c;
  switch (g_isa) {
    case BlockIsa::kAuto: return vnni ? BlockIsa::kAvx512Vnni : avx2 ? BlockIsa::kAvx2 : BlockIsa::kPortable;
    case BlockIsa::kAvx512Vnni: return vnni ? BlockIsa::kAvx512Vnni : BlockIsa::kPortable;
    case BlockIsa::kAvx2: return avx2 ? BlockIsa::kAvx2 : BlockIsa::kPortable;
    case BlockIsa::kPortable: return BlockIsa::kPortable;
  }
  return BlockIsa::kPortable;
}

void check_k(BlockType t, int64_t k, const char* what) {
  const BlockFormat& f = block_format(t);
  HYP_CHECK(k > 0 && k % f.values == 0, "{}: {} values are not a whole number of {} blocks ({})",
            what, k, f.name, f.values);
}

// Rows of W dequantised per prefill tile: bounded so a tile of the widest rows stays a few
// MiB (it is re-read by the GEMM for every activation row block).
int64_t tile_rows(int64_t k) {
  const int64_t rows = (int64_t(4) << 20) / (k * 2);
  return std::max<int64_t>(64, rows / 64 * 64);
}

}  // namespace

namespace block_impl {

void quantize_act_rows(BlockType t, int64_t m, int64_t k, const void* x, DType xd, ActRow* rows,
                       int slot) {
  const size_t act_bytes = block_act_row_bytes(t, k);
  thread_local AlignedBuffer<unsigned char> buffers[2];
  AlignedBuffer<unsigned char>& acts = buffers[slot];
  if (acts.size() < act_bytes * size_t(m)) acts = AlignedBuffer<unsigned char>(act_bytes * size_t(m));
  for (int64_t i = 0; i < m; ++i) {
    const void* xi = static_cast<const unsigned char*>(x) + i * k * int64_t(dtype_size(xd));
    quantize_block_activations(t, xi, xd, k, acts.data() + size_t(i) * act_bytes);
    rows[i] = act_row(t, acts.data() + size_t(i) * act_bytes, k);
  }
}

const DotKernels* active_kernels() {
  switch (effective_isa()) {
    case BlockIsa::kAvx512Vnni: {
      static const DotKernels k = avx512_vnni_kernels();
      return &k;
    }
    case BlockIsa::kAvx2: {
      static const DotKernels k = avx2_kernels();
      return &k;
    }
    default: return nullptr;
  }
}

void prefill_matmul(int64_t m, int64_t n, int64_t k, const void* x, DType xd, void* y, DType yd,
                    float beta, const std::function<void(int64_t, int64_t, bf16*)>& dequant) {
  // Tiles of W dequantised to bf16, each multiplied by all of x on the GEMM.
  thread_local AlignedBuffer<bf16> xb, tile;
  const void* xa = x;
  if (xd == DType::kF32) {
    if (xb.size() < size_t(m * k)) xb = AlignedBuffer<bf16>(size_t(m * k));
    convert_f32_to_bf16(static_cast<const float*>(x), xb.data(), size_t(m * k));
    xa = xb.data();
  }
  const int64_t tr = std::min(n, tile_rows(k));
  if (tile.size() < size_t(tr * k)) tile = AlignedBuffer<bf16>(size_t(tr * k));
  for (int64_t r0 = 0; r0 < n; r0 += tr) {
    const int64_t rows = std::min(tr, n - r0);
    dequant(r0, rows, tile.data());
    GemmArgs g;
    g.trans_a = Trans::kN;
    g.trans_b = Trans::kT;
    g.m = m;
    g.n = rows;
    g.k = k;
    g.a = xa;
    g.a_dtype = DType::kBF16;
    g.lda = k;
    g.b = tile.data();
    g.b_dtype = DType::kBF16;
    g.ldb = k;
    g.c = static_cast<unsigned char*>(y) + r0 * int64_t(dtype_size(yd));
    g.c_dtype = yd;
    g.ldc = n;
    g.beta = beta;
    gemm(g);
  }
}

}  // namespace block_impl

size_t block_act_row_bytes(BlockType t, int64_t k) {
  check_k(t, k, "block activations");
  const bool k_format = block_impl::act_block(t) == 256;
  const size_t bytes = static_cast<size_t>(k + (k / block_impl::act_block(t)) * 4 +
                                           (k / block_impl::act_group(t)) * 2 + (k_format ? (k / 32) * 2 : 0));
  // Rows one after another stay aligned (their scales are f32): a whole number of cache lines.
  return (bytes + 63) / 64 * 64;
}

void quantize_block_activations(BlockType t, const void* x, DType xd, int64_t k, void* dst) {
  check_k(t, k, "block activations");
  HYP_CHECK(xd == DType::kF32 || xd == DType::kBF16,
            "block activations: x must be f32 or bf16, not {}", dtype_name(xd));
  auto* qs = static_cast<int8_t*>(dst);
  const ActRow a = block_impl::act_row(t, dst, k);
  auto* d = const_cast<float*>(a.d);
  auto* sums = const_cast<int16_t*>(a.sums);
  const int64_t block = block_impl::act_block(t), group = block_impl::act_group(t);
  // Each block: symmetric absmax to int8 (kernels/quantize.h's row quantiser, SIMD); a
  // non-finite activation gives its block a non-finite scale, so the outputs it feeds are
  // NaN rather than plausible numbers.
  const size_t xsize = dtype_size(xd);
  for (int64_t b = 0; b < k / block; ++b)
    d[b] = quantize_row(static_cast<const unsigned char*>(x) + size_t(b * block) * xsize, xd, block,
                        qs + b * block, DType::kI8);
  for (int64_t g = 0; g < k / group; ++g) {
    int32_t s = 0;
    for (int64_t j = 0; j < group; ++j) s += qs[g * group + j];
    sums[g] = static_cast<int16_t>(s);
  }
  if (block == 256) {
    auto* sums32 = const_cast<int16_t*>(a.sums32);
    for (int64_t g = 0; g < k / 32; ++g) sums32[g] = static_cast<int16_t>(sums[2 * g] + sums[2 * g + 1]);
  }
}

float block_dot_reference(BlockType t, const void* w, const void* act, int64_t k) {
  check_k(t, k, "block_dot");
  return dot_reference(t, static_cast<const unsigned char*>(w), k, block_impl::act_row(t, act, k));
}

void dequantize_block_rows(BlockType t, const void* w, int64_t k, int64_t r0, int64_t rows,
                           void* dst, DType dst_dtype) {
  check_k(t, k, "dequantize_block_rows");
  HYP_CHECK(dst_dtype == DType::kF32 || dst_dtype == DType::kBF16,
            "dequantize_block_rows: dst must be f32 or bf16, not {}", dtype_name(dst_dtype));
  const size_t row_bytes = block_bytes(t, k);
  const auto* base = static_cast<const unsigned char*>(w) + static_cast<size_t>(r0) * row_bytes;
  const BlockFormat& f = block_format(t);
  parallel_chunks(rows, std::max<int64_t>(1, 16384 / k), [&](int64_t b, int64_t e) {
    float tmp[256];
    for (int64_t r = b; r < e; ++r) {
      const unsigned char* row = base + static_cast<size_t>(r) * row_bytes;
      for (int64_t blk = 0; blk < k / f.values; ++blk) {
        dequantize_blocks_reference(t, row + blk * int64_t(f.bytes), tmp, f.values);
        if (dst_dtype == DType::kF32) {
          std::memcpy(static_cast<float*>(dst) + r * k + blk * f.values, tmp,
                      size_t(f.values) * sizeof(float));
        } else {
          convert_f32_to_bf16(tmp, static_cast<bf16*>(dst) + r * k + blk * f.values,
                              size_t(f.values));
        }
      }
    }
  });
}

void block_embedding_forward(BlockType t, const void* table, int64_t vocab, int64_t dim,
                             const int32_t* tokens, int64_t n, float* out, float scale) {
  check_k(t, dim, "block embedding");
  for (int64_t i = 0; i < n; ++i)
    HYP_CHECK(tokens[i] >= 0 && tokens[i] < vocab,
              "embedding: token id {} at position {} is outside the vocabulary [0, {})", tokens[i],
              i, vocab);
  const size_t row_bytes = block_bytes(t, dim);
  const BlockFormat& f = block_format(t);
  parallel_chunks(n, 8, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const auto* row = static_cast<const unsigned char*>(table) + size_t(tokens[i]) * row_bytes;
      float* dst = out + i * dim;
      for (int64_t blk = 0; blk < dim / f.values; ++blk)
        dequantize_blocks_reference(t, row + blk * int64_t(f.bytes), dst + blk * f.values, f.values);
      if (scale != 1.0f)
        for (int64_t j = 0; j < dim; ++j) dst[j] *= scale;
    }
  });
}

void block_matmul(BlockType t, int64_t m, int64_t n, int64_t k, const void* x, DType xd,
                  const void* w, void* y, DType yd, float beta) {
  check_k(t, k, "block_matmul");
  HYP_CHECK(m > 0 && n > 0, "block_matmul: m = {}, n = {}", m, n);
  HYP_CHECK(xd == DType::kF32 || xd == DType::kBF16, "block_matmul: x must be f32 or bf16, not {}",
            dtype_name(xd));
  HYP_CHECK(yd == DType::kF32 || yd == DType::kBF16, "block_matmul: y must be f32 or bf16, not {}",
            dtype_name(yd));
  const size_t row_bytes = block_bytes(t, k);
  const auto* wp = static_cast<const unsigned char*>(w);
  if (m > kBlockDotMaxRows) {
    block_impl::prefill_matmul(m, n, k, x, xd, y, yd, beta,
                               [&](int64_t r0, int64_t rows, bf16* tile) {
                                 dequantize_block_rows(t, w, k, r0, rows, tile, DType::kBF16);
                               });
    return;
  }
  // Decode: activations quantised once, every weight row dotted with all of them.
  ActRow rows[kBlockDotMaxRows];
  block_impl::quantize_act_rows(t, m, k, x, xd, rows);
  const block_impl::DotKernels* kernels = block_impl::active_kernels();
  const block_impl::RowDotFn fn = kernels != nullptr ? kernels->fn[int(t)] : nullptr;
  const int mi = static_cast<int>(m);
  // Grain: a chunk of rows worth at least ~64 KiB of weights.
  const int64_t grain = std::max<int64_t>(1, int64_t(65536) / int64_t(row_bytes));
  parallel_chunks(n, grain, [&](int64_t b, int64_t e) {
    float out[kBlockDotMaxRows];
    for (int64_t r = b; r < e; ++r) {
      const unsigned char* wr = wp + static_cast<size_t>(r) * row_bytes;
      if (fn != nullptr)
        fn(wr, k, rows, mi, out);
      else
        portable_row_dot(t, wr, k, rows, mi, out);
      for (int i = 0; i < mi; ++i) {
        const int64_t idx = i * n + r;
        if (yd == DType::kF32) {
          float* dst = static_cast<float*>(y) + idx;
          *dst = out[i] + (beta != 0.0f ? beta * *dst : 0.0f);
        } else {
          bf16* dst = static_cast<bf16*>(y) + idx;
          *dst = f32_to_bf16(out[i] + (beta != 0.0f ? beta * bf16_to_f32(*dst) : 0.0f));
        }
      }
    }
  });
}

void set_block_isa_for_testing(BlockIsa isa) {
  g_isa = isa;
}

const char* block_isa_name() {
  switch (effective_isa()) {
    case BlockIsa::kAvx512Vnni: return "avx512-vnni";
    case BlockIsa::kAvx2: return "avx2";
    default: return "portable";
  }
}

}  // namespace hyperion
