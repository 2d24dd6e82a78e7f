// AVX2 + FMA + F16C comm kernels: 8 fp32 lanes (FMA is not used: sums stay separately rounded).
#include <immintrin.h>

#include "comm_kernels.h"
#include "comm_types.h"

namespace kestrel::comm {
namespace avx2 {

struct V {
  static constexpr int W = 8;
  using R = __m256;
  static R set1(float x) { return _mm256_set1_ps(x); }
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static R load(const BF16* p) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static R load(const F16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static void store(float* p, R v) { _mm256_storeu_ps(p, v); }
  static void store(BF16* p, R v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), nan);
    r = _mm256_srli_epi32(r, 16);
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  static void store(F16* p, R v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  // One Walsh-Hadamard stage inside the vector (h = 1, 2, 4): low lanes v + swapped, high lanes swapped - v.
  static R butterfly(R v, int h) {
    if (h == 1) {
      R sw = _mm256_permute_ps(v, 0xB1);
      return _mm256_blend_ps(_mm256_add_ps(v, sw), _mm256_sub_ps(sw, v), 0xAA);
    }
    if (h == 2) {
      R sw = _mm256_permute_ps(v, 0x4E);
      return _mm256_blend_ps(_mm256_add_ps(v, sw), _mm256_sub_ps(sw, v), 0xCC);
    }
    R sw = _mm256_permute2f128_ps(v, v, 0x01);
    return _mm256_blend_ps(_mm256_add_ps(v, sw), _mm256_sub_ps(sw, v), 0xF0);
  }
  static R max(R a, R b) { return _mm256_max_ps(a, b); }
  static R abs(R a) { return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }
  static float hmax(R a) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
  }
  static R load_i8(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static void store_i8(int8_t* p, R v) {
    __m256i i = _mm256_cvtps_epi32(v);  // MXCSR: round half to even
    __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(w, w));
  }
};

#include "kernels_impl.h"

}  // namespace avx2

const Kernels* kernels_avx2() {
  static const Kernels k{"avx2", avx2::reduce_k, avx2::quantize_k, avx2::dequant_sum_requant_k,
                         avx2::dequantize_k};
  return &k;
}

}  // namespace kestrel::comm
