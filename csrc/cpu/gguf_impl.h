// The GGUF integer GEMV kernels (gguf.h), written once and compiled per ISA level: gguf_<level>.cpp defines
// KESTREL_GGUF_NS (a namespace of its own, so no symbol is shared between translation units compiled with
// different -m flags) and KESTREL_GGUF_LEVEL:
//   0 scalar       plain integer dot products
//   1 avx2         vpmaddubsw (u8 x s8 -> s16 pairs, no saturation here: |15 * 127 * 2|, |128 * 127 * 2| < 2^15)
//                  + vpmaddwd by ones -> 8 x s32 per block of 32
//   2 avxvnni      vpdpbusd on ymm (AVX-VNNI, VEX encoded): the same 8 x s32 in one instruction
//   3 avx512vnni   vpdpbusd on ymm with the EVEX encoding (CPUs with AVX512-VNNI but no AVX-VNNI: Cascade Lake,
//                  Ice Lake). A zmm version doing two blocks per instruction measured slower here (the two scales
//                  need a cross-lane insert per block pair), so the blocks stay 256 bits wide at every level.
// Q8_0 weights are signed: |w| goes in the unsigned operand and x takes w's sign (vpsignb).
// Per block and x row: the integer dot is converted to fp32 and accumulated with the scale d_w * d_x; Q4_0's and
// Q4_1's offsets come from the x blocks' sums of quants, as vector FMAs over 8 blocks (gguf.h).
#pragma once

#include <algorithm>
#include <cmath>
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
  static constexpr int qbytes = QT == kGGUF_Q8_0 ? 32 : 16;  // quant bytes per block
};

#if KESTREL_GGUF_LEVEL > 0
// 32 weights of a block as bytes for the unsigned operand, in x's order (Q4: low nibbles, then high nibbles).
// The nibble split uses a broadcast load and a per-lane shift (no shuffle-port instruction).
template <int QT>
static inline __m256i block_u8(const uint8_t* q, __m256i& w_signed) {
  if constexpr (QT == kGGUF_Q8_0) {
    w_signed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
    return _mm256_sign_epi8(w_signed, w_signed);
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

// res[i] = sum_k W[row, k] * x[m0 + i, k] for MT rows of x.
template <int QT, int MT>
static inline void row_tile(const GGUFParams& p, const uint8_t* wrow, int64_t m0, float* res) {
  constexpr int QB = Fmt<QT>::qbytes;
  const int64_t nb = p.K / kGGUFBlock;
  const uint8_t* qs = wrow;
  const uint8_t* ds = wrow + nb * QB;
  const uint8_t* ms = ds + nb * 2;
  const int8_t* xq[MT];
  const float* xd[MT];
  const float* xs[MT];
  for (int i = 0; i < MT; ++i) {
    xq[i] = p.xq + (m0 + i) * p.K;
    xd[i] = p.xd + (m0 + i) * nb;
    xs[i] = p.xs + (m0 + i) * nb;
  }
#if KESTREL_GGUF_LEVEL == 0
  for (int i = 0; i < MT; ++i) res[i] = 0.f;
  for (int64_t b = 0; b < nb; ++b) {
    const float dw = f16_at(ds + 2 * b);
    int8_t w[kGGUFBlock];
    if constexpr (QT == kGGUF_Q8_0) {
      std::memcpy(w, qs + b * QB, kGGUFBlock);
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
        if constexpr (QT == kGGUF_Q4_0) corr[i] = _mm256_fmadd_ps(d, _mm256_loadu_ps(xs[i] + g), corr[i]);
        if constexpr (QT == kGGUF_Q4_1)
          corr[i] = _mm256_fmadd_ps(mw, _mm256_mul_ps(dx, _mm256_loadu_ps(xs[i] + g)), corr[i]);
      }
    } else {  // the last < 8 blocks of the row: the same products, one at a time (no over-read)
      for (int j = 0; j < n; ++j) {
        const float dw = f16_at(ds + 2 * (g + j));
        for (int i = 0; i < MT; ++i) {
          dd[i][j] = dw * xd[i][g + j];
          if constexpr (QT == kGGUF_Q4_0) corr_tail[i] += dd[i][j] * xs[i][g + j];
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
    if constexpr (QT == kGGUF_Q4_1) r += hsum256(corr[i]) + corr_tail[i];
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
constexpr int64_t kPrefetchBytes = 4096;

template <int QT, class T>
static void gemv_typed(const GGUFParams& p, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* wrow = p.w + n * p.row_bytes;
#if KESTREL_GGUF_LEVEL > 0
    const uint8_t* end = p.w + n1 * p.row_bytes;
    for (const uint8_t* a = wrow + kPrefetchBytes; a < wrow + kPrefetchBytes + p.row_bytes && a < end; a += 64)
      _mm_prefetch(reinterpret_cast<const char*>(a), _MM_HINT_T0);
#endif
    int64_t m = 0;
    float res[4];
    for (; m + 4 <= p.M; m += 4) {
      row_tile<QT, 4>(p, wrow, m, res);
      for (int i = 0; i < 4; ++i) store_out<T>(p, m + i, n, res[i]);
    }
    switch (p.M - m) {
      case 3: row_tile<QT, 3>(p, wrow, m, res); break;
      case 2: row_tile<QT, 2>(p, wrow, m, res); break;
      case 1: row_tile<QT, 1>(p, wrow, m, res); break;
      default: break;
    }
    for (int64_t i = 0; m + i < p.M; ++i) store_out<T>(p, m + i, n, res[i]);
  }
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
                       : QT == kGGUF_Q4_0 ? _mm256_set1_ps(-8.f * df) : _mm256_setzero_ps();
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

template <class T>
static void dequant_t(int qtype, const uint8_t* w, int64_t row_bytes, int64_t K, int64_t n0, int64_t n1, T* out) {
#if KESTREL_GGUF_LEVEL > 0
  switch (qtype) {
    case kGGUF_Q4_0: dequant_simd<kGGUF_Q4_0, T>(w, row_bytes, K, n0, n1, out); break;
    case kGGUF_Q4_1: dequant_simd<kGGUF_Q4_1, T>(w, row_bytes, K, n0, n1, out); break;
    default: dequant_simd<kGGUF_Q8_0, T>(w, row_bytes, K, n0, n1, out); break;
  }
#else
  switch (qtype) {
    case kGGUF_Q4_0: dequant_typed<kGGUF_Q4_0, T>(w, row_bytes, K, n0, n1, out); break;
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
