// The block dot-product kernels (kernels/block_dot.h), written once in 256-bit
// intrinsics and compiled per instruction set: included by block_dot_avx512.cc (AVX512-VL
// VNNI: the u8 x s8 dot is vpdpbusd) and block_dot_avx2.cc (vpmaddubsw + vpmaddwd, exact
// here: no product pair of these formats reaches int16's limit, 128 * 127 * 2 < 32767).
// The includer defines HYP_BLOCK_TARGET (the target attribute), HYP_BLOCK_VNNI (1 or 0)
// and the namespace name HYP_BLOCK_NS.
//
// Each kernel unpacks one weight block into unsigned bytes once and dots it with the M
// activation rows; a block's integer sums are exact, then scaled by its f32 scales.

// NOLINTBEGIN(readability-function-size)
namespace hyperion::block_impl::HYP_BLOCK_NS {
namespace {

HYP_BLOCK_TARGET __attribute__((always_inline)) inline __m256i dot_u8s8(__m256i acc, __m256i u, __m256i s) {
#if HYP_BLOCK_VNNI
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  const __m256i p = _mm256_maddubs_epi16(u, s);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
#endif
}

HYP_BLOCK_TARGET __attribute__((always_inline)) inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

HYP_BLOCK_TARGET __attribute__((always_inline)) inline float f16(const unsigned char* p) {
  return _cvtsh_ss(load_u16(p));
}

// The 8 six-bit scales and mins of a Q4_K/Q5_K block, as bytes (k_scale_min, 8 at once).
HYP_BLOCK_TARGET __attribute__((always_inline)) inline void scales_mins(const unsigned char* s, uint64_t* sc, uint64_t* mn) {
  uint32_t a, b, c;
  __builtin_memcpy(&a, s, 4);
  __builtin_memcpy(&b, s + 4, 4);
  __builtin_memcpy(&c, s + 8, 4);
  const uint32_t sc_lo = a & 0x3F3F3F3Fu, m_lo = b & 0x3F3F3F3Fu;
  const uint32_t sc_hi = (c & 0x0F0F0F0Fu) | ((a >> 2) & 0x30303030u);
  const uint32_t m_hi = ((c >> 4) & 0x0F0F0F0Fu) | ((b >> 2) & 0x30303030u);
  *sc = uint64_t(sc_lo) | (uint64_t(sc_hi) << 32);
  *mn = uint64_t(m_lo) | (uint64_t(m_hi) << 32);
}

// Q4_K and Q5_K: 256 values in 8 sub-blocks of 32; x = d sc q - dmin m.
template <int M, bool kFive>
HYP_BLOCK_TARGET void q45k_rows(const unsigned char* w, int64_t k, const ActRow* act, float* out) {
  constexpr int64_t kBytes = kFive ? 176 : 144;
  const int64_t nb = k / 256;
  __m256 acc[M], accm[M];
  for (int i = 0; i < M; ++i) acc[i] = accm[i] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  // Each 16-value group's min (the sums are per 16): m0 m0 m1 m1 ... m7 m7.
  const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  for (int64_t b = 0; b < nb; ++b) {
    const unsigned char* blk = w + b * kBytes;
    const float d = f16(blk), dmin = f16(blk + 2);
    uint64_t sc, mn;
    scales_mins(blk + 4, &sc, &mn);
    const unsigned char* qs = blk + (kFive ? 48 : 16);
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_cvtsi64_si128(int64_t(mn)), dup));
    __m256i hbits = _mm256_setzero_si256();
    if constexpr (kFive) hbits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
    __m256i isum[M];
    for (int i = 0; i < M; ++i) isum[i] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      __m256i lo = _mm256_and_si256(raw, m4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      if constexpr (kFive) {
        // Bit 2c of qh[l] is value 64c + l's fifth bit, bit 2c + 1 value 64c + 32 + l's.
        const __m256i hs = _mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * c));
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hs, 4), bit4));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hs, 3), bit4));
      }
      const int32_t s_lo = int32_t((sc >> (16 * c)) & 0xFF), s_hi = int32_t((sc >> (16 * c + 8)) & 0xFF);
      const __m256i sv_lo = _mm256_set1_epi32(s_lo), sv_hi = _mm256_set1_epi32(s_hi);
      for (int i = 0; i < M; ++i) {
        const int8_t* a = act[i].qs + b * 256 + 64 * c;
        const __m256i dl = dot_u8s8(_mm256_setzero_si256(), lo,
                                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
        const __m256i dh = dot_u8s8(_mm256_setzero_si256(), hi,
                                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32)));
        isum[i] = _mm256_add_epi32(isum[i], _mm256_add_epi32(_mm256_mullo_epi32(dl, sv_lo),
                                                             _mm256_mullo_epi32(dh, sv_hi)));
      }
    }
    for (int i = 0; i < M; ++i) {
      const float da = act[i].d[b];
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i]), _mm256_set1_ps(d * da), acc[i]);
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act[i].sums + b * 16));
      accm[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(mins16, bs)),
                                _mm256_set1_ps(dmin * da), accm[i]);
    }
  }
  for (int i = 0; i < M; ++i) out[i] = hsum(acc[i]) - hsum(accm[i]);
}

// Q6_K: 256 values in 16 groups of 16 with int8 scales; x = d sc (q - 32).
template <int M>
HYP_BLOCK_TARGET void q6k_rows(const unsigned char* w, int64_t k, const ActRow* act, float* out) {
  const int64_t nb = k / 256;
  __m256 acc[M];
  for (int i = 0; i < M; ++i) acc[i] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  const __m256i m3 = _mm256_set1_epi8(0x30);
  for (int64_t b = 0; b < nb; ++b) {
    const unsigned char* blk = w + b * 210;
    const auto* scales = reinterpret_cast<const int8_t*>(blk + 192);
    const float d = f16(blk + 208);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales)));
    __m256i isum[M];
    for (int i = 0; i < M; ++i) isum[i] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const unsigned char* ql = blk + 64 * h;
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      // Values 128h + 32 part + l, part 0..3 (block_quant.h's Q6_K layout).
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m3));
      q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m3));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m3));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(qh, 2), m3));
      for (int part = 0; part < 4; ++part) {
        // Two groups of 16: lanes 0..3 the first, 4..7 the second.
        const int g = 8 * h + 2 * part;
        const __m256i sv = _mm256_setr_epi32(scales[g], scales[g], scales[g], scales[g], scales[g + 1],
                                             scales[g + 1], scales[g + 1], scales[g + 1]);
        for (int i = 0; i < M; ++i) {
          const int8_t* a = act[i].qs + b * 256 + 128 * h + 32 * part;
          const __m256i dp = dot_u8s8(_mm256_setzero_si256(), q[part],
                                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)));
          isum[i] = _mm256_add_epi32(isum[i], _mm256_mullo_epi32(dp, sv));
        }
      }
    }
    for (int i = 0; i < M; ++i) {
      // The offset: 32 * sum_g sc_g * (sum of the group's activations).
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act[i].sums + b * 16));
      const __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[i], corr)),
                               _mm256_set1_ps(d * act[i].d[b]), acc[i]);
    }
  }
  for (int i = 0; i < M; ++i) out[i] = hsum(acc[i]);
}

// Q8_0: 32 signed values; |w| x sign(a, w) puts the signs on the activation side. Two
// accumulators per row (even and odd blocks) so the FMA latency is not the bound at M = 1.
template <int M>
HYP_BLOCK_TARGET __attribute__((always_inline)) inline void q80_block(const unsigned char* blk, int64_t b, const ActRow* act,
                                       __m256* acc) {
  const float d = f16(blk);
  const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
  const __m256i aw = _mm256_sign_epi8(wv, wv);
  for (int i = 0; i < M; ++i) {
    const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act[i].qs + b * 32));
    const __m256i dp = dot_u8s8(_mm256_setzero_si256(), aw, _mm256_sign_epi8(av, wv));
    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dp), _mm256_set1_ps(d * act[i].d[b]), acc[i]);
  }
}

template <int M>
HYP_BLOCK_TARGET void q80_rows(const unsigned char* w, int64_t k, const ActRow* act, float* out) {
  const int64_t nb = k / 32;
  __m256 even[M], odd[M];
  for (int i = 0; i < M; ++i) even[i] = odd[i] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    q80_block<M>(w + b * 34, b, act, even);
    q80_block<M>(w + (b + 1) * 34, b + 1, act, odd);
  }
  if (b < nb) q80_block<M>(w + b * 34, b, act, even);
  for (int i = 0; i < M; ++i) out[i] = hsum(_mm256_add_ps(even[i], odd[i]));
}

// Q4_0: 32 values q in [0, 15], x = d (q - 8): sum q a - 8 sum a.
template <int M>
HYP_BLOCK_TARGET __attribute__((always_inline)) inline void q40_block(const unsigned char* blk, int64_t b, const ActRow* act,
                                       __m256* acc) {
  const __m128i m4 = _mm_set1_epi8(0x0F);
  const float d = f16(blk);
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
  const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(raw, m4)),
                                            _mm_and_si128(_mm_srli_epi16(raw, 4), m4), 1);
  for (int i = 0; i < M; ++i) {
    const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(act[i].qs + b * 32));
    __m256i dp = dot_u8s8(_mm256_setzero_si256(), q, av);
    dp = _mm256_sub_epi32(dp, _mm256_zextsi128_si256(_mm_cvtsi32_si128(8 * act[i].sums[b])));
    acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dp), _mm256_set1_ps(d * act[i].d[b]), acc[i]);
  }
}

template <int M>
HYP_BLOCK_TARGET void q40_rows(const unsigned char* w, int64_t k, const ActRow* act, float* out) {
  const int64_t nb = k / 32;
  __m256 even[M], odd[M];
  for (int i = 0; i < M; ++i) even[i] = odd[i] = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    q40_block<M>(w + b * 18, b, act, even);
    q40_block<M>(w + (b + 1) * 18, b + 1, act, odd);
  }
  if (b < nb) q40_block<M>(w + b * 18, b, act, even);
  for (int i = 0; i < M; ++i) out[i] = hsum(_mm256_add_ps(even[i], odd[i]));
}

// ---- Packed groups of 8 rows (kernels/block_pack.h): one lane per row.

HYP_BLOCK_TARGET __attribute__((always_inline)) inline __m256i bcast4(const int8_t* a) {
  int32_t v;
  __builtin_memcpy(&v, a, 4);
  return _mm256_set1_epi32(v);
}

HYP_BLOCK_TARGET __attribute__((always_inline)) inline __m256i shift16(__m256i v, int n) {
  return n >= 0 ? _mm256_sll_epi16(v, _mm_cvtsi32_si128(n)) : _mm256_srl_epi16(v, _mm_cvtsi32_si128(-n));
}

HYP_BLOCK_TARGET __attribute__((always_inline)) inline __m256 half8(const unsigned char* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

HYP_BLOCK_TARGET __attribute__((always_inline)) inline __m256i load32(const unsigned char* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

template <int M, bool kFive>
HYP_BLOCK_TARGET void q45k_x8(const unsigned char* w, int64_t nb, const ActRow* act, float* out) {
  constexpr int64_t kBytes = kFive ? 1440 : 1184;
  __m256 acc[M], accm[M];
  for (int i = 0; i < M; ++i) acc[i] = accm[i] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
  for (int64_t b = 0; b < nb; ++b) {
    const unsigned char* blk = w + b * kBytes;
    __m256i isum[M];
    for (int i = 0; i < M; ++i) isum[i] = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      const __m256i scv = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 32 + 8 * j)));
      const unsigned char* q = blk + 160 + (kFive ? 160 : 128) * j;
      __m256i lo[4], hi[4];
      __m256i hb = _mm256_setzero_si256();
      if constexpr (kFive) hb = load32(q + 128);
      for (int s = 0; s < 4; ++s) {
        const __m256i raw = load32(q + 32 * s);
        lo[s] = _mm256_and_si256(raw, m4);
        hi[s] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
        if constexpr (kFive) {
          lo[s] = _mm256_or_si256(lo[s], _mm256_and_si256(shift16(hb, 4 - 2 * s), bit4));
          hi[s] = _mm256_or_si256(hi[s], _mm256_and_si256(shift16(hb, 3 - 2 * s), bit4));
        }
      }
      for (int i = 0; i < M; ++i) {
        const int8_t* a = act[i].qs + b * 256 + 32 * j;
        // Four accumulators: chains of two dot products, not eight (their latency, not
        // their throughput, bounded a sub-block).
        __m256i d[4];
        for (int s = 0; s < 2; ++s) {
          d[2 * s] = dot_u8s8(_mm256_setzero_si256(), lo[s], bcast4(a + 8 * s));
          d[2 * s + 1] = dot_u8s8(_mm256_setzero_si256(), hi[s], bcast4(a + 8 * s + 4));
        }
        for (int s = 2; s < 4; ++s) {
          d[2 * s - 4] = dot_u8s8(d[2 * s - 4], lo[s], bcast4(a + 8 * s));
          d[2 * s - 3] = dot_u8s8(d[2 * s - 3], hi[s], bcast4(a + 8 * s + 4));
        }
        const __m256i dsum = _mm256_add_epi32(_mm256_add_epi32(d[0], d[1]), _mm256_add_epi32(d[2], d[3]));
        isum[i] = _mm256_add_epi32(isum[i], _mm256_mullo_epi32(dsum, scv));
      }
    }
    // The mins: each lane's m_j m_j+1 pairs against the rows' sub-block sums in pairs (one
    // vpmaddwd per two sub-blocks, for all 8 rows).
    __m256i mpair[4];
    for (int p = 0; p < 4; ++p)
      mpair[p] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 96 + 16 * p)),
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 104 + 16 * p))));
    const __m256 dv = half8(blk), dmv = half8(blk + 16);
    for (int i = 0; i < M; ++i) {
      const int8_t* s32 = reinterpret_cast<const int8_t*>(act[i].sums32 + b * 8);
      __m256i msum = _mm256_madd_epi16(mpair[0], bcast4(s32));
      for (int p = 1; p < 4; ++p) msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mpair[p], bcast4(s32 + 4 * p)));
      const __m256 da = _mm256_set1_ps(act[i].d[b]);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i]), _mm256_mul_ps(dv, da), acc[i]);
      accm[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmv, da), accm[i]);
    }
  }
  for (int i = 0; i < M; ++i) _mm256_storeu_ps(out + 8 * i, _mm256_sub_ps(acc[i], accm[i]));
}

template <int M>
HYP_BLOCK_TARGET void q6k_x8(const unsigned char* w, int64_t nb, const ActRow* act, float* out) {
  __m256 acc[M];
  for (int i = 0; i < M; ++i) acc[i] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(0x30);
  for (int64_t b = 0; b < nb; ++b) {
    const unsigned char* blk = w + b * 1680;
    __m256i isum[M];
    for (int i = 0; i < M; ++i) isum[i] = _mm256_setzero_si256();
    for (int g = 0; g < 16; ++g) {
      const unsigned char* grp = blk + 16 + 104 * g;
      const __m256i scv = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(grp)));
      const __m256i l0 = load32(grp + 8), l1 = load32(grp + 40);
      const __m256i h = load32(grp + 72);
      const __m256i q0 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m3));
      const __m256i q1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                         _mm256_and_si256(_mm256_slli_epi16(h, 2), m3));
      const __m256i q2 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(h, m3));
      const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                         _mm256_and_si256(_mm256_srli_epi16(h, 2), m3));
      for (int i = 0; i < M; ++i) {
        const int8_t* a = act[i].qs + b * 256 + 16 * g;
        const __m256i z = _mm256_setzero_si256();
        const __m256i d = _mm256_add_epi32(
            _mm256_add_epi32(dot_u8s8(z, q0, bcast4(a)), dot_u8s8(z, q1, bcast4(a + 4))),
            _mm256_add_epi32(dot_u8s8(z, q2, bcast4(a + 8)), dot_u8s8(z, q3, bcast4(a + 12))));
        isum[i] = _mm256_add_epi32(isum[i], _mm256_mullo_epi32(d, scv));
      }
    }
    // The offset, 32 sum_g sc_g (sum of group g's activations): the groups in pairs, one
    // vpmaddwd per two groups for all 8 rows.
    __m256i spair[8];
    for (int p = 0; p < 8; ++p)
      spair[p] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 16 + 104 * (2 * p))),
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 16 + 104 * (2 * p + 1)))));
    const __m256 dv = half8(blk);
    for (int i = 0; i < M; ++i) {
      const int8_t* s16 = reinterpret_cast<const int8_t*>(act[i].sums + b * 16);
      __m256i corr = _mm256_madd_epi16(spair[0], bcast4(s16));
      for (int p = 1; p < 8; ++p) corr = _mm256_add_epi32(corr, _mm256_madd_epi16(spair[p], bcast4(s16 + 4 * p)));
      const __m256i total = _mm256_sub_epi32(isum[i], _mm256_slli_epi32(corr, 5));
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(dv, _mm256_set1_ps(act[i].d[b])), acc[i]);
    }
  }
  for (int i = 0; i < M; ++i) _mm256_storeu_ps(out + 8 * i, acc[i]);
}

template <int M>
HYP_BLOCK_TARGET void q80_x8(const unsigned char* w, int64_t nb, const ActRow* act, float* out) {
  __m256 acc[M];
  for (int i = 0; i < M; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const unsigned char* blk = w + b * 272;
    __m256i wv[8];
    for (int s = 0; s < 8; ++s) {
      wv[s] = load32(blk + 16 + 32 * s);
#if HYP_BLOCK_VNNI
      wv[s] = _mm256_xor_si256(wv[s], _mm256_set1_epi8(char(0x80)));  // w + 128, unsigned
#endif
    }
    const __m256 dv = half8(blk);
    for (int i = 0; i < M; ++i) {
      const int8_t* a = act[i].qs + b * 32;
      __m256i ds[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                       _mm256_setzero_si256()};
      for (int s = 0; s < 8; ++s) {
#if HYP_BLOCK_VNNI
        ds[s % 4] = _mm256_dpbusd_epi32(ds[s % 4], wv[s], bcast4(a + 4 * s));
#else
        const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv[s], wv[s]), _mm256_sign_epi8(bcast4(a + 4 * s), wv[s]));
        ds[s % 4] = _mm256_add_epi32(ds[s % 4], _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
#endif
      }
      __m256i d = _mm256_add_epi32(_mm256_add_epi32(ds[0], ds[1]), _mm256_add_epi32(ds[2], ds[3]));
#if HYP_BLOCK_VNNI
      d = _mm256_sub_epi32(d, _mm256_set1_epi32(128 * int32_t(act[i].sums[b])));
#endif
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(dv, _mm256_set1_ps(act[i].d[b])), acc[i]);
    }
  }
  for (int i = 0; i < M; ++i) _mm256_storeu_ps(out + 8 * i, acc[i]);
}

// The 32-value formats with unsigned q: Q4_0 (x = d (q - 8)), Q5_0 (d (q - 16)), Q4_1 and
// Q5_1 (d q + m). kBytes, kMin, kFive: the packed block's size and parts (block_pack.h).
template <int M, int kBytes, bool kMin, bool kFive, int kOffset>
HYP_BLOCK_TARGET void q32_x8(const unsigned char* w, int64_t nb, const ActRow* act, float* out) {
  __m256 acc[M];
  for (int i = 0; i < M; ++i) acc[i] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
  constexpr int kNibbles = kMin ? 32 : 16;
  for (int64_t b = 0; b < nb; ++b) {
    const unsigned char* blk = w + b * kBytes;
    __m256i lo[4], hi[4];
    __m256i hb = _mm256_setzero_si256();
    if constexpr (kFive) hb = load32(blk + kNibbles + 128);
    for (int s = 0; s < 4; ++s) {
      const __m256i raw = load32(blk + kNibbles + 32 * s);
      lo[s] = _mm256_and_si256(raw, m4);
      hi[s] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      if constexpr (kFive) {
        lo[s] = _mm256_or_si256(lo[s], _mm256_and_si256(shift16(hb, 4 - 2 * s), bit4));
        hi[s] = _mm256_or_si256(hi[s], _mm256_and_si256(shift16(hb, 3 - 2 * s), bit4));
      }
    }
    const __m256 dv = half8(blk);
    __m256 mv = _mm256_setzero_ps();
    if constexpr (kMin) mv = half8(blk + 16);
    for (int i = 0; i < M; ++i) {
      const int8_t* a = act[i].qs + b * 32;
      __m256i ds[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                       _mm256_setzero_si256()};
      for (int s = 0; s < 4; ++s) {
        ds[(2 * s) % 4] = dot_u8s8(ds[(2 * s) % 4], lo[s], bcast4(a + 8 * s));
        ds[(2 * s + 1) % 4] = dot_u8s8(ds[(2 * s + 1) % 4], hi[s], bcast4(a + 8 * s + 4));
      }
      __m256i d = _mm256_add_epi32(_mm256_add_epi32(ds[0], ds[1]), _mm256_add_epi32(ds[2], ds[3]));
      const int32_t asum = act[i].sums[b];
      if constexpr (kOffset != 0) d = _mm256_sub_epi32(d, _mm256_set1_epi32(kOffset * asum));
      const float da = act[i].d[b];
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(dv, _mm256_set1_ps(da)), acc[i]);
      if constexpr (kMin) acc[i] = _mm256_fmadd_ps(mv, _mm256_set1_ps(da * float(asum)), acc[i]);
    }
  }
  for (int i = 0; i < M; ++i) _mm256_storeu_ps(out + 8 * i, acc[i]);
}

template <template <int> class K>
void by_rows_x8(const unsigned char* w, int64_t nb, const ActRow* act, int m, float* out) {
  switch (m) {
    case 1: K<1>::run(w, nb, act, out); return;
    case 2: K<2>::run(w, nb, act, out); return;
    case 3: K<3>::run(w, nb, act, out); return;
    case 4: K<4>::run(w, nb, act, out); return;
    case 5: K<5>::run(w, nb, act, out); return;
    case 6: K<6>::run(w, nb, act, out); return;
    case 7: K<7>::run(w, nb, act, out); return;
    default: K<8>::run(w, nb, act, out); return;
  }
}

template <int M>
struct Q4KX8 {
  static void run(const unsigned char* w, int64_t nb, const ActRow* a, float* o) { q45k_x8<M, false>(w, nb, a, o); }
};
template <int M>
struct Q5KX8 {
  static void run(const unsigned char* w, int64_t nb, const ActRow* a, float* o) { q45k_x8<M, true>(w, nb, a, o); }
};
template <int M>
struct Q6KX8 {
  static void run(const unsigned char* w, int64_t nb, const ActRow* a, float* o) { q6k_x8<M>(w, nb, a, o); }
};
template <int M>
struct Q80X8 {
  static void run(const unsigned char* w, int64_t nb, const ActRow* a, float* o) { q80_x8<M>(w, nb, a, o); }
};
template <int M>
struct Q40X8 {
  static void run(const unsigned char* w, int64_t nb, const ActRow* a, float* o) { q32_x8<M, 144, false, false, 8>(w, nb, a, o); }
};
template <int M>
struct Q41X8 {
  static void run(const unsigned char* w, int64_t nb, const ActRow* a, float* o) { q32_x8<M, 160, true, false, 0>(w, nb, a, o); }
};
template <int M>
struct Q50X8 {
  static void run(const unsigned char* w, int64_t nb, const ActRow* a, float* o) { q32_x8<M, 176, false, true, 16>(w, nb, a, o); }
};
template <int M>
struct Q51X8 {
  static void run(const unsigned char* w, int64_t nb, const ActRow* a, float* o) { q32_x8<M, 192, true, true, 0>(w, nb, a, o); }
};

// m (1..kBlockDotMaxRows) as the compile-time M.
template <template <int> class K>
void by_rows(const unsigned char* w, int64_t k, const ActRow* act, int m, float* out) {
  switch (m) {
    case 1: K<1>::run(w, k, act, out); return;
    case 2: K<2>::run(w, k, act, out); return;
    case 3: K<3>::run(w, k, act, out); return;
    case 4: K<4>::run(w, k, act, out); return;
    case 5: K<5>::run(w, k, act, out); return;
    case 6: K<6>::run(w, k, act, out); return;
    case 7: K<7>::run(w, k, act, out); return;
    default: K<8>::run(w, k, act, out); return;
  }
}

template <int M>
struct Q4K {
  static void run(const unsigned char* w, int64_t k, const ActRow* a, float* o) { q45k_rows<M, false>(w, k, a, o); }
};
template <int M>
struct Q5K {
  static void run(const unsigned char* w, int64_t k, const ActRow* a, float* o) { q45k_rows<M, true>(w, k, a, o); }
};
template <int M>
struct Q6K {
  static void run(const unsigned char* w, int64_t k, const ActRow* a, float* o) { q6k_rows<M>(w, k, a, o); }
};
template <int M>
struct Q80 {
  static void run(const unsigned char* w, int64_t k, const ActRow* a, float* o) { q80_rows<M>(w, k, a, o); }
};
template <int M>
struct Q40 {
  static void run(const unsigned char* w, int64_t k, const ActRow* a, float* o) { q40_rows<M>(w, k, a, o); }
};

}  // namespace

DotKernels kernels() {
  DotKernels k;
  k.fn[int(BlockType::kQ4_0)] = by_rows<Q40>;
  k.fn[int(BlockType::kQ8_0)] = by_rows<Q80>;
  k.fn[int(BlockType::kQ4_K)] = by_rows<Q4K>;
  k.fn[int(BlockType::kQ5_K)] = by_rows<Q5K>;
  k.fn[int(BlockType::kQ6_K)] = by_rows<Q6K>;
  k.x8[int(BlockType::kQ4_0)] = by_rows_x8<Q40X8>;
  k.x8[int(BlockType::kQ8_0)] = by_rows_x8<Q80X8>;
  k.x8[int(BlockType::kQ4_K)] = by_rows_x8<Q4KX8>;
  k.x8[int(BlockType::kQ5_K)] = by_rows_x8<Q5KX8>;
  k.x8[int(BlockType::kQ6_K)] = by_rows_x8<Q6KX8>;
  k.x8[int(BlockType::kQ4_1)] = by_rows_x8<Q41X8>;
  k.x8[int(BlockType::kQ5_0)] = by_rows_x8<Q50X8>;
  k.x8[int(BlockType::kQ5_1)] = by_rows_x8<Q51X8>;
  return k;
}

}  // namespace hyperion::block_impl::HYP_BLOCK_NS
// NOLINTEND(readability-function-size)
