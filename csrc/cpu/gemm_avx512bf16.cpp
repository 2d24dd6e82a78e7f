// Linear kernels for bfloat16 on AVX-512 + AVX512_BF16: vdpbf16ps multiplies 16 pairs of bf16 and adds
// them into 16 fp32 lanes, so bf16 weights and x are used as they are, without widening. Compiled with
// -mavx512bf16 (CMakeLists.txt) and dispatched only where the CPU has it (csrc/cpu_features.h); float32
// and float16 go to the plain AVX-512 kernels (gemm_avx512.cpp).
//
// This file does not include vec_avx512.h: its inline functions would be compiled here with
// -mavx512bf16 and merged by the linker with the copies built for plain AVX-512. Everything below has
// internal linkage.
//
// GEMV (small M): x rows are already bf16 pairs along K, exactly what vdpbf16ps takes: per 32 K elements,
// NB weight-row vectors x MB x-row vectors, accumulators along K, reduced at the end (masked loads for
// the K tail, so odd K needs no padding).
// GEMM (large M): weight panels of 48 rows packed per KC slice as 32-bit words [k/2][48] (the pair
// (w[n][2q], w[n][2q+1]) per column; zero-padded), x pairs broadcast from x's rows as they are
// (vpbroadcastd); an 8 x 48 micro-kernel of 24 accumulators.
//
// Measured on the 2-core EPYC dev machine (one 512-bit vdpbf16ps per cycle, ~3.6 GHz: ~230 GFLOP/s per
// core): the micro-kernel with its data in L1 runs at that rate (6x4, 12x2, 4x6 blockings: the same);
// the whole GEMM at M = 512 at ~200 GFLOP/s per core; the GEMV at M = 1 streams weights at ~17-20 GB/s
// from one core, the core's streaming limit there.

#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

#include "gemm.h"
#include "gemm_pack_avx512.h"
#include "types.h"

namespace kestrel::cpu::avx512bf16 {
namespace {

constexpr int MR = 8;               // GEMM micro-kernel rows of x
constexpr int NR = 3;               // GEMM micro-kernel vectors (16 weight rows each)
constexpr int NC = NR * 16;         // panel width
constexpr int64_t KC = 2048;        // K slice per packed panel (even): up to 48 x 2048 x 2 B = 192 KB, in L2
                                    // (128 ... 2048 measured within noise; whole rows let the packing
                                    // prefetch the next rows in memory order)
constexpr int GEMV_MB = 4;          // GEMV rows of x per pass over a weight block
constexpr int GEMV_NB = 4;          // GEMV weight rows per block (4 x 4 = 16 accumulators)
constexpr int64_t GEMV_MAX_M = 16;  // M at or below this: the GEMV regime (crossover measured at M ~ 16-24)
constexpr int64_t kGemvPrefetchBlocks = 2;

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

struct Scratch {
  void* p = nullptr;
  size_t n = 0;
  ~Scratch() { std::free(p); }
  template <class E>
  E* get(size_t count) {
    const size_t want = (count * sizeof(E) + 4095) & ~size_t(4095);
    if (want > n) {
      std::free(p);
      p = std::aligned_alloc(64, want);
      n = p ? want : 0;
      if (p == nullptr) throw std::bad_alloc();
    }
    return static_cast<E*>(p);
  }
};

inline __m512 dp(__m512 acc, __m512i a, __m512i b) { return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b); }

inline __mmask32 tail_mask32(int64_t n) { return n >= 32 ? ~__mmask32(0) : (__mmask32(1) << n) - 1; }
inline __mmask16 tail_mask16(int64_t n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }

// fp32 -> bf16, round to nearest even, NaN kept (quiet); integer rounding rather than vcvtneps2bf16,
// which flushes denormals, so results match the scalar conversion bit for bit.
inline __m256i to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x00400000));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

inline __m512 load_bias(const bf16_t* b, int64_t n) {  // n (<= 16) bf16 as fp32, zero-filled
  const __m256i h = _mm256_maskz_loadu_epi16(tail_mask16(n), b);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// r[j] = sum of the lanes of v[j], for 16 vectors (transposing reduction tree).
inline __m512 transpose_sum(const __m512* v) {
  __m512 t[8];
  for (int k = 0; k < 8; ++k)
    t[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
  __m512 u[4];
  for (int k = 0; k < 4; ++k) {
    __m512d a = _mm512_castps_pd(t[2 * k]), b = _mm512_castps_pd(t[2 * k + 1]);
    u[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  __m512 x0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
  __m512 x1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(x0, x1, _MM_SHUFFLE(3, 1, 3, 1)));
}

// res[i * NB + j] = the sum of acc[i][j]'s lanes, for every tile shape by the one transposing tree (zero vectors
// fill a partial tile; each lane sums only its own vector), so a row's result does not depend on its place in M
// or on M. res holds 16 floats.
template <int MB, int NB>
inline void reduce_tile(const __m512 (&acc)[MB][NB], float* res) {
  static_assert(MB * NB <= 16, "one transpose_sum per tile");
  __m512 flat[16];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) flat[i * NB + j] = acc[i][j];
  for (int t = MB * NB; t < 16; ++t) flat[t] = _mm512_setzero_ps();
  _mm512_storeu_ps(res, transpose_sum(flat));
}

inline float bf16_to_f32(bf16_t v) { return to_f32(v); }

// ---------------------------------------------------------------------------------------------------
// GEMV

// pf (if not null): the weight block kGemvPrefetchBlocks ahead, prefetched into L2 in memory order (the
// hardware prefetchers do not follow NB rows read side by side; see gemm_impl.h).
template <int MB, int NB>
inline void gemv_tile(const bf16_t* x, int64_t xs, const bf16_t* w, int64_t K, float* res, const char* pf) {
  __m512 acc[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512i wv[NB];
    if (pf != nullptr) {
      for (int j = 0; j < NB; ++j) _mm_prefetch(pf + (k * NB + j * 32) * 2, _MM_HINT_T1);
    }
    for (int j = 0; j < NB; ++j) wv[j] = _mm512_loadu_si512(w + j * K + k);
    for (int i = 0; i < MB; ++i) {
      const __m512i xv = _mm512_loadu_si512(x + i * xs + k);
      for (int j = 0; j < NB; ++j) acc[i][j] = dp(acc[i][j], wv[j], xv);
    }
  }
  if (k < K) {
    const __mmask32 m = tail_mask32(K - k);
    __m512i wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = _mm512_maskz_loadu_epi16(m, w + j * K + k);
    for (int i = 0; i < MB; ++i) {
      const __m512i xv = _mm512_maskz_loadu_epi16(m, x + i * xs + k);
      for (int j = 0; j < NB; ++j) acc[i][j] = dp(acc[i][j], wv[j], xv);
    }
  }
  reduce_tile<MB, NB>(acc, res);
}

// Output columns [n0, n1) of a GEMV, in blocks of GEMV_NB weight rows (then single rows) and GEMV_MB rows of
// x; tile.template run<MB, NB>(m0, n, res, pf) fills res[i * NB + j] = dot(x row m0 + i, w row n + j), pf (if
// not null) the weight block kGemvPrefetchBlocks ahead. Bias added and rounded to bf16 here.
template <class Tile>
void gemv_over(const LinearParams& p, int64_t n0, int64_t n1, int64_t w_elem_bytes, const Tile& tile) {
  const bf16_t* bias = static_cast<const bf16_t*>(p.bias);
  bf16_t* out = static_cast<bf16_t*>(p.out);
  auto rows = [&](auto nb_tag, int64_t n) {
    constexpr int NB = decltype(nb_tag)::value;
    float bias_f[NB];
    for (int j = 0; j < NB; ++j) bias_f[j] = bias ? bf16_to_f32(bias[n + j]) : 0.f;
    alignas(64) float res[GEMV_MB * NB > 16 ? GEMV_MB * NB : 16];
    const char* pf = static_cast<const char*>(p.w) + (n + kGemvPrefetchBlocks * NB) * p.K * w_elem_bytes;
    for (int64_t m0 = 0; m0 < p.M; m0 += GEMV_MB) {
      const int64_t mb = imin(GEMV_MB, p.M - m0);
      const char* pfm = m0 == 0 ? pf : nullptr;
      switch (mb) {
        case 1: tile.template run<1, NB>(m0, n, res, pfm); break;
        case 2: tile.template run<2, NB>(m0, n, res, pfm); break;
        case 3: tile.template run<3, NB>(m0, n, res, pfm); break;
        default: tile.template run<4, NB>(m0, n, res, pfm); break;
      }
      for (int64_t i = 0; i < mb; ++i) {
        bf16_t* o = out + (m0 + i) * p.out_stride + n;
        for (int j = 0; j < NB; ++j) o[j] = from_f32<bf16_t>(res[i * NB + j] + bias_f[j]);
      }
    }
  };
  int64_t n = n0;
  for (; n + GEMV_NB <= n1; n += GEMV_NB) rows(std::integral_constant<int, GEMV_NB>{}, n);
  for (; n < n1; ++n) rows(std::integral_constant<int, 1>{}, n);
}

struct Bf16Tile {
  const LinearParams& p;
  template <int MB, int NB>
  void run(int64_t m0, int64_t n, float* res, const char* pf) const {
    gemv_tile<MB, NB>(static_cast<const bf16_t*>(p.x) + m0 * p.x_stride, p.x_stride,
                      static_cast<const bf16_t*>(p.w) + n * p.K, p.K, res, pf);
  }
};

void gemv(const LinearParams& p, int64_t n0, int64_t n1) { gemv_over(p, n0, n1, 2, Bf16Tile{p}); }

// ---------------------------------------------------------------------------------------------------
// int8 weights (LinearParams::w_scales), bfloat16 x
//
// GEMM: the panel is packed from int8 x scale straight into the bf16 pairs the micro-kernel takes (one
// rounding of each dequantized weight to bf16, like a bf16 checkpoint), so prefill runs at the bf16 rate.
// GEMV: x is quantized per call to int8 per group of 32 (absmax / 127, like llama.cpp's Q8_0 activations)
// and the dot products run on AVX512-VNNI: vpdpbusd takes x + 128 as unsigned bytes against the signed
// weights, its accumulator starting at -128 x (sum of the weights), so the int32 lanes hold exact integer
// dot products; each 64-byte step covers two groups and is scaled by w_scale x x_scale per half, in fp32.
// That is 4 instructions per 64 weights and row of x, against ~22 for widening the weights to fp32.

// Rows [n, n + nc) x [k0, k0 + kc) (k0, kc multiples of 32) of int8 weights -> b[q][NC] bf16 pairs.
inline void pack_panel_q8(uint32_t* b, const int8_t* q, const float* sc, int64_t K, int64_t n, int64_t nc,
                          int64_t k0, int64_t kc) {
  const int64_t G = K / kQ8Group;
  alignas(64) uint32_t tile[16 * 16];
  int64_t c = 0;
  for (; c < NC; c += 16) {
    const int64_t rows = imin(16, nc - c);
    for (int64_t g = 0; g < kc / kQ8Group; ++g) {
      for (int64_t r = 0; r < 16; ++r) {
        __m512i pairs = _mm512_setzero_si512();
        if (r < rows) {
          const int64_t row = n + c + r, kk = k0 + g * kQ8Group;
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + row * K + kk));
          const __m512 s = _mm512_set1_ps(sc[row * G + kk / kQ8Group]);
          const __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(v))), s);
          const __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(v, 1))), s);
          pairs = _mm512_inserti64x4(_mm512_castsi256_si512(to_bf16(lo)), to_bf16(hi), 1);
        }
        _mm512_store_si512(tile + r * 16, pairs);
      }
      transpose16x16_u32(reinterpret_cast<const char*>(tile), 64, b + (g * 16) * NC + c, NC);
    }
  }
}

// x rows -> x + 128 as bytes [M][K] and a scale per group [M][K / 32].
inline void quantize_x(const bf16_t* x, int64_t xs, int64_t M, int64_t K, uint8_t* xu, float* xsc) {
  const __m512 absmask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; k += kQ8Group) {
      const __m512i raw = _mm512_loadu_si512(x + m * xs + k);
      const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(raw)), 16));
      const __m512 hi =
          _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(raw, 1)), 16));
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(lo, absmask), _mm512_and_ps(hi, absmask)));
      const float scale = amax / 127.f;
      const __m512 inv = _mm512_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
      const __m512i bias = _mm512_set1_epi32(128);
      const __m512i qlo = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(lo, inv)), bias);
      const __m512i qhi = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(hi, inv)), bias);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(xu + m * K + k), _mm512_cvtusepi32_epi8(qlo));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(xu + m * K + k + 16), _mm512_cvtusepi32_epi8(qhi));
      xsc[m * (K / kQ8Group) + k / kQ8Group] = scale;
    }
  }
}

// Lanes 0-7: s[0], lanes 8-15: s[1] (the two groups of a 64-byte step); one group when `one`.
inline __m512 two_scales(const float* s, bool one) {
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m128 v = one ? _mm_set_ss(s[0]) : _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s)));
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v));
}

template <int MB, int NB>
inline void gemv_q8_tile(const uint8_t* xu, const float* xsc, const int8_t* w, const float* wsc, int64_t K,
                         float* res, const char* pf) {
  const int64_t G = K / kQ8Group;
  __m512 acc[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t k = 0; k < K; k += 64) {
    const bool half = k + 64 > K;  // K % 64 == 32: the last step holds one group
    const __mmask64 m = half ? __mmask64(0xffffffffull) : ~__mmask64(0);
    __m512i wv[NB], neg[NB];
    __m512 ws[NB];
    if (pf != nullptr) {
      for (int j = 0; j < NB; ++j) _mm_prefetch(pf + k * NB + j * 64, _MM_HINT_T1);
    }
    for (int j = 0; j < NB; ++j) {
      wv[j] = _mm512_maskz_loadu_epi8(m, w + j * K + k);
      // -128 x (sum of each lane's 4 weights): vpdpbusd on top of it leaves sum(x * w)
      neg[j] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                _mm512_slli_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, wv[j]), 7));
      ws[j] = two_scales(wsc + j * G + k / kQ8Group, half);
    }
    for (int i = 0; i < MB; ++i) {
      const __m512i xv = _mm512_maskz_loadu_epi8(m, xu + i * K + k);
      const __m512 xs = two_scales(xsc + i * G + k / kQ8Group, half);
      for (int j = 0; j < NB; ++j) {
        const __m512i dot = _mm512_dpbusd_epi32(neg[j], xv, wv[j]);
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(ws[j], xs), acc[i][j]);
      }
    }
  }
  reduce_tile<MB, NB>(acc, res);
}

struct Q8Tile {
  const LinearParams& p;
  const uint8_t* xu;  // x + 128 as bytes [M][K]
  const float* xsc;   // [M][K / kQ8Group]
  template <int MB, int NB>
  void run(int64_t m0, int64_t n, float* res, const char* pf) const {
    const int64_t G = p.K / kQ8Group;
    gemv_q8_tile<MB, NB>(xu + m0 * p.K, xsc + m0 * G, static_cast<const int8_t*>(p.w) + n * p.K,
                         p.w_scales + n * G, p.K, res, pf);
  }
};

void gemv_q8(const LinearParams& p, int64_t n0, int64_t n1) {
  static thread_local Scratch xbuf, sbuf;
  uint8_t* xu = xbuf.get<uint8_t>(size_t(p.M * p.K));
  float* xsc = sbuf.get<float>(size_t(p.M * (p.K / kQ8Group)));
  quantize_x(static_cast<const bf16_t*>(p.x), p.x_stride, p.M, p.K, xu, xsc);
  gemv_over(p, n0, n1, 1, Q8Tile{p, xu, xsc});
}

// ---------------------------------------------------------------------------------------------------
// GEMM

// Weight rows [n, n + nc), columns [k0, k0 + kc) -> b[q][NC] 32-bit pairs (w[2q], w[2q+1]); the last
// pair of an odd kc gets a zero high half; columns past nc are zero.
inline void pack_panel(uint32_t* b, const bf16_t* w, int64_t K, int64_t n, int64_t nc, int64_t k0, int64_t kc) {
  const int64_t q_full = kc / 2, q_all = (kc + 1) / 2;
  int64_t c = 0;
  // 16 rows at a time: 16 x 16 32-bit transposes.
  // When the slice is whole rows (kc == K), the next 16 rows are the next 16 * K * 2 bytes: prefetch
  // them into L2 in memory order, 16 lines per transpose (reading 16 rows side by side defeats the
  // hardware prefetchers, as in the GEMV).
  const bool pf = kc == K;
  for (; c + 16 <= nc; c += 16) {
    const char* src = reinterpret_cast<const char*>(w + (n + c) * K + k0);
    const char* next = src + 16 * K * 2;
    int64_t q = 0;
    for (; q + 16 <= q_full; q += 16) {
      if (pf) {
        for (int i = 0; i < 16; ++i) _mm_prefetch(next + (q + i) * 64, _MM_HINT_T1);
      }
      transpose16x16_u32(src + q * 4, K * 2, b + q * NC + c, NC);
    }
    for (int64_t cc = c; cc < c + 16; ++cc) {
      const uint16_t* s = reinterpret_cast<const uint16_t*>(w + (n + cc) * K + k0);
      for (int64_t qq = q; qq < q_full; ++qq) b[qq * NC + cc] = uint32_t(s[2 * qq]) | (uint32_t(s[2 * qq + 1]) << 16);
      if (q_all > q_full) b[q_full * NC + cc] = s[kc - 1];
    }
  }
  for (; c < NC; ++c) {
    if (c < nc) {
      const uint16_t* s = reinterpret_cast<const uint16_t*>(w + (n + c) * K + k0);
      for (int64_t q = 0; q < q_full; ++q) b[q * NC + c] = uint32_t(s[2 * q]) | (uint32_t(s[2 * q + 1]) << 16);
      if (q_all > q_full) b[q_full * NC + c] = s[kc - 1];
    } else {
      for (int64_t q = 0; q < q_all; ++q) b[q * NC + c] = 0;
    }
  }
}

template <int MRr>
inline void micro_kernel(const bf16_t* a, int64_t lda, const uint32_t* b, int64_t kc, float* c, bool first,
                         bool last, bf16_t* out, int64_t os, const __m512* bias, int64_t nc) {
  __m512 acc[MRr][NR];
  for (int i = 0; i < MRr; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + i * NC + j * 16);
  const int64_t q_full = kc / 2;
  for (int64_t q = 0; q < q_full; ++q) {
    __m512i bv[NR];
    for (int j = 0; j < NR; ++j) bv[j] = _mm512_loadu_si512(b + q * NC + j * 16);
    for (int i = 0; i < MRr; ++i) {
      uint32_t pair;
      std::memcpy(&pair, a + i * lda + 2 * q, 4);
      const __m512i av = _mm512_set1_epi32(int(pair));
      for (int j = 0; j < NR; ++j) acc[i][j] = dp(acc[i][j], av, bv[j]);
    }
  }
  if (kc & 1) {
    __m512i bv[NR];
    for (int j = 0; j < NR; ++j) bv[j] = _mm512_loadu_si512(b + q_full * NC + j * 16);
    for (int i = 0; i < MRr; ++i) {
      const __m512i av = _mm512_set1_epi32(int(a[i * lda + kc - 1].bits));
      for (int j = 0; j < NR; ++j) acc[i][j] = dp(acc[i][j], av, bv[j]);
    }
  }
  if (!last) {
    for (int i = 0; i < MRr; ++i)
      for (int j = 0; j < NR; ++j) _mm512_storeu_ps(c + i * NC + j * 16, acc[i][j]);
    return;
  }
  for (int j = 0; j < NR; ++j) {
    const int64_t left = nc - j * 16;
    if (left <= 0) break;
    const __mmask16 m = tail_mask16(left);
    for (int i = 0; i < MRr; ++i)
      _mm256_mask_storeu_epi16(out + i * os + j * 16, m, to_bf16(_mm512_add_ps(acc[i][j], bias[j])));
  }
}

template <int MRr>
inline void micro_kernel_any(int64_t mr, const bf16_t* a, int64_t lda, const uint32_t* b, int64_t kc, float* c,
                             bool first, bool last, bf16_t* out, int64_t os, const __m512* bias, int64_t nc) {
  if constexpr (MRr > 0) {
    if (mr == MRr) return micro_kernel<MRr>(a, lda, b, kc, c, first, last, out, os, bias, nc);
    micro_kernel_any<MRr - 1>(mr, a, lda, b, kc, c, first, last, out, os, bias, nc);
  }
}

void gemm(const LinearParams& p, int64_t n0, int64_t n1) {
  static thread_local Scratch pbuf, cbuf;
  const int64_t K = p.K, M = p.M;
  uint32_t* b = pbuf.get<uint32_t>(size_t((KC / 2) * NC));
  float* c = K > KC ? cbuf.get<float>(size_t(M * NC)) : nullptr;
  const bf16_t* x = static_cast<const bf16_t*>(p.x);
  const bf16_t* w = static_cast<const bf16_t*>(p.w);
  const int8_t* wq = static_cast<const int8_t*>(p.w);
  const bf16_t* bias = static_cast<const bf16_t*>(p.bias);
  bf16_t* out = static_cast<bf16_t*>(p.out);
  for (int64_t n = n0; n < n1; n += NC) {
    const int64_t nc = imin(NC, n1 - n);
    __m512 bv[NR];
    for (int j = 0; j < NR; ++j)
      bv[j] = (bias && nc > j * 16) ? load_bias(bias + n + j * 16, nc - j * 16) : _mm512_setzero_ps();
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
      const int64_t kc = imin(KC, K - k0);
      if (p.w_scales != nullptr)
        pack_panel_q8(b, wq, p.w_scales, K, n, nc, k0, kc);
      else
        pack_panel(b, w, K, n, nc, k0, kc);
      const bool first = k0 == 0, last = k0 + kc == K;
      for (int64_t m = 0; m < M; m += MR) {
        micro_kernel_any<MR>(imin(MR, M - m), x + m * p.x_stride + k0, p.x_stride, b, kc, c ? c + m * NC : nullptr,
                             first, last, out + m * p.out_stride + n, p.out_stride, bv, nc);
      }
    }
  }
}

void linear_k(const LinearParams& p, int64_t n0, int64_t n1) {
  // float32 / float16 (weights of any kind): the plain AVX-512 kernels
  if (p.dtype != kBFloat16) return linear_table_avx512()->linear(p, n0, n1);
  const bool gemv_regime = p.M <= GEMV_MAX_M || p.gemv_any_m;
  if (gemv_regime && p.w_scales != nullptr)
    gemv_q8(p, n0, n1);
  else if (gemv_regime)
    gemv(p, n0, n1);
  else
    gemm(p, n0, n1);
}

int64_t n_align_k(const LinearParams& p) {
  if (p.dtype != kBFloat16) return linear_table_avx512()->n_align(p);
  return p.M <= GEMV_MAX_M || p.gemv_any_m ? GEMV_NB : NC;
}

}  // namespace
}  // namespace kestrel::cpu::avx512bf16

namespace kestrel::cpu {

const LinearTable* linear_table_avx512bf16() {
  // gemv_max_m only steers the dispatcher's threading; float32 / float16 (the plain AVX-512 kernels)
  // switch at the same M.
  static const LinearTable t = {"avx512bf16", avx512bf16::linear_k, avx512bf16::n_align_k, avx512bf16::GEMV_MAX_M};
  return &t;
}

}  // namespace kestrel::cpu
