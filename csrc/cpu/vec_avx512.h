// 16-lane fp32 vector for AVX-512 (F, BW, VL, DQ), in the namespace of the including file's level
// (KESTREL_ISA_NS: avx512, or avx512bf16 whose file is compiled with more flags), so no inline function is
// shared between files compiled with different -m flags.
#pragma once

#include <immintrin.h>

#include <cmath>

#include "types.h"

#ifndef KESTREL_ISA_NS
#error "define KESTREL_ISA_NS before including vec_avx512.h"
#endif

namespace kestrel::cpu::KESTREL_ISA_NS {

struct Vec {
  static constexpr int W = 16;
  using R = __m512;
  static R zero() { return _mm512_setzero_ps(); }
  static R set1(float x) { return _mm512_set1_ps(x); }

  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static R load(const bf16_t* p) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static R load(const f16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static R load(const int8_t* p) {  // int8 weights (gemm_impl.h), widened exactly
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }

  // fp32 bits rounded to nearest-even bf16 (in the high 16 bits of each lane); NaN kept quiet.
  // (Integer rounding rather than AVX512-BF16's vcvtneps2bf16 so this level runs on every AVX-512 CPU.)
  static __m512i bf16_round_bits(R v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
  }

  static void store(float* p, R v) { _mm512_storeu_ps(p, v); }
  static void store(bf16_t* p, R v) {
    __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_round_bits(v), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
  }
  static void store(f16_t* p, R v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }

  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R sub(R a, R b) { return _mm512_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R div(R a, R b) { return _mm512_div_ps(a, b); }
  static R max(R a, R b) { return _mm512_max_ps(a, b); }
  static R fma(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R fnma(R a, R b, R c) { return _mm512_fnmadd_ps(a, b, c); }
  static float hsum(R v) { return _mm512_reduce_add_ps(v); }
  static float hmax(R v) { return _mm512_reduce_max_ps(v); }

  // exp(x), ~2 ulp (Cephes polynomial, scaled with vscalefps); exactly 0 below -87.
  static R exp(R x) {
    const R lo = _mm512_set1_ps(-87.0f);
    __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.3762626647949f));
    R fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    R y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_scalef_ps(keep, y, fx);
  }

  template <class T>
  static R round(R v);

  // [a0,a1,a2,a3,...] -> [a1,a0,a3,a2,...]
  static R swap_pairs(R v) { return _mm512_permute_ps(v, 0xB1); }

  // r[j] = sum of the lanes of v[j], for 16 vectors: a transposing reduction tree (~45 instructions
  // instead of 16 horizontal sums).
  static R transpose_sum(const R* v) {
    R t[8];
    for (int k = 0; k < 8; ++k)
      t[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
    R u[4];
    for (int k = 0; k < 4; ++k) {
      __m512d a = _mm512_castps_pd(t[2 * k]), b = _mm512_castps_pd(t[2 * k + 1]);
      u[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    R x0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
    R x1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(3, 1, 3, 1)));
  }
};

template <>
inline __m512 Vec::round<float>(__m512 v) {
  return v;
}
template <>
inline __m512 Vec::round<bf16_t>(__m512 v) {
  return _mm512_castsi512_ps(_mm512_and_si512(bf16_round_bits(v), _mm512_set1_epi32(int(0xffff0000u))));
}
template <>
inline __m512 Vec::round<f16_t>(__m512 v) {
  return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

}  // namespace kestrel::cpu::KESTREL_ISA_NS
