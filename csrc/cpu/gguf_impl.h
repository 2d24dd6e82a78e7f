// The GGUF integer GEMV kernels (gguf.h), written once and compiled per ISA level: gguf_<level>.cpp defines
// KESTREL_GGUF_NS (a namespace of its own, so no symbol is shared between translation units compiled with
// different -m flags) and KESTREL_GGUF_LEVEL:
//   0 scalar       plain integer dot products
//   1 avx2         vpmaddubsw (u8 x s8 -> s16 pairs, no saturation here: |15 * 127 * 2|, |128 * 127 * 2| < 2^15)
//                  + vpmaddwd by ones -> 8 x s32 per block of 32
//   2 avxvnni      vpdpbusd on ymm (AVX-VNNI, VEX encoded): the same 8 x s32 in one instruction
//   3 avx512vnni   Q4_0 / Q4_1: four blocks per zmm (row_tile_quads, x permuted to the nibbles' order once per
//                  chunk); Q8_0: two blocks per zmm (row_tile_pairs: the pair's two scales by one vpermps from the
//                  group's 8); the other types vpdpbusd on ymm with the EVEX encoding. (On the
//                  Sapphire Rapids dev VM a first zmm version, scales by cross-lane inserts, measured slower than ymm;
//                  on the Zen 5 one, the pairs made Q4_0's GEMV 1.4-1.6x faster, from compute-bound to near DRAM
//                  speed: docs/benchmarks/cpu_gguf_models_2026-12-03.md. Not re-measured on Sapphire Rapids.)
// Q8_0 weights are signed: |w| goes in the unsigned operand and x takes w's sign (vpsignb); Q6_K's too (q - 32).
// K-quants (row_tile_k): per super-block of 256, the 8 sub-blocks' scales d sc[t] (and mins dmin mn[t]) as one
// vector, times the 8 x blocks' d_x, as the planar types' groups of 8 blocks; Q6_K's int8 scales per 16 weights
// go into the integer sum through vpmaddwd (by the scales instead of by ones) at every SIMD level: vpdpbusd would
// need a vpmulld by the scales after it, more uops than vpmaddubsw + vpmaddwd (no saturation: |32 * 127 * 2| < 2^15).
// Per block and x row: the integer dot is converted to fp32 and accumulated with the scale d_w * d_x; Q4_0's and
// Q4_1's offsets come from the x blocks' sums of quants, as vector FMAs over 8 blocks (gguf.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "gguf.h"
#include "types.h"

#if KESTREL_GGUF_LEVEL > 0
#include <immintrin.h>
#endif

namespace kestrel::cpu::KESTREL_GGUF_NS {

static inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if KESTREL_GGUF_LEVEL > 0
  return _cvtsh_ss(h);
#else
  return to_f32(f16_t{h});
#endif
}

template <class T>
static void quantize_rows(const void* x, int64_t x_stride, int64_t K, int64_t m0, int64_t m1, int8_t* xq, float* xd,
                          float* xs) {
  const int64_t nb = K / kGGUFBlock;
  for (int64_t m = m0; m < m1; ++m) {
    const T* row = static_cast<const T*>(x) + m * x_stride;
    for (int64_t b = 0; b < nb; ++b) {
      float v[kGGUFBlock];
      float amax = 0.f;
      for (int i = 0; i < kGGUFBlock; ++i) {
        v[i] = to_f32(row[b * kGGUFBlock + i]);
        amax = std::max(amax, std::fabs(v[i]));
      }
      const float d = amax / 127.f;
      const float id = d != 0.f ? 1.f / d : 0.f;
      int8_t* q = xq + m * K + b * kGGUFBlock;
      int sum = 0;
      for (int i = 0; i < kGGUFBlock; ++i) {
        const float r = std::min(127.f, std::max(-127.f, std::nearbyint(v[i] * id)));
        q[i] = int8_t(r);
        sum += int(r);
      }
      xd[m * nb + b] = d;
      xs[m * nb + b] = float(sum);
    }
  }
}

static void quantize_x_k(int dtype, const void* x, int64_t x_stride, int64_t K, int64_t m0, int64_t m1, int8_t* xq,
                         float* xd, float* xs) {
  switch (dtype) {
    case kFloat32: quantize_rows<float>(x, x_stride, K, m0, m1, xq, xd, xs); break;
    case kBFloat16: quantize_rows<bf16_t>(x, x_stride, K, m0, m1, xq, xd, xs); break;
    default: quantize_rows<f16_t>(x, x_stride, K, m0, m1, xq, xd, xs); break;
  }
}

// Planar row layout (gguf.h): the quants of every block, then the blocks' f16 scales, then (Q4_1) their mins.
template <int QT>
struct Fmt {
  static constexpr int qbytes = QT == kGGUF_Q8_0 ? 32 : QT == kGGUF_Q5_0 ? 20 : 16;  // quant bytes per block
};

#if KESTREL_GGUF_LEVEL > 0
// 32 weights of a block as bytes for the unsigned operand, in x's order (Q4: low nibbles, then high nibbles).
// The nibble split uses a broadcast load and a per-lane shift (no shuffle-port instruction).
template <int QT>
static inline __m256i block_u8(const uint8_t* q, __m256i& w_signed) {
  if constexpr (QT == kGGUF_Q8_0) {
    w_signed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    return _mm256_sign_epi8(w_signed, w_signed);
  } else if constexpr (QT == kGGUF_Q5_0) {  // q: 4 bytes qh, then the 16 nibble bytes
    uint32_t h;
    std::memcpy(&h, q, 4);
    // byte k of the vector gets qh's byte k / 8, then its bit k % 8 -> 0x10
    const __m256i sel = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201ULL));
    const __m256i hv = _mm256_shuffle_epi8(_mm256_set1_epi32(int(h)), sel);
    const __m256i hi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hv, bit), bit), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(block_u8<kGGUF_Q4_0>(q + 4, w_signed), hi);
  } else {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    return _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_set_epi64x(4, 4, 0, 0)), _mm256_set1_epi8(0x0F));
  }
}

static inline __m256i dot_u8s8(__m256i u, __m256i s) {
#if KESTREL_GGUF_LEVEL == 1
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#elif KESTREL_GGUF_LEVEL == 2
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#endif
}

static inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

#endif

// The quantized x rows of a tile (MT rows from m0), their block scales and block sums: every tile's view of x.
template <int MT>
struct TileRows {
  const int8_t* xq[MT];
  const float* xd[MT];
  const float* xs[MT];
  TileRows(const GGUFParams& p, int64_t m0, int64_t nb) {
    for (int i = 0; i < MT; ++i) {
      xq[i] = p.xq + (m0 + i) * p.K;
      xd[i] = p.xd + (m0 + i) * nb;
      xs[i] = p.xs + (m0 + i) * nb;
    }
  }
};

// res[i] = sum_k W[row, k] * x[m0 + i, k] for MT rows of x.
template <int QT, int MT>
static inline void row_tile(const GGUFParams& p, const uint8_t* wrow, int64_t m0, float* res) {
  constexpr int QB = Fmt<QT>::qbytes;
  const int64_t nb = p.K / kGGUFBlock;
  const uint8_t* qs = wrow;
  const uint8_t* ds = wrow + nb * QB;
  const uint8_t* ms = ds + nb * 2;
  const TileRows<MT> x(p, m0, nb);
  const int8_t* const* xq = x.xq;
  const float* const* xd = x.xd;
  const float* const* xs = x.xs;
#if KESTREL_GGUF_LEVEL == 0
  for (int i = 0; i < MT; ++i) res[i] = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const float dw = f16_at(ds + 2 * b);
    int8_t w[kGGUFBlock];
    if constexpr (QT == kGGUF_Q8_0) {
      std::memcpy(w, qs + b * QB, kGGUFBlock);
    } else if constexpr (QT == kGGUF_Q5_0) {
      uint32_t h;
      std::memcpy(&h, qs + b * QB, 4);
      for (int j = 0; j < 16; ++j) {
        const uint8_t byte = qs[b * QB + 4 + j];
        w[j] = int8_t((byte & 0x0F) | ((h >> j) & 1) << 4);
        w[j + 16] = int8_t((byte >> 4) | ((h >> (j + 16)) & 1) << 4);
      }
    } else {
      for (int j = 0; j < 16; ++j) {
        const uint8_t byte = qs[b * QB + j];
        w[j] = int8_t(byte & 0x0F);
        w[j + 16] = int8_t(byte >> 4);
      }
    }
    for (int i = 0; i < MT; ++i) {
      const int8_t* q = xq[i] + b * kGGUFBlock;
      int32_t dot = 0;
      for (int j = 0; j < kGGUFBlock; ++j) dot += int32_t(w[j]) * int32_t(q[j]);
      const float dd = dw * xd[i][b];
      float r = float(dot) * dd;
      if constexpr (QT == kGGUF_Q4_0) r -= 8.f * dd * xs[i][b];
      if constexpr (QT == kGGUF_Q5_0) r -= 16.f * dd * xs[i][b];
      if constexpr (QT == kGGUF_Q4_1) r += f16_at(ms + 2 * b) * (xd[i][b] * xs[i][b]);
      res[i] += r;
    }
  }
#else
  // Per group of 8 blocks: the 8 scale products d_w d_x in one vector op (from the planar scales), parked in a
  // small stack buffer and broadcast from there per block (a load, not a shuffle); the offsets of Q4_0 / Q4_1 as
  // vectors too. Per block and x row then: dot, convert, fmadd.
  // Two accumulator chains per x row (even / odd blocks of a group) against the fmadd latency; the same for every
  // MT, so that a row's sum has one order whatever M (batch invariance: a row's bits do not depend on the others).
  constexpr int NC = 2;
  __m256 acc[NC][MT], corr[MT];
  for (int i = 0; i < MT; ++i) {
    corr[i] = _mm256_setzero_ps();
    for (int c = 0; c < NC; ++c) acc[c][i] = _mm256_setzero_ps();
  }
  alignas(32) float dd[MT][8];
  float corr_tail[MT] = {};
  for (int64_t g = 0; g < nb; g += 8) {
    const int n = int(std::min<int64_t>(8, nb - g));
    if (n == 8) {
      const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ds + 2 * g)));
      __m256 mw = _mm256_setzero_ps();
      if constexpr (QT == kGGUF_Q4_1) mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ms + 2 * g)));
      for (int i = 0; i < MT; ++i) {
        const __m256 dx = _mm256_loadu_ps(xd[i] + g);
        const __m256 d = _mm256_mul_ps(dw, dx);
        _mm256_store_ps(dd[i], d);
        if constexpr (QT == kGGUF_Q4_0 || QT == kGGUF_Q5_0)
          corr[i] = _mm256_fmadd_ps(d, _mm256_loadu_ps(xs[i] + g), corr[i]);
        if constexpr (QT == kGGUF_Q4_1)
          corr[i] = _mm256_fmadd_ps(mw, _mm256_mul_ps(dx, _mm256_loadu_ps(xs[i] + g)), corr[i]);
      }
    } else {  // the last < 8 blocks of the row: the same products, one at a time (no over-read)
      for (int j = 0; j < n; ++j) {
        const float dw = f16_at(ds + 2 * (g + j));
        for (int i = 0; i < MT; ++i) {
          dd[i][j] = dw * xd[i][g + j];
          if constexpr (QT == kGGUF_Q4_0 || QT == kGGUF_Q5_0) corr_tail[i] += dd[i][j] * xs[i][g + j];
          if constexpr (QT == kGGUF_Q4_1) corr_tail[i] += f16_at(ms + 2 * (g + j)) * (xd[i][g + j] * xs[i][g + j]);
        }
      }
    }
    auto step = [&](int j, __m256* acc) {
      const int64_t b = g + j;
      __m256i ws = _mm256_setzero_si256();
      const __m256i wu = block_u8<QT>(qs + b * QB, ws);
      for (int i = 0; i < MT; ++i) {
        __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[i] + b * kGGUFBlock));
        if constexpr (QT == kGGUF_Q8_0) xv = _mm256_sign_epi8(xv, ws);
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(wu, xv)), _mm256_broadcast_ss(&dd[i][j]), acc[i]);
      }
    };
    if (n == 8) {
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) step(j, acc[j % NC]);
    } else {
      for (int j = 0; j < n; ++j) step(j, acc[0]);
    }
  }
  for (int i = 0; i < MT; ++i) {
    __m256 t = acc[0][i];
    for (int c = 1; c < NC; ++c) t = _mm256_add_ps(t, acc[c][i]);
    float r = hsum256(t);
    if constexpr (QT == kGGUF_Q4_0) r -= 8.f * (hsum256(corr[i]) + corr_tail[i]);
    if constexpr (QT == kGGUF_Q5_0) r -= 16.f * (hsum256(corr[i]) + corr_tail[i]);
    if constexpr (QT == kGGUF_Q4_1) r += hsum256(corr[i]) + corr_tail[i];
    res[i] = r;
  }
#endif
}

#if KESTREL_GGUF_LEVEL == 3
// The avx512vnni level's Q4_0 / Q4_1 / Q8_0 rows: two blocks per zmm (the planar layout puts block b + 1's quants
// right after block b's, and x's blocks are contiguous too), so a pair of blocks costs one load of each, one
// vpdpbusd, one conversion and one fmadd with a scale vector [d_b x 8, d_b+1 x 8] permuted from the group's 8
// scale products (no stack round trip). Q8_0's sign trick without vpsignb on zmm: |w| by vpabsb, x negated where
// w < 0 by a masked subtract (mask = w's sign bits). On the 2-core Zen 5 dev VM (full-width AVX-512) this is ~1.9x
// fewer uops per block than the ymm path, which the GEMV needs to keep up with DRAM (docs/benchmarks/
// cpu_gguf_models_2026-12-03.md). The order of the sums is the same for every MT (batch invariance); a last group
// of fewer than 8 blocks runs the ymm steps of row_tile into an accumulator of its own.
template <int QT>
static inline __m512i pair_u8(const uint8_t* q, __mmask64& neg) {
  if constexpr (QT == kGGUF_Q8_0) {
    const __m512i w = _mm512_loadu_si512(q);
    neg = _mm512_movepi8_mask(w);
    return _mm512_abs_epi8(w);
  } else {  // 2 x 16 nibble bytes -> 128-bit lanes [b, b, b+1, b+1], the second of each pair shifted down by 4
    const __m512i v = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
    const __m512i z = _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(1, 1, 0, 0));
    return _mm512_and_si512(_mm512_srlv_epi64(z, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0)), _mm512_set1_epi8(0x0F));
  }
}

// What the zmm tiles (row_tile_pairs, row_tile_quads) share beside TileRows.
// Blocks g..g+7: each row's d_w x d_x in the low half of dd, and the offset terms of Q4_0 (-8 x sum x) and Q4_1
// (m x sum x) added into corr.
template <int QT, int MT>
static inline void group_scales(const uint8_t* ds, const uint8_t* ms, int64_t g, const TileRows<MT>& x, __m512* dd,
                                __m256* corr) {
  const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ds + 2 * g)));
  __m256 mw = _mm256_setzero_ps();
  if constexpr (QT == kGGUF_Q4_1) mw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(ms + 2 * g)));
  for (int i = 0; i < MT; ++i) {
    const __m256 dx = _mm256_loadu_ps(x.xd[i] + g);
    const __m256 d = _mm256_mul_ps(dw, dx);
    dd[i] = _mm512_castps256_ps512(d);
    if constexpr (QT == kGGUF_Q4_0) corr[i] = _mm256_fmadd_ps(d, _mm256_loadu_ps(x.xs[i] + g), corr[i]);
    if constexpr (QT == kGGUF_Q4_1)
      corr[i] = _mm256_fmadd_ps(mw, _mm256_mul_ps(dx, _mm256_loadu_ps(x.xs[i] + g)), corr[i]);
  }
}

// The last < 8 blocks, one at a time in ymm (as row_tile's tail; x in its own order there), then each row's sum:
// the two zmm accumulators, the tail's, and the offset terms.
template <int QT, int MT>
static inline void finish_tile(const uint8_t* qs, const uint8_t* ds, const uint8_t* ms, int64_t full, int64_t nb,
                               const TileRows<MT>& x, const __m512 (&acc)[2][MT], const __m256* corr, float* res) {
  constexpr int QB = Fmt<QT>::qbytes;
  __m256 acct[MT];
  float corr_tail[MT] = {};
  for (int i = 0; i < MT; ++i) acct[i] = _mm256_setzero_ps();
  for (int64_t b = full; b < nb; ++b) {
    const float dwf = f16_at(ds + 2 * b);
    __m256i ws = _mm256_setzero_si256();
    const __m256i wu = block_u8<QT>(qs + b * QB, ws);
    for (int i = 0; i < MT; ++i) {
      const float d = dwf * x.xd[i][b];
      if constexpr (QT == kGGUF_Q4_0) corr_tail[i] += d * x.xs[i][b];
      if constexpr (QT == kGGUF_Q4_1) corr_tail[i] += f16_at(ms + 2 * b) * (x.xd[i][b] * x.xs[i][b]);
      __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.xq[i] + b * kGGUFBlock));
      if constexpr (QT == kGGUF_Q8_0) xv = _mm256_sign_epi8(xv, ws);
      acct[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8s8(wu, xv)), _mm256_set1_ps(d), acct[i]);
    }
  }
  for (int i = 0; i < MT; ++i) {
    float r = _mm512_reduce_add_ps(_mm512_add_ps(acc[0][i], acc[1][i])) + hsum256(acct[i]);
    if constexpr (QT == kGGUF_Q4_0) r -= 8.f * (hsum256(corr[i]) + corr_tail[i]);
    if constexpr (QT == kGGUF_Q4_1) r += hsum256(corr[i]) + corr_tail[i];
    res[i] = r;
  }
}

template <int QT, int MT>
static inline void row_tile_pairs(const GGUFParams& p, const uint8_t* wrow, int64_t m0, float* res) {
  constexpr int QB = Fmt<QT>::qbytes;
  const int64_t nb = p.K / kGGUFBlock;
  const uint8_t* qs = wrow;
  const uint8_t* ds = wrow + nb * QB;
  const uint8_t* ms = ds + nb * 2;
  const TileRows<MT> x(p, m0, nb);
  constexpr int NC = 2;
  __m512 acc[NC][MT];
  __m256 corr[MT];
  for (int i = 0; i < MT; ++i) {
    corr[i] = _mm256_setzero_ps();
    for (int c = 0; c < NC; ++c) acc[c][i] = _mm512_setzero_ps();
  }
  const __m512i pick[4] = {_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                           _mm512_set_epi32(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2),
                           _mm512_set_epi32(5, 5, 5, 5, 5, 5, 5, 5, 4, 4, 4, 4, 4, 4, 4, 4),
                           _mm512_set_epi32(7, 7, 7, 7, 7, 7, 7, 7, 6, 6, 6, 6, 6, 6, 6, 6)};
  const int64_t full = nb / 8 * 8;
  for (int64_t g = 0; g < full; g += 8) {
    __m512 dd[MT];
    group_scales<QT, MT>(ds, ms, g, x, dd, corr);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const int64_t b = g + 2 * j;
      __mmask64 neg = 0;
      const __m512i wu = pair_u8<QT>(qs + b * QB, neg);
      for (int i = 0; i < MT; ++i) {
        __m512i xv = _mm512_loadu_si512(x.xq[i] + b * kGGUFBlock);
        if constexpr (QT == kGGUF_Q8_0) xv = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
        const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wu, xv));
        acc[j % NC][i] = _mm512_fmadd_ps(dot, _mm512_permutexvar_ps(pick[j], dd[i]), acc[j % NC][i]);
      }
    }
  }
  finish_tile<QT, MT>(qs, ds, ms, full, nb, x, acc, corr, res);
}
#endif

#if KESTREL_GGUF_LEVEL == 3
// Q4_0 / Q4_1 at the avx512vnni level, four blocks per zmm: 64 bytes of planar quants are blocks b..b+3's nibble
// bytes, so `& 0x0F` gives their weights 0-15 and `>> 4 & 0x0F` their weights 16-31, each block in its own 128-bit
// lane, with no shuffle. x meets them in that order: gemv_typed permutes each call's quantized x once per chunk
// (permute_x_quads: per 4 blocks, the four first halves, then the four second halves; blocks past the last whole
// group of 8 as they are), and two vpdpbusd (low, high halves) give each block's sum in its lane; one conversion,
// one fmadd with the scales [d_b x 4, .., d_b+3 x 4] (one vpermps from the group's 8). Per 4 blocks ~8 vector ops
// and one shuffle, against ~18 and 4 for two pairs (row_tile_pairs): the Zen 5 dev VM's Q4_0 GEMV was compute-bound
// per core (22-24 GB/s on one thread, 1B-Llama shapes) there.
static inline void permute_x_quads(const int8_t* x, int64_t M, int64_t K, int8_t* out) {
  const int64_t nb = K / kGGUFBlock, full = nb / 8 * 8;
  for (int64_t m = 0; m < M; ++m) {
    const int8_t* xr = x + m * K;
    int8_t* o = out + m * K;
    for (int64_t b = 0; b < full; b += 4)
      for (int i = 0; i < 4; ++i) {
        std::memcpy(o + b * kGGUFBlock + 16 * i, xr + (b + i) * kGGUFBlock, 16);
        std::memcpy(o + b * kGGUFBlock + 64 + 16 * i, xr + (b + i) * kGGUFBlock + 16, 16);
      }
    std::memcpy(o + full * kGGUFBlock, xr + full * kGGUFBlock, size_t((nb - full) * kGGUFBlock));
  }
}

template <int QT, int MT>
static inline void row_tile_quads(const GGUFParams& p, const uint8_t* wrow, int64_t m0, float* res) {
  static_assert(QT == kGGUF_Q4_0 || QT == kGGUF_Q4_1, "nibble types of 16 quant bytes per block");
  const int64_t nb = p.K / kGGUFBlock;
  const uint8_t* qs = wrow;
  const uint8_t* ds = wrow + nb * 16;
  const uint8_t* ms = ds + nb * 2;
  const TileRows<MT> x(p, m0, nb);  // x's quants permuted (permute_x_quads)
  __m512 acc[2][MT];
  __m256 corr[MT];
  for (int i = 0; i < MT; ++i) {
    corr[i] = _mm256_setzero_ps();
    acc[0][i] = acc[1][i] = _mm512_setzero_ps();
  }
  const __m512i pick[2] = {_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                           _mm512_set_epi32(7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4)};
  const __m512i m0f = _mm512_set1_epi8(0x0F);
  const int64_t full = nb / 8 * 8;
  for (int64_t g = 0; g < full; g += 8) {
    __m512 dd[MT];
    group_scales<QT, MT>(ds, ms, g, x, dd, corr);
#pragma GCC unroll 2
    for (int qd = 0; qd < 2; ++qd) {
      const int64_t b = g + 4 * qd;
      const __m512i v = _mm512_loadu_si512(qs + b * 16);
      const __m512i lo = _mm512_and_si512(v, m0f);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m0f);
      for (int i = 0; i < MT; ++i) {
        const int8_t* xp = x.xq[i] + b * kGGUFBlock;
        __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xp));
        s = _mm512_dpbusd_epi32(s, hi, _mm512_loadu_si512(xp + 64));
        acc[qd][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_permutexvar_ps(pick[qd], dd[i]), acc[qd][i]);
      }
    }
  }
  finish_tile<QT, MT>(qs, ds, ms, full, nb, x, acc, corr, res);
}
#endif

// ---- K-quants: super-blocks of 256 weights in the file's layout (gguf.h) ----

// Q4_K / Q5_K: the 12 bytes of packed 6-bit scales -> sc[8], mn[8]. Bytes 0-3 hold sc[0-3] in their low 6 bits,
// bytes 4-7 mn[0-3]; sc[4-7] / mn[4-7] take their low 4 bits from the low / high nibble of bytes 8-11 and their top
// 2 bits from the top 2 bits of bytes 0-3 / 4-7.
static inline void kscales(const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    mn[j] = s[j + 4] & 63;
    sc[j + 4] = uint8_t((s[j + 8] & 0x0F) | (s[j] >> 6) << 4);
    mn[j + 4] = uint8_t((s[j + 8] >> 4) | (s[j + 4] >> 6) << 4);
  }
}

template <int QT>
struct KFmt;
template <>
struct KFmt<kGGUF_Q4_K> {
  static constexpr int size = 144, qs = 16;
};
template <>
struct KFmt<kGGUF_Q5_K> {
  static constexpr int size = 176, qh = 16, qs = 48;
};
template <>
struct KFmt<kGGUF_Q6_K> {
  static constexpr int size = 210, ql = 0, qh = 128, sc = 192, d = 208;
};

// The 256 quants of a super-block as integers in x's order (Q4_K / Q5_K: 0..15 / 0..31; Q6_K: -32..31), and its
// scales: Q4_K / Q5_K w = a[t] q - b[t] per sub-block t of 32, Q6_K w = a[g] q per group g of 16.
template <int QT>
static inline void kdecode(const uint8_t* blk, int8_t* q, float* a, float* b) {
  if constexpr (QT == kGGUF_Q6_K) {
    const float d = f16_at(blk + KFmt<QT>::d);
    for (int g = 0; g < 16; ++g) a[g] = d * float(int8_t(blk[KFmt<QT>::sc + g]));
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 32; ++l) {
        const uint8_t l0 = blk[KFmt<QT>::ql + 64 * h + l], l1 = blk[KFmt<QT>::ql + 64 * h + 32 + l];
        const uint8_t hb = blk[KFmt<QT>::qh + 32 * h + l];
        int8_t* o = q + 128 * h + l;
        o[0] = int8_t(((l0 & 0x0F) | (hb & 3) << 4) - 32);
        o[32] = int8_t(((l1 & 0x0F) | ((hb >> 2) & 3) << 4) - 32);
        o[64] = int8_t(((l0 >> 4) | ((hb >> 4) & 3) << 4) - 32);
        o[96] = int8_t(((l1 >> 4) | ((hb >> 6) & 3) << 4) - 32);
      }
  } else {
    const float d = f16_at(blk), dmin = f16_at(blk + 2);
    uint8_t sc[8], mn[8];
    kscales(blk + 4, sc, mn);
    for (int t = 0; t < 8; ++t) {
      a[t] = d * float(sc[t]);
      b[t] = dmin * float(mn[t]);
    }
    const uint8_t* qs = blk + KFmt<QT>::qs;
    for (int t = 0; t < 8; ++t)
      for (int l = 0; l < 32; ++l) {
        int v = t % 2 == 0 ? qs[32 * (t / 2) + l] & 0x0F : qs[32 * (t / 2) + l] >> 4;
        if constexpr (QT == kGGUF_Q5_K) v |= ((blk[KFmt<QT>::qh + l] >> t) & 1) << 4;
        q[32 * t + l] = int8_t(v);
      }
  }
}

#if KESTREL_GGUF_LEVEL > 0
// The 8 sub-blocks of 32 quants of a super-block as byte vectors in x's order: wu unsigned (Q4_K 0..15, Q5_K 0..31;
// Q6_K |q - 32|), ws (Q6_K only) the signed q - 32.
template <int QT>
static inline void kquants(const uint8_t* blk, __m256i* wu, __m256i* ws) {
  const __m256i m0f = _mm256_set1_epi8(0x0F);
  if constexpr (QT == kGGUF_Q6_K) {
    const __m256i m30 = _mm256_set1_epi8(0x30), off = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; ++h) {
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + KFmt<QT>::ql + 64 * h));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + KFmt<QT>::ql + 64 * h + 32));
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + KFmt<QT>::qh + 32 * h));
      // bits 2s, 2s + 1 of qh -> bits 4, 5 (16-bit shifts: the mask drops what crosses a byte)
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(l0, m0f), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30)),
          _mm256_or_si256(_mm256_and_si256(l1, m0f), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m0f), _mm256_and_si256(hb, m30)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m0f),
                          _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30))};
      for (int s = 0; s < 4; ++s) {
        ws[4 * h + s] = _mm256_sub_epi8(q[s], off);
        wu[4 * h + s] = _mm256_sign_epi8(ws[4 * h + s], ws[4 * h + s]);
      }
    }
  } else {
    const uint8_t* qs = blk + KFmt<QT>::qs;
    for (int c = 0; c < 4; ++c) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      wu[2 * c] = _mm256_and_si256(v, m0f);
      wu[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f);
    }
    if constexpr (QT == kGGUF_Q5_K) {
      __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + KFmt<QT>::qh));
      const __m256i m10 = _mm256_set1_epi8(0x10);
      for (int t = 0; t < 8; ++t) {  // bit t of each byte -> 0x10 (16-bit shifts: the mask drops what crosses)
        wu[t] = _mm256_or_si256(wu[t], _mm256_and_si256(_mm256_slli_epi16(hb, 4), m10));
        hb = _mm256_srli_epi16(hb, 1);
      }
    }
  }
}

// Integer dot of 32 u8 x 32 s8 with Q6_K's two scale groups: int32 lanes 0-3 carry bytes 0-15 times sc16's low
// half, lanes 4-7 bytes 16-31 times its high half (int16 scales).
static inline __m256i dot_u8s8_scaled(__m256i u, __m256i s, __m256i sc16) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), sc16);
}
#endif

// res[i] = sum_k W[row, k] * x[m0 + i, k] for MT rows of x, W a row of K-quant super-blocks.
template <int QT, int MT>
static inline void row_tile_k(const GGUFParams& p, const uint8_t* wrow, int64_t m0, float* res) {
  constexpr int SZ = KFmt<QT>::size;
  const int64_t nsb = p.K / kGGUFSuper, nb = p.K / kGGUFBlock;
  const TileRows<MT> x(p, m0, nb);
  const int8_t* const* xq = x.xq;
  const float* const* xd = x.xd;
  const float* const* xs = x.xs;
#if KESTREL_GGUF_LEVEL == 0
  for (int i = 0; i < MT; ++i) res[i] = 0.f;
  for (int64_t sb = 0; sb < nsb; ++sb) {
    int8_t w[kGGUFSuper];
    float a[16], b[8];
    kdecode<QT>(wrow + sb * SZ, w, a, b);
    for (int i = 0; i < MT; ++i) {
      float r = 0.f;
      for (int t = 0; t < 8; ++t) {
        const int8_t* q = xq[i] + sb * kGGUFSuper + 32 * t;
        const float dx = xd[i][sb * 8 + t];
        if constexpr (QT == kGGUF_Q6_K) {
          int32_t d0 = 0, d1 = 0;
          for (int l = 0; l < 16; ++l) d0 += int32_t(w[32 * t + l]) * int32_t(q[l]);
          for (int l = 16; l < 32; ++l) d1 += int32_t(w[32 * t + l]) * int32_t(q[l]);
          const uint8_t* sc = wrow + sb * SZ + KFmt<QT>::sc + 2 * t;
          const int32_t s0 = int8_t(sc[0]), s1 = int8_t(sc[1]);
          r += float(s0 * d0 + s1 * d1) * (f16_at(wrow + sb * SZ + KFmt<QT>::d) * dx);
        } else {
          int32_t dot = 0;
          for (int l = 0; l < 32; ++l) dot += int32_t(w[32 * t + l]) * int32_t(q[l]);
          r += float(dot) * (a[t] * dx) - b[t] * (dx * xs[i][sb * 8 + t]);
        }
      }
      res[i] += r;
    }
  }
#else
  // Per super-block: the 8 sub-blocks' scale products (d sc[t] d_x, Q6_K: d d_x) in one vector op, parked in a
  // stack buffer and broadcast per sub-block; the mins as a vector FMA. Per sub-block and x row: dot, convert, fmadd
  // (two accumulator chains, even / odd sub-blocks; the same for every MT: batch invariance, as row_tile).
  constexpr int NC = 2;
  __m256 acc[NC][MT], corr[MT];
  for (int i = 0; i < MT; ++i) {
    corr[i] = _mm256_setzero_ps();
    for (int c = 0; c < NC; ++c) acc[c][i] = _mm256_setzero_ps();
  }
  alignas(32) float dd[MT][8];
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = wrow + sb * SZ;
    const int64_t xb = sb * 8;  // first x block of the super-block
    __m256i wu[8];  // the 8 sub-blocks' quants, unsigned operand
    __m256i ws[8];  // Q6_K: the signed quants (x takes their sign)
    kquants<QT>(blk, wu, ws);
    if constexpr (QT == kGGUF_Q6_K) {
      const __m256 d = _mm256_set1_ps(f16_at(blk + KFmt<QT>::d));
      for (int i = 0; i < MT; ++i) _mm256_store_ps(dd[i], _mm256_mul_ps(d, _mm256_loadu_ps(xd[i] + xb)));
    } else {
      uint8_t sc[8], mn[8];
      kscales(blk + 4, sc, mn);
      const __m256 dsc = _mm256_mul_ps(_mm256_set1_ps(f16_at(blk)),
                                       _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                                           reinterpret_cast<const __m128i*>(sc)))));
      const __m256 dmn = _mm256_mul_ps(_mm256_set1_ps(f16_at(blk + 2)),
                                       _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                                           reinterpret_cast<const __m128i*>(mn)))));
      for (int i = 0; i < MT; ++i) {
        const __m256 dx = _mm256_loadu_ps(xd[i] + xb);
        _mm256_store_ps(dd[i], _mm256_mul_ps(dsc, dx));
        corr[i] = _mm256_fmadd_ps(dmn, _mm256_mul_ps(dx, _mm256_loadu_ps(xs[i] + xb)), corr[i]);
      }
    }
#pragma GCC unroll 8
    for (int t = 0; t < 8; ++t) {
      __m256i sc16 = _mm256_setzero_si256();
      if constexpr (QT == kGGUF_Q6_K)
        sc16 = _mm256_set_m128i(_mm_set1_epi16(int8_t(blk[KFmt<QT>::sc + 2 * t + 1])),
                                _mm_set1_epi16(int8_t(blk[KFmt<QT>::sc + 2 * t])));
      for (int i = 0; i < MT; ++i) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[i] + (xb + t) * kGGUFBlock));
        __m256i dot;
        if constexpr (QT == kGGUF_Q6_K)
          dot = dot_u8s8_scaled(wu[t], _mm256_sign_epi8(xv, ws[t]), sc16);
        else
          dot = dot_u8s8(wu[t], xv);
        acc[t % NC][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcast_ss(&dd[i][t]), acc[t % NC][i]);
      }
    }
  }
  for (int i = 0; i < MT; ++i) {
    __m256 t = acc[0][i];
    for (int c = 1; c < NC; ++c) t = _mm256_add_ps(t, acc[c][i]);
    float r = hsum256(t);
    if constexpr (QT != kGGUF_Q6_K) r -= hsum256(corr[i]);
    res[i] = r;
  }
#endif
}

template <class T>
static inline void store_out(const GGUFParams& p, int64_t m, int64_t n, float v) {
  if (p.bias) v += to_f32(static_cast<const T*>(p.bias)[n]);
  static_cast<T*>(p.out)[m * p.out_stride + n] = from_f32<T>(v);
}

// Rows ahead whose bytes are prefetched: decode streams the weights from DRAM, and a row's work (~20-100 ns) is too
// short for the hardware prefetchers alone to keep the stream ahead (measured, 120 SmolLM2-shaped GEMVs in a row on
// one core: 6 GB/s without, the bfloat16 kernel's ~12 GB/s with).
// 8 KiB, not 4: on the 2-core Zen 5 dev VM (1B-Llama shapes, 2 threads, weights out of cache) Q8_0 25-29 -> 31-36 GB/s
// and Q4_0 (zmm pairs) 26-30 -> 29-34 GB/s; 12 and 16 KiB measured below 8 there. Into L2 (prefetcht2): the L1's
// miss buffers are too few for a stream 8 KiB ahead; measured 2026-12-04 on that VM (docs/benchmarks/
// cpu_gguf_gemv_bench.py, 2 threads), gate_up / down: Q8_0 39.2 / 30.6 GB/s with prefetcht0, 52.5 / 47.0 with
// prefetcht2; Q4_0 34.3 / 29.5 -> 35.8 / 36.9 (4 and 16 KiB ahead: no better).
constexpr int64_t kPrefetchBytes = 8192;

template <int QT, int MT>
static inline void tile(const GGUFParams& p, const uint8_t* wrow, int64_t m0, float* res) {
  if constexpr (gguf_is_kquant(QT))
    row_tile_k<QT, MT>(p, wrow, m0, res);
#if KESTREL_GGUF_LEVEL == 3
  else if constexpr (QT == kGGUF_Q4_0 || QT == kGGUF_Q4_1)
    row_tile_quads<QT, MT>(p, wrow, m0, res);  // p.xq permuted by gemv_typed
  else if constexpr (QT == kGGUF_Q8_0)
    row_tile_pairs<QT, MT>(p, wrow, m0, res);
#endif
  else
    row_tile<QT, MT>(p, wrow, m0, res);
}

template <int QT, class T>
static void gemv_rows(const GGUFParams& p, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* wrow = p.w + n * p.row_bytes;
#if KESTREL_GGUF_LEVEL > 0
    const uint8_t* end = p.w + n1 * p.row_bytes;
    for (const uint8_t* a = wrow + kPrefetchBytes; a < wrow + kPrefetchBytes + p.row_bytes && a < end; a += 64)
      _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T2);
#endif
    int64_t m = 0;
    float res[4];
    for (; m + 4 <= p.M; m += 4) {
      tile<QT, 4>(p, wrow, m, res);
      for (int i = 0; i < 4; ++i) store_out<T>(p, m + i, n, res[i]);
    }
    switch (p.M - m) {
      case 3: tile<QT, 3>(p, wrow, m, res); break;
      case 2: tile<QT, 2>(p, wrow, m, res); break;
      case 1: tile<QT, 1>(p, wrow, m, res); break;
      default: break;
    }
    for (int64_t i = 0; m + i < p.M; ++i) store_out<T>(p, m + i, n, res[i]);
  }
}

template <int QT, class T>
static void gemv_typed(const GGUFParams& p, int64_t n0, int64_t n1) {
#if KESTREL_GGUF_LEVEL == 3
  if constexpr (QT == kGGUF_Q4_0 || QT == kGGUF_Q4_1) {
    // row_tile_quads reads x in its quad order: permuted once per chunk of rows into this thread's buffer
    // (M * K bytes, a few KiB at decode sizes: small beside the chunk's weight rows)
    thread_local int8_t* buf = nullptr;
    thread_local size_t cap = 0;
    const size_t need = size_t(p.M * p.K);
    if (need > cap) {
      int8_t* grown = static_cast<int8_t*>(std::realloc(buf, need));
      if (grown == nullptr) std::abort();  // a pool chunk must not throw (gemm_pool.h); M * K bytes
      buf = grown;
      cap = need;
    }
    permute_x_quads(p.xq, p.M, p.K, buf);
    GGUFParams q = p;
    q.xq = buf;
    gemv_rows<QT, T>(q, n0, n1);
    return;
  }
#endif
  gemv_rows<QT, T>(p, n0, n1);
}

template <int QT>
static void gemv_q(const GGUFParams& p, int64_t n0, int64_t n1) {
  switch (p.dtype) {
    case kFloat32: gemv_typed<QT, float>(p, n0, n1); break;
    case kBFloat16: gemv_typed<QT, bf16_t>(p, n0, n1); break;
    default: gemv_typed<QT, f16_t>(p, n0, n1); break;
  }
}

static void gemv_k(const GGUFParams& p, int64_t n0, int64_t n1) {
  switch (p.qtype) {
    case kGGUF_Q4_0: gemv_q<kGGUF_Q4_0>(p, n0, n1); break;
    case kGGUF_Q4_1: gemv_q<kGGUF_Q4_1>(p, n0, n1); break;
    case kGGUF_Q5_0: gemv_q<kGGUF_Q5_0>(p, n0, n1); break;
    case kGGUF_Q4_K: gemv_q<kGGUF_Q4_K>(p, n0, n1); break;
    case kGGUF_Q5_K: gemv_q<kGGUF_Q5_K>(p, n0, n1); break;
    case kGGUF_Q6_K: gemv_q<kGGUF_Q6_K>(p, n0, n1); break;
    default: gemv_q<kGGUF_Q8_0>(p, n0, n1); break;
  }
}

// Dequantization of planar rows: w = d * q (+ m; Q4_0: d * q - 8 d, exact as d * (q - 8)), rounded once to T.
template <int QT, class T>
static void dequant_typed(const uint8_t* w, int64_t row_bytes, int64_t K, int64_t n0, int64_t n1, T* out) {
  constexpr int QB = Fmt<QT>::qbytes;
  const int64_t nb = K / kGGUFBlock;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* qs = w + n * row_bytes;
    const uint8_t* ds = qs + nb * QB;
    T* o = out + (n - n0) * K;
    for (int64_t b = 0; b < nb; ++b) {
      const float d = f16_at(ds + 2 * b);
      T* ob = o + b * kGGUFBlock;
      if constexpr (QT == kGGUF_Q8_0) {
        const int8_t* q = reinterpret_cast<const int8_t*>(qs + b * QB);
        for (int j = 0; j < kGGUFBlock; ++j) ob[j] = from_f32<T>(d * float(q[j]));
      } else if constexpr (QT == kGGUF_Q5_0) {
        uint32_t h;
        std::memcpy(&h, qs + b * QB, 4);
        for (int j = 0; j < 16; ++j) {
          const uint8_t byte = qs[b * QB + 4 + j];
          ob[j] = from_f32<T>(d * float((byte & 0x0F) | ((h >> j) & 1) << 4) - 16.f * d);
          ob[j + 16] = from_f32<T>(d * float((byte >> 4) | ((h >> (j + 16)) & 1) << 4) - 16.f * d);
        }
      } else {
        const float m = QT == kGGUF_Q4_1 ? f16_at(ds + nb * 2 + 2 * b) : -8.f * d;
        for (int j = 0; j < 16; ++j) {
          const uint8_t byte = qs[b * QB + j];
          ob[j] = from_f32<T>(d * float(byte & 0x0F) + m);
          ob[j + 16] = from_f32<T>(d * float(byte >> 4) + m);
        }
      }
    }
  }
}

#if KESTREL_GGUF_LEVEL > 0
// 16 floats (two vectors) -> T, stored (bfloat16: round to nearest even; finite values, as dequantized weights are).
static inline void store16(float* o, __m256 a, __m256 b) {
  _mm256_storeu_ps(o, a);
  _mm256_storeu_ps(o + 8, b);
}
static inline void store16(f16_t* o, __m256 a, __m256 b) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(o), _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 8), _mm256_cvtps_ph(b, _MM_FROUND_TO_NEAREST_INT));
}
static inline __m256i bf16_bits(__m256 v) {  // the rounded bfloat16 in the low half of each 32-bit lane
  const __m256i u = _mm256_castps_si256(v);
  const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(_mm256_srli_epi32(u, 16),
                                                                                      _mm256_set1_epi32(1)));
  return _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
}
static inline void store16(bf16_t* o, __m256 a, __m256 b) {
  // packus works within 128-bit lanes: [a0-3 b0-3 | a4-7 b4-7] -> reorder the 64-bit quarters
  const __m256i packed = _mm256_packus_epi32(bf16_bits(a), bf16_bits(b));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), _mm256_permute4x64_epi64(packed, _MM_SHUFFLE(3, 1, 2, 0)));
}

template <int QT, class T>
static void dequant_simd(const uint8_t* w, int64_t row_bytes, int64_t K, int64_t n0, int64_t n1, T* out) {
  constexpr int QB = Fmt<QT>::qbytes;
  const int64_t nb = K / kGGUFBlock;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* qs = w + n * row_bytes;
    const uint8_t* ds = qs + nb * QB;
    T* o = out + (n - n0) * K;
    for (int64_t b = 0; b < nb; ++b) {
      const float df = f16_at(ds + 2 * b);
      const __m256 d = _mm256_set1_ps(df);
      const __m256 m = QT == kGGUF_Q4_1 ? _mm256_set1_ps(f16_at(ds + nb * 2 + 2 * b))
                       : QT == kGGUF_Q4_0 ? _mm256_set1_ps(-8.f * df)
                       : QT == kGGUF_Q5_0 ? _mm256_set1_ps(-16.f * df) : _mm256_setzero_ps();
      __m256i ws;
      const __m256i q = QT == kGGUF_Q8_0 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + b * QB))
                                         : block_u8<QT>(qs + b * QB, ws);
      const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
      const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
      __m256 f[4];
      for (int j = 0; j < 4; ++j) {
        const __m256i v = QT == kGGUF_Q8_0 ? _mm256_cvtepi8_epi32(parts[j]) : _mm256_cvtepu8_epi32(parts[j]);
        f[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), d, m);
      }
      store16(o + b * kGGUFBlock, f[0], f[1]);
      store16(o + b * kGGUFBlock + 16, f[2], f[3]);
    }
  }
}
#endif

// K-quant rows: w = a q - b per sub-block (Q6_K: a q per group of 16), rounded once to T (the scalar level; the SIMD
// levels unpack with kquants: dequant_kq_simd).
template <int QT, class T>
static void dequant_kq(const uint8_t* w, int64_t row_bytes, int64_t K, int64_t n0, int64_t n1, T* out) {
  const int64_t nsb = K / kGGUFSuper;
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t sb = 0; sb < nsb; ++sb) {
      int8_t q[kGGUFSuper];
      float a[16], b[8];
      kdecode<QT>(w + n * row_bytes + sb * KFmt<QT>::size, q, a, b);
      T* o = out + (n - n0) * K + sb * kGGUFSuper;
      if constexpr (QT == kGGUF_Q6_K) {
        for (int j = 0; j < kGGUFSuper; ++j) o[j] = from_f32<T>(a[j / 16] * float(q[j]));
      } else {
        for (int j = 0; j < kGGUFSuper; ++j) o[j] = from_f32<T>(a[j / 32] * float(q[j]) - b[j / 32]);
      }
    }
  }
}

#if KESTREL_GGUF_LEVEL > 0
template <int QT, class T>
static void dequant_kq_simd(const uint8_t* w, int64_t row_bytes, int64_t K, int64_t n0, int64_t n1, T* out) {
  const int64_t nsb = K / kGGUFSuper;
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const uint8_t* blk = w + n * row_bytes + sb * KFmt<QT>::size;
      __m256i wu[8], ws[8];
      kquants<QT>(blk, wu, ws);
      float a[16], b[8];
      if constexpr (QT == kGGUF_Q6_K) {
        const float d = f16_at(blk + KFmt<QT>::d);
        for (int g = 0; g < 16; ++g) a[g] = d * float(int8_t(blk[KFmt<QT>::sc + g]));
      } else {
        uint8_t sc[8], mn[8];
        kscales(blk + 4, sc, mn);
        const float d = f16_at(blk), dmin = f16_at(blk + 2);
        for (int t = 0; t < 8; ++t) {
          a[t] = d * float(sc[t]);
          b[t] = dmin * float(mn[t]);
        }
      }
      T* o = out + (n - n0) * K + sb * kGGUFSuper;
      for (int t = 0; t < 8; ++t) {
        const __m256i q = QT == kGGUF_Q6_K ? ws[t] : wu[t];
        const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
        const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        __m256 f[4];
        for (int j = 0; j < 4; ++j) {
          if constexpr (QT == kGGUF_Q6_K) {  // groups of 16: a[2t] for the first two parts, a[2t + 1] after
            f[j] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(parts[j])),
                                 _mm256_set1_ps(a[2 * t + j / 2]));
          } else {
            f[j] = _mm256_fmsub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[j])), _mm256_set1_ps(a[t]),
                                   _mm256_set1_ps(b[t]));
          }
        }
        store16(o + 32 * t, f[0], f[1]);
        store16(o + 32 * t + 16, f[2], f[3]);
      }
    }
  }
}
#endif

template <class T>
static void dequant_t(int qtype, const uint8_t* w, int64_t row_bytes, int64_t K, int64_t n0, int64_t n1, T* out) {
#if KESTREL_GGUF_LEVEL > 0
  switch (qtype) {
    case kGGUF_Q4_K: return dequant_kq_simd<kGGUF_Q4_K, T>(w, row_bytes, K, n0, n1, out);
    case kGGUF_Q5_K: return dequant_kq_simd<kGGUF_Q5_K, T>(w, row_bytes, K, n0, n1, out);
    case kGGUF_Q6_K: return dequant_kq_simd<kGGUF_Q6_K, T>(w, row_bytes, K, n0, n1, out);
    default: break;
  }
  switch (qtype) {
    case kGGUF_Q4_0: dequant_simd<kGGUF_Q4_0, T>(w, row_bytes, K, n0, n1, out); break;
    case kGGUF_Q5_0: dequant_simd<kGGUF_Q5_0, T>(w, row_bytes, K, n0, n1, out); break;
    case kGGUF_Q4_1: dequant_simd<kGGUF_Q4_1, T>(w, row_bytes, K, n0, n1, out); break;
    default: dequant_simd<kGGUF_Q8_0, T>(w, row_bytes, K, n0, n1, out); break;
  }
#else
  switch (qtype) {
    case kGGUF_Q4_K: return dequant_kq<kGGUF_Q4_K, T>(w, row_bytes, K, n0, n1, out);
    case kGGUF_Q5_K: return dequant_kq<kGGUF_Q5_K, T>(w, row_bytes, K, n0, n1, out);
    case kGGUF_Q6_K: return dequant_kq<kGGUF_Q6_K, T>(w, row_bytes, K, n0, n1, out);
    case kGGUF_Q4_0: dequant_typed<kGGUF_Q4_0, T>(w, row_bytes, K, n0, n1, out); break;
    case kGGUF_Q5_0: dequant_typed<kGGUF_Q5_0, T>(w, row_bytes, K, n0, n1, out); break;
    case kGGUF_Q4_1: dequant_typed<kGGUF_Q4_1, T>(w, row_bytes, K, n0, n1, out); break;
    default: dequant_typed<kGGUF_Q8_0, T>(w, row_bytes, K, n0, n1, out); break;
  }
#endif
}

static void dequantize_k(int qtype, int dtype, const uint8_t* w, int64_t row_bytes, int64_t K, int64_t n0,
                         int64_t n1, void* out) {
  switch (dtype) {
    case kFloat32: dequant_t(qtype, w, row_bytes, K, n0, n1, static_cast<float*>(out)); break;
    case kBFloat16: dequant_t(qtype, w, row_bytes, K, n0, n1, static_cast<bf16_t*>(out)); break;
    default: dequant_t(qtype, w, row_bytes, K, n0, n1, static_cast<f16_t*>(out)); break;
  }
}

}  // namespace kestrel::cpu::KESTREL_GGUF_NS
