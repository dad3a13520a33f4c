#include "kernels/block_pack.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "base/error.h"
#include "base/threads.h"
#include "kernels/block_dot.h"
#include "tensor/convert.h"

namespace hyperion {

using block_impl::half_to_float;
using block_impl::k_quant_value;
using block_impl::k_scale_min;
using block_impl::load_u16;
using block_impl::q6_k_value;

namespace {

constexpr int kR = 8;  // rows per group

void put_u16(unsigned char* p, uint16_t v) {
  std::memcpy(p, &v, 2);
}

// Where a packed 32-value format keeps its parts (kernels/block_pack.h).
struct Packed32 {
  bool min, five;
  int offset;   // Q4_0 8, Q5_0 16
  int nibbles;  // byte offset of the 4 steps of nibbles; the fifth bits follow them
};
Packed32 packed32(BlockType t) {
  const bool min = t == BlockType::kQ4_1 || t == BlockType::kQ5_1;
  const bool five = t == BlockType::kQ5_0 || t == BlockType::kQ5_1;
  return {min, five, min ? 0 : five ? 16 : 8, min ? 32 : 16};
}

// Packs block b of the 8 rows `src[r]` (each pointing at the row's block b) into `dst`.
void pack_group_block(BlockType t, const unsigned char* const* src, unsigned char* dst) {
  switch (t) {
    case BlockType::kQ4_0:
    case BlockType::kQ4_1:
    case BlockType::kQ5_0:
    case BlockType::kQ5_1: {
      const Packed32 l = packed32(t);
      for (int r = 0; r < kR; ++r) {
        put_u16(dst + 2 * r, load_u16(src[r]));
        if (l.min) put_u16(dst + 16 + 2 * r, load_u16(src[r] + 2));
      }
      for (int r = 0; r < kR; ++r) {
        const block_layout::Block32 k = block_layout::block32(t, src[r]);
        for (int s = 0; s < 4; ++s)
          for (int i = 0; i < 4; ++i) {
            const int lo = k.q(8 * s + i), hi = k.q(8 * s + 4 + i);
            dst[l.nibbles + 32 * s + 4 * r + i] = static_cast<unsigned char>((lo & 15) | ((hi & 15) << 4));
            if (l.five) {
              unsigned char& bits = dst[l.nibbles + 128 + 4 * r + i];
              if (s == 0) bits = 0;
              bits = static_cast<unsigned char>(bits | ((lo >> 4) << (2 * s)) | ((hi >> 4) << (2 * s + 1)));
            }
          }
      }
      return;
    }
    case BlockType::kQ8_0: {
      for (int r = 0; r < kR; ++r) put_u16(dst + 2 * r, load_u16(src[r]));
      for (int s = 0; s < 8; ++s)
        for (int r = 0; r < kR; ++r)
          for (int i = 0; i < 4; ++i) dst[16 + 32 * s + 4 * r + i] = src[r][2 + 4 * s + i];
      return;
    }
    case BlockType::kQ4_K:
    case BlockType::kQ5_K: {
      const bool five = t == BlockType::kQ5_K;
      for (int r = 0; r < kR; ++r) {
        put_u16(dst + 2 * r, load_u16(src[r]));
        put_u16(dst + 16 + 2 * r, load_u16(src[r] + 2));
        for (int j = 0; j < 8; ++j) {
          uint8_t sc, m;
          k_scale_min(src[r] + 4, j, &sc, &m);
          dst[32 + 8 * j + r] = sc;
          dst[96 + 8 * j + r] = m;
        }
      }
      const int sub_bytes = five ? 160 : 128;  // a sub-block's nibbles, then its fifth bits
      for (int j = 0; j < 8; ++j)
        for (int r = 0; r < kR; ++r) {
          unsigned char* q = dst + 160 + sub_bytes * j - 128 * j;
          unsigned char* h = dst + 160 + sub_bytes * j + 128 - 32 * j;
          const unsigned char* qh = five ? src[r] + 16 : nullptr;
          const unsigned char* qs = src[r] + (five ? 48 : 16);
          for (int s = 0; s < 4; ++s)
            for (int i = 0; i < 4; ++i) {
              const int lo = k_quant_value(qs, qh, 32 * j + 8 * s + i);
              const int hi = k_quant_value(qs, qh, 32 * j + 8 * s + 4 + i);
              q[128 * j + 32 * s + 4 * r + i] = static_cast<unsigned char>((lo & 15) | ((hi & 15) << 4));
              if (five) {
                unsigned char& bits = h[32 * j + 4 * r + i];
                if (s == 0) bits = 0;
                bits = static_cast<unsigned char>(bits | ((lo >> 4) << (2 * s)) | ((hi >> 4) << (2 * s + 1)));
              }
            }
        }
      return;
    }
    case BlockType::kQ6_K: {
      for (int r = 0; r < kR; ++r) put_u16(dst + 2 * r, load_u16(src[r] + 208));
      for (int g = 0; g < 16; ++g) {
        unsigned char* grp = dst + 16 + 104 * g;  // sc[8] | low nibbles 2 x 32 | high pairs 32
        for (int r = 0; r < kR; ++r) {
          grp[r] = src[r][192 + g];
          for (int i = 0; i < 4; ++i) {
            int v[4];
            for (int part = 0; part < 4; ++part) v[part] = q6_k_value(src[r], 16 * g + 4 * part + i);
            grp[8 + 4 * r + i] = static_cast<unsigned char>((v[0] & 15) | ((v[1] & 15) << 4));
            grp[40 + 4 * r + i] = static_cast<unsigned char>((v[2] & 15) | ((v[3] & 15) << 4));
            grp[72 + 4 * r + i] = static_cast<unsigned char>((v[0] >> 4) | ((v[1] >> 4) << 2) |
                                                             ((v[2] >> 4) << 4) | ((v[3] >> 4) << 6));
          }
        }
      }
      return;
    }
  }
}

// Value e (0..values-1) of row r in a packed group block, dequantised.
float packed_value(BlockType t, const unsigned char* b, int r, int e) {
  switch (t) {
    case BlockType::kQ4_0:
    case BlockType::kQ4_1:
    case BlockType::kQ5_0:
    case BlockType::kQ5_1: {
      const Packed32 l = packed32(t);
      const int s = e / 8, i = e % 8;
      const unsigned char byte = b[l.nibbles + 32 * s + 4 * r + (i % 4)];
      int q = i < 4 ? byte & 15 : byte >> 4;
      if (l.five) q |= ((b[l.nibbles + 128 + 4 * r + (i % 4)] >> (2 * s + (i < 4 ? 0 : 1))) & 1) << 4;
      const float d = half_to_float(load_u16(b + 2 * r));
      return l.min ? d * float(q) + half_to_float(load_u16(b + 16 + 2 * r)) : d * float(q - l.offset);
    }
    case BlockType::kQ8_0:
      return half_to_float(load_u16(b + 2 * r)) * float(int8_t(b[16 + 32 * (e / 4) + 4 * r + e % 4]));
    case BlockType::kQ4_K:
    case BlockType::kQ5_K: {
      const int j = e / 32, s = (e % 32) / 8, i = e % 8;
      const int sub = 160 + (t == BlockType::kQ5_K ? 160 : 128) * j;
      const unsigned char byte = b[sub + 32 * s + 4 * r + (i % 4)];
      int q = i < 4 ? byte & 15 : byte >> 4;
      if (t == BlockType::kQ5_K) q |= ((b[sub + 128 + 4 * r + (i % 4)] >> (2 * s + (i < 4 ? 0 : 1))) & 1) << 4;
      const float d = half_to_float(load_u16(b + 2 * r)), dmin = half_to_float(load_u16(b + 16 + 2 * r));
      return d * float(b[32 + 8 * j + r]) * float(q) - dmin * float(b[96 + 8 * j + r]);
    }
    case BlockType::kQ6_K: {
      const int g = e / 16, part = (e % 16) / 4, i = e % 4;
      const unsigned char* grp = b + 16 + 104 * g;
      const unsigned char lo = grp[8 + (part / 2) * 32 + 4 * r + i];
      const int low = part % 2 == 0 ? lo & 15 : lo >> 4;
      const int high = (grp[72 + 4 * r + i] >> (2 * part)) & 3;
      return half_to_float(load_u16(b + 2 * r)) * float(int8_t(grp[r])) * float((low | (high << 4)) - 32);
    }
  }
  return 0.0f;
}

}  // namespace

size_t packed_group_block_bytes(BlockType t) {
  switch (t) {
    case BlockType::kQ4_0: return 144;
    case BlockType::kQ4_1: return 160;
    case BlockType::kQ5_0: return 176;
    case BlockType::kQ5_1: return 192;
    case BlockType::kQ8_0: return 272;
    case BlockType::kQ4_K: return 1184;
    case BlockType::kQ5_K: return 1440;
    case BlockType::kQ6_K: return 1680;
  }
  return 0;
}

PackedBlocks pack_blocks(BlockType t, const void* src, int64_t rows, int64_t k) {
  const size_t row_bytes = block_bytes(t, k);
  PackedBlocks p;
  p.type = t;
  p.rows = rows;
  p.k = k;
  p.groups = rows / kR;
  p.block_bytes = packed_group_block_bytes(t);
  const BlockFormat& f = block_format(t);
  const int64_t nb = k / f.values;
  const auto* s = static_cast<const unsigned char*>(src);
  p.data = AlignedBuffer<unsigned char>(static_cast<size_t>(p.groups * nb) * p.block_bytes);
  parallel_chunks(p.groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t b = 0; b < nb; ++b) {
        const unsigned char* rows8[kR];
        for (int r = 0; r < kR; ++r) rows8[r] = s + size_t(g * kR + r) * row_bytes + b * int64_t(f.bytes);
        pack_group_block(t, rows8, p.data.data() + size_t(g * nb + b) * p.block_bytes);
      }
  });
  p.tail = s + size_t(p.groups * kR) * row_bytes;
  return p;
}

void dequantize_packed_rows(const PackedBlocks& p, int64_t r0, int64_t n, void* dst, DType dst_dtype) {
  HYP_CHECK(r0 >= 0 && n >= 0 && r0 + n <= p.rows, "dequantize_packed_rows: rows {}..{} of {}", r0,
            r0 + n, p.rows);
  HYP_CHECK(dst_dtype == DType::kF32 || dst_dtype == DType::kBF16,
            "dequantize_packed_rows: dst must be f32 or bf16, not {}", dtype_name(dst_dtype));
  const BlockFormat& f = block_format(p.type);
  const int64_t nb = p.k / f.values;
  parallel_chunks(n, std::max<int64_t>(1, 16384 / p.k), [&](int64_t b0, int64_t b1) {
    std::vector<float> row(static_cast<size_t>(p.k));
    for (int64_t i = b0; i < b1; ++i) {
      const int64_t r = r0 + i;
      if (r >= p.groups * kR) {
        dequantize_blocks_reference(p.type, p.tail + size_t(r - p.groups * kR) * block_bytes(p.type, p.k),
                                    row.data(), p.k);
      } else {
        const int64_t g = r / kR;
        const int rr = static_cast<int>(r % kR);
        for (int64_t b = 0; b < nb; ++b) {
          const unsigned char* blk = p.data.data() + size_t(g * nb + b) * p.block_bytes;
          for (int64_t e = 0; e < f.values; ++e)
            row[size_t(b * f.values + e)] = packed_value(p.type, blk, rr, static_cast<int>(e));
        }
      }
      if (dst_dtype == DType::kF32)
        std::memcpy(static_cast<float*>(dst) + i * p.k, row.data(), size_t(p.k) * sizeof(float));
      else
        convert_f32_to_bf16(row.data(), static_cast<bf16*>(dst) + i * p.k, size_t(p.k));
    }
  });
}

}  // namespace hyperion

namespace hyperion {

void packed_block_matmul(const PackedBlocks& p, int64_t m, const void* x, DType xd, void* y,
                         DType yd, float beta) {
  const PackedBlocks* ps[1] = {&p};
  void* const ys[1] = {y};
  packed_block_matmul_many(ps, m, x, xd, ys, yd, beta);
}

void packed_block_matmul_many(std::span<const PackedBlocks* const> ps, int64_t m, const void* x,
                              DType xd, std::span<void* const> ys, DType yd, float beta) {
  HYP_CHECK(m > 0 && !ps.empty() && ps.size() == ys.size(), "packed_block_matmul: m = {}, {} matrices, {} outputs",
            m, ps.size(), ys.size());
  HYP_CHECK(xd == DType::kF32 || xd == DType::kBF16,
            "packed_block_matmul: x must be f32 or bf16, not {}", dtype_name(xd));
  HYP_CHECK(yd == DType::kF32 || yd == DType::kBF16,
            "packed_block_matmul: y must be f32 or bf16, not {}", dtype_name(yd));
  const int64_t k = ps[0]->k;
  for (const PackedBlocks* p : ps)
    HYP_CHECK(p->k == k, "packed_block_matmul: matrices of one input differ in width ({} and {})", k, p->k);
  // The activations, quantised once per activation format (32-value blocks, or 256 for
  // the K formats). Any number of rows: each group of 8 weight rows is dotted with them
  // kBlockDotMaxRows at a time while it stays in the core's cache, so a prefill reads
  // the weights from memory once rather than once per 8 tokens.
  thread_local std::vector<block_impl::ActRow> act32, act256;
  act32.resize(static_cast<size_t>(m));
  act256.resize(static_cast<size_t>(m));
  bool have32 = false, have256 = false;
  for (const PackedBlocks* p : ps) {
    const bool small = block_impl::act_block(p->type) == 32;
    if (small && !have32) {
      block_impl::quantize_act_rows(p->type, m, k, x, xd, act32.data(), 0);
      have32 = true;
    } else if (!small && !have256) {
      block_impl::quantize_act_rows(p->type, m, k, x, xd, act256.data(), 1);
      have256 = true;
    }
  }
  const block_impl::DotKernels* kernels = block_impl::active_kernels();
  // The pool's threads read this thread's rows (a thread_local named inside the region
  // would be each worker's own).
  const block_impl::ActRow* const rows32 = act32.data();
  const block_impl::ActRow* const rows256 = act256.data();
  // Work units: every matrix's groups of 8 rows, then its tail rows, one parallel region
  // for all of them (q, k and v, or gate and up, in one pass of the pool).
  std::vector<int64_t> first(ps.size() + 1, 0);
  for (size_t t = 0; t < ps.size(); ++t) first[t + 1] = first[t] + ps[t]->groups + (ps[t]->rows - ps[t]->groups * kR);
  int64_t bytes = 0;
  for (const PackedBlocks* p : ps) bytes += p->groups * int64_t(p->block_bytes) * (k / block_format(p->type).values);
  const int64_t grain = std::max<int64_t>(1, int64_t(65536) * first.back() / std::max<int64_t>(bytes, 1));
  parallel_chunks(first.back(), grain, [&](int64_t u0, int64_t u1) {
    float out[kBlockDotMaxRows * kR];
    size_t t = static_cast<size_t>(std::upper_bound(first.begin(), first.end(), u0) - first.begin()) - 1;
    for (int64_t u = u0; u < u1; ++u) {
      while (u >= first[t + 1]) ++t;
      const PackedBlocks& p = *ps[t];
      const block_impl::ActRow* all = block_impl::act_block(p.type) == 32 ? rows32 : rows256;
      const int64_t n = p.rows, local = u - first[t];
      const BlockFormat& f = block_format(p.type);
      const int64_t nb = k / f.values;
      for (int64_t i0 = 0; i0 < m; i0 += kBlockDotMaxRows) {
      const block_impl::ActRow* act = all + i0;
      const int mi = static_cast<int>(std::min<int64_t>(kBlockDotMaxRows, m - i0));
      auto store = [&](int64_t i, int64_t col, float v) {
        i += i0;
        const int64_t idx = i * n + col;
        if (yd == DType::kF32) {
          float* dst = static_cast<float*>(ys[t]) + idx;
          *dst = v + (beta != 0.0f ? beta * *dst : 0.0f);
        } else {
          bf16* dst = static_cast<bf16*>(ys[t]) + idx;
          *dst = f32_to_bf16(v + (beta != 0.0f ? beta * bf16_to_f32(*dst) : 0.0f));
        }
      };
      if (local >= p.groups) {  // a tail row, in the file's layout
        const int64_t r = p.groups * kR + (local - p.groups);
        const unsigned char* wr = p.tail + size_t(local - p.groups) * block_bytes(p.type, k);
        const block_impl::RowDotFn row_fn = kernels != nullptr ? kernels->fn[int(p.type)] : nullptr;
        if (row_fn != nullptr) {
          row_fn(wr, k, act, mi, out);
        } else {
          std::vector<float> wv(static_cast<size_t>(k));
          dequantize_blocks_reference(p.type, wr, wv.data(), k);
          for (int i = 0; i < mi; ++i) {
            float s = 0;
            for (int64_t e = 0; e < k; ++e)
              s += wv[size_t(e)] * act[i].d[e / block_impl::act_block(p.type)] * float(act[i].qs[e]);
            out[i] = s;
          }
        }
        for (int i = 0; i < mi; ++i) store(i, r, out[i]);
        continue;
      }
      const unsigned char* wg = p.data.data() + size_t(local * nb) * p.block_bytes;
      const block_impl::GroupDotFn fn = kernels != nullptr ? kernels->x8[int(p.type)] : nullptr;
      if (fn != nullptr) {
        fn(wg, nb, act, mi, out);
      } else {  // portable: the packed values dequantised, dotted in f32
        for (int i = 0; i < mi; ++i)
          for (int r = 0; r < kR; ++r) out[i * kR + r] = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
          const unsigned char* blk = wg + size_t(b) * p.block_bytes;
          for (int r = 0; r < kR; ++r)
            for (int64_t e = 0; e < f.values; ++e) {
              const float wv = packed_value(p.type, blk, r, static_cast<int>(e));
              const int64_t at = b * f.values + e;
              for (int i = 0; i < mi; ++i)
                out[i * kR + r] += wv * act[i].d[at / block_impl::act_block(p.type)] * float(act[i].qs[at]);
            }
        }
      }
      for (int i = 0; i < mi; ++i)
        for (int r = 0; r < kR; ++r) store(i, local * kR + r, out[i * kR + r]);
      }
    }
  });
}

}  // namespace hyperion
