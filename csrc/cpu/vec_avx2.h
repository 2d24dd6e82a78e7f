// 8-lane fp32 vector for AVX2 + FMA + F16C. Compiled only into kernels_avx2.cpp.
#pragma once

#include <immintrin.h>

#include <cmath>

#include "types.h"

namespace kestrel::cpu::avx2 {

struct Vec {
  static constexpr int W = 8;
  using R = __m256;
  static R zero() { return _mm256_setzero_ps(); }
  static R set1(float x) { return _mm256_set1_ps(x); }

  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static R load(const bf16_t* p) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static R load(const f16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static R load(const int8_t* p) {  // int8 weights (gemm_impl.h), widened exactly
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }

  // fp32 bits rounded to nearest-even bf16 (result in the high 16 bits of each lane); NaN kept quiet.
  static __m256i bf16_round_bits(R v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    __m256i qnan = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
    return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), _mm256_castsi256_ps(qnan), nan));
  }

  static void store(float* p, R v) { _mm256_storeu_ps(p, v); }
  static void store(bf16_t* p, R v) {
    __m256i r = _mm256_srli_epi32(bf16_round_bits(v), 16);
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  static void store(f16_t* p, R v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }

  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R div(R a, R b) { return _mm256_div_ps(a, b); }
  static R max(R a, R b) { return _mm256_max_ps(a, b); }
  static R fma(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R fnma(R a, R b, R c) { return _mm256_fnmadd_ps(a, b, c); }

  static float hsum(R v) {
    __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 sh = _mm_movehdup_ps(lo);
    __m128 s = _mm_add_ps(lo, sh);
    sh = _mm_movehl_ps(sh, s);
    return _mm_cvtss_f32(_mm_add_ss(s, sh));
  }
  static float hmax(R v) {
    __m128 lo = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    lo = _mm_max_ps(lo, _mm_movehl_ps(lo, lo));
    lo = _mm_max_ss(lo, _mm_movehdup_ps(lo));
    return _mm_cvtss_f32(lo);
  }

  // exp(x), ~2 ulp (Cephes polynomial); exactly 0 below -87, clamped near FLT_MAX above 88.37.
  static R exp(R x) {
    const R lo = _mm256_set1_ps(-87.0f);
    __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.3762626647949f));
    R fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    R y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), keep);
  }

  template <class T>
  static R round(R v);

  // [a0,a1,a2,a3,...] -> [a1,a0,a3,a2,...]
  static R swap_pairs(R v) { return _mm256_permute_ps(v, 0xB1); }

  // r[j] = sum of the lanes of v[j], for 8 vectors (transposing reduction tree).
  static R transpose_sum(const R* v) {
    R t[4];
    for (int k = 0; k < 4; ++k)
      t[k] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm256_unpackhi_ps(v[2 * k], v[2 * k + 1]));
    R u[2];
    for (int k = 0; k < 2; ++k) {
      __m256d a = _mm256_castps_pd(t[2 * k]), b = _mm256_castps_pd(t[2 * k + 1]);
      u[k] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)), _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20), _mm256_permute2f128_ps(u[0], u[1], 0x31));
  }
};

template <>
inline __m256 Vec::round<float>(__m256 v) {
  return v;
}
template <>
inline __m256 Vec::round<bf16_t>(__m256 v) {
  return _mm256_castsi256_ps(_mm256_and_si256(bf16_round_bits(v), _mm256_set1_epi32(int(0xffff0000u))));
}
template <>
inline __m256 Vec::round<f16_t>(__m256 v) {
  return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

}  // namespace kestrel::cpu::avx2
