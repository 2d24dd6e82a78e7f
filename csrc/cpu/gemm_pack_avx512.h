// 16 x 16 transpose of 32-bit words with AVX-512 F, for packing weight panels (fp32 values, or bf16
// pairs). Internal linkage on purpose: included by gemm_avx512.cpp and gemm_avx512bf16.cpp, which are
// compiled with different flags (see types.h).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace kestrel::cpu {
namespace {

// dst[q * ds + i] = word q of row i, where row i starts at byte src + i * rs; q, i < 16.
inline void transpose16x16_u32(const char* src, int64_t rs, uint32_t* dst, int64_t ds) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * rs);
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // r[4g + j], per 128-bit lane L: word 4L + j of rows 4g .. 4g + 3
  for (int g = 0; g < 4; ++g) {
    r[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g + 0], t[4 * g + 2]);
    r[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g + 0], t[4 * g + 2]);
    r[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    r[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    t[j + 0] = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x88);       // [r_j.L0, r_j.L2, r_4+j.L0, r_4+j.L2]
    t[j + 4] = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xdd);       // [r_j.L1, r_j.L3, r_4+j.L1, r_4+j.L3]
    t[j + 8] = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x88);
    t[j + 12] = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xdd);
  }
  for (int j = 0; j < 4; ++j) {
    _mm512_storeu_si512(dst + (0 + j) * ds, _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88));       // word j
    _mm512_storeu_si512(dst + (4 + j) * ds, _mm512_shuffle_i32x4(t[j + 4], t[j + 12], 0x88));  // word 4 + j
    _mm512_storeu_si512(dst + (8 + j) * ds, _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd));       // word 8 + j
    _mm512_storeu_si512(dst + (12 + j) * ds, _mm512_shuffle_i32x4(t[j + 4], t[j + 12], 0xdd)); // word 12 + j
  }
}

}  // namespace
}  // namespace kestrel::cpu
