// AVX-512 (F/BW/VL/DQ + F16C) comm kernels: 16 fp32 lanes. Compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512dq -mf16c; hostar.cpp dispatches here only on CPUs that have them.
#include <immintrin.h>

#include "comm_kernels.h"
#include "comm_types.h"

namespace kestrel::comm {
namespace avx512 {

struct V {
  static constexpr int W = 16;
  using R = __m512;
  static R set1(float x) { return _mm512_set1_ps(x); }
  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static R load(const BF16* p) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static R load(const F16* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static void store(float* p, R v) { _mm512_storeu_ps(p, v); }
  static void store(BF16* p, R v) {  // round to nearest even, NaN kept quiet (integer rounding: any AVX-512 CPU)
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
  }
  static void store(F16* p, R v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R sub(R a, R b) { return _mm512_sub_ps(a, b); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  // One Walsh-Hadamard stage inside the vector: lanes i < i + h (h = 1, 2, 4, 8) -> (a + b, a - b).
  static R butterfly(R v, int h) {
    R sw;
    __mmask16 hi;
    switch (h) {
      case 1: sw = _mm512_permute_ps(v, 0xB1); hi = 0xAAAA; break;
      case 2: sw = _mm512_permute_ps(v, 0x4E); hi = 0xCCCC; break;
      case 4: sw = _mm512_shuffle_f32x4(v, v, 0xB1); hi = 0xF0F0; break;
      default: sw = _mm512_shuffle_f32x4(v, v, 0x4E); hi = 0xFF00; break;
    }
    return _mm512_mask_sub_ps(_mm512_add_ps(v, sw), hi, sw, v);  // low lanes v + sw, high lanes sw - v
  }
  static R max(R a, R b) { return _mm512_max_ps(a, b); }
  static R abs(R a) { return _mm512_abs_ps(a); }
  static float hmax(R a) { return _mm512_reduce_max_ps(a); }
  static R load_i8(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static void store_i8(int8_t* p, R v) {  // round half to even (MXCSR default), saturate
    __m512i i = _mm512_cvt_roundps_epi32(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtsepi32_epi8(i));
  }
};

#include "kernels_impl.h"

}  // namespace avx512

const Kernels* kernels_avx512() {
  static const Kernels k{"avx512", avx512::reduce_k, avx512::quantize_k, avx512::dequant_sum_requant_k,
                         avx512::dequantize_k};
  return &k;
}

}  // namespace kestrel::comm
