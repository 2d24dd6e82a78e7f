// Generic linear kernels (y = x @ W^T + b), written once against the `Vec` interface of vec_scalar.h /
// vec_avx2.h / vec_avx512.h and compiled once per ISA: gemm_<isa>.cpp defines KESTREL_ISA_NS, includes
// its vec header and then this file (same flags as kernels_<isa>.cpp, so the shared inline Vec code is
// identical in both objects). Everything lands in kestrel::cpu::<isa>, anonymous inside.
//
// Arithmetic is fp32 throughout (weights and x widened to fp32); gemm_avx512bf16.cpp has the
// bfloat16 dot-product (vdpbf16ps) versions and reuses these for float32 / float16.
//
// GEMV regime (small M, or any M in batch-invariant mode): for a block of NB weight rows and up to MB rows of
// x, NB * MB accumulator vectors run along K, reduced by one transposing tree whatever the tile's fill (so a
// row's result does not depend on M); each weight vector is loaded (and widened) once and used for all MB rows of x;
// x is converted to fp32 once per call into a zero-padded per-thread buffer (so only the weight rows
// need a tail). The weight block (NB rows x K) stays in L1 while the MB-row chunks of x go over it,
// so W is read from memory exactly once.
//
// GEMM regime: per panel of NC = NR * W weight rows and KC-deep slice of K, the slice is packed into
// fp32 [k][NC] (zero-padded past the panel's rows), then an MR x NC micro-kernel broadcasts x[m, k]
// against NR panel vectors. Partial sums for K > KC live in a per-thread fp32 buffer.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "gemm.h"
#include "types.h"

#ifndef KESTREL_ISA_NS
#error "define KESTREL_ISA_NS before including gemm_impl.h"
#endif

namespace kestrel::cpu::KESTREL_ISA_NS {
namespace {

namespace gemm {

using R = typename Vec::R;
constexpr int W = Vec::W;

// Register blocking per vector width (AVX-512: 32 registers; AVX2: 16; scalar: whatever).
constexpr int MR = W == 16 ? 8 : W == 8 ? 6 : 4;       // GEMM micro-kernel rows of x
constexpr int NR = W == 16 ? 3 : W == 8 ? 2 : 4;       // GEMM micro-kernel vectors of weight rows
constexpr int NC = NR * W;                             // panel width (weight rows per panel)
constexpr int64_t KC = 1024;                           // K slice per packed panel (in L2)
constexpr int GEMV_MB = W == 16 ? 4 : 2;               // GEMV: rows of x per pass over a weight block
constexpr int GEMV_NB = 4;                             // GEMV: weight rows per block
static_assert(W == 1 || GEMV_MB * GEMV_NB <= W, "gemv_tile reduces a tile's accumulators with one transpose_sum");
constexpr int64_t GEMV_MAX_M = 16;  // M at or below this: the GEMV regime (crossover measured at M ~ 16-24)
// GEMV reads NB weight rows side by side, which the hardware prefetchers do not follow well (measured on
// the 2-core EPYC dev machine: ~10 GB/s from one core, against ~19 GB/s reading rows one after the
// other, its streaming limit); prefetching the block this many blocks ahead into L2, in memory order,
// while reading this one restores the stream (8 rows side by side or 1 row at a time: no better).
constexpr int64_t kGemvPrefetchBlocks = 2;

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// A per-thread scratch buffer of floats, 64-byte aligned, grown on demand (never shrunk).
struct Scratch {
  float* p = nullptr;
  size_t n = 0;
  ~Scratch() { std::free(p); }
  float* get(size_t want) {
    if (want > n) {
      std::free(p);
      n = (want + 1023) & ~size_t(1023);
      p = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
      if (p == nullptr) {
        n = 0;
        throw std::bad_alloc();
      }
    }
    return p;
  }
};

// Load W (or fewer, zero-filled) elements of T as fp32.
template <class T>
inline R load_part(const T* p, int64_t n) {
  if (n >= W) return Vec::load(p);
  T tmp[W];
  std::memset(tmp, 0, sizeof(tmp));
  std::memcpy(tmp, p, size_t(n) * sizeof(T));
  return Vec::load(tmp);
}

// Store min(n, W) lanes of v, rounded to T.
template <class T>
inline void store_part(T* p, R v, int64_t n) {
  if (n >= W) {
    Vec::store(p, v);
    return;
  }
  T tmp[W];
  Vec::store(tmp, v);
  std::memcpy(p, tmp, size_t(n) * sizeof(T));
}

// x rows [0, M) -> fp32, row length Kp (zero-padded from K).
template <class T>
inline void x_to_f32(float* dst, int64_t Kp, const T* x, int64_t xs, int64_t M, int64_t K) {
  for (int64_t m = 0; m < M; ++m) {
    const T* src = x + m * xs;
    float* d = dst + m * Kp;
    int64_t k = 0;
    for (; k + W <= K; k += W) Vec::store(d + k, Vec::load(src + k));
    for (; k < K; ++k) d[k] = to_f32(src[k]);
    for (; k < Kp; ++k) d[k] = 0.f;
  }
}

// Weights as the kernels read them (k a multiple of W unless said otherwise):
// DenseW: rows of T. Q8W: int8 rows, one fp32 scale per kQ8Group along K (K a multiple of kQ8Group, so a
// vector never straddles two groups and there is no K tail).
template <class T>
struct DenseW {
  const T* w;
  int64_t K;
  static constexpr int64_t kElem = int64_t(sizeof(T));
  static constexpr bool kF32 = sizeof(T) == 4;
  R load(int64_t n, int64_t k) const { return Vec::load(w + n * K + k); }
  R load_part(int64_t n, int64_t k, int64_t cnt) const { return gemm::load_part(w + n * K + k, cnt); }
  float at(int64_t n, int64_t k) const { return to_f32(w[n * K + k]); }
  const char* row(int64_t n) const { return reinterpret_cast<const char*>(w + n * K); }
};

struct Q8W {
  const int8_t* q;
  const float* s;
  int64_t K;
  static constexpr int64_t kElem = 1;
  static constexpr bool kF32 = false;
  R load(int64_t n, int64_t k) const {
    const int64_t i = n * K + k;
    return Vec::mul(Vec::load(q + i), Vec::set1(s[i / kQ8Group]));
  }
  R load_part(int64_t n, int64_t k, int64_t cnt) const {  // unused (no K tail); kept for the generic code
    alignas(64) float tmp[W] = {};
    for (int64_t t = 0; t < cnt && t < W; ++t) tmp[t] = at(n, k + t);
    return Vec::load(tmp);
  }
  float at(int64_t n, int64_t k) const {
    const int64_t i = n * K + k;
    return float(q[i]) * s[i / kQ8Group];
  }
  const char* row(int64_t n) const { return reinterpret_cast<const char*>(q + n * K); }
};

// ---------------------------------------------------------------------------------------------------
// GEMV

// res[i * NB + j] = dot(xf row i, w row j) for i < MB, j < NB. pf (if not null): a weight block further
// on, prefetched into L2 in memory order while this one is read (see kGemvPrefetchBlocks).
template <class WV, int MB, int NB>
inline void gemv_tile(const float* xf, int64_t ldx, const WV& w, int64_t n, int64_t K, float* res, const char* pf) {
  R acc[MB][NB];
  for (int i = 0; i < MB; ++i)
    for (int j = 0; j < NB; ++j) acc[i][j] = Vec::zero();
  int64_t k = 0;
  for (; k + W <= K; k += W) {
    R wv[NB];
    if (pf != nullptr) {
      for (int j = 0; j < NB; ++j) __builtin_prefetch(pf + (k * NB + j * W) * WV::kElem, 0, 2);
    }
    for (int j = 0; j < NB; ++j) wv[j] = w.load(n + j, k);
    for (int i = 0; i < MB; ++i) {
      const R xv = Vec::load(xf + i * ldx + k);
      for (int j = 0; j < NB; ++j) acc[i][j] = Vec::fma(wv[j], xv, acc[i][j]);
    }
  }
  if (k < K) {  // x is zero-padded to a multiple of W: only the weight rows need care
    R wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = w.load_part(n + j, k, K - k);
    for (int i = 0; i < MB; ++i) {
      const R xv = Vec::load(xf + i * ldx + k);
      for (int j = 0; j < NB; ++j) acc[i][j] = Vec::fma(wv[j], xv, acc[i][j]);
    }
  }
  // Every tile, full or not, reduces its accumulators with the one transposing tree (zero vectors fill a
  // partial tile: each lane sums only its own vector), so a row's result does not depend on its place in M or
  // on M (a horizontal sum per vector would add the lanes in another order).
  if constexpr (W > 1 && MB * NB <= W) {
    alignas(64) float tmp[W];
    R flat[W];
    for (int i = 0; i < MB; ++i)
      for (int j = 0; j < NB; ++j) flat[i * NB + j] = acc[i][j];
    for (int t = MB * NB; t < W; ++t) flat[t] = Vec::zero();
    Vec::store(tmp, Vec::transpose_sum(flat));
    for (int t = 0; t < MB * NB; ++t) res[t] = tmp[t];
  } else {
    for (int i = 0; i < MB; ++i)
      for (int j = 0; j < NB; ++j) res[i * NB + j] = Vec::hsum(acc[i][j]);
  }
}

template <class T, class WV, int NB>
inline void gemv_rows(const LinearParams& p, const WV& w, const float* xf, int64_t Kp, int64_t n, float* bias_f) {
  T* out = static_cast<T*>(p.out);
  float res[GEMV_MB * NB];
  const char* pf = w.row(n + kGemvPrefetchBlocks * NB);  // a prefetch past the end does not fault
  for (int64_t m0 = 0; m0 < p.M; m0 += GEMV_MB) {
    const int64_t mb = imin(GEMV_MB, p.M - m0);
    const float* xm = xf + m0 * Kp;
    const char* pfm = m0 == 0 && W > 1 ? pf : nullptr;
    switch (mb) {
      case 1: gemv_tile<WV, 1, NB>(xm, Kp, w, n, p.K, res, pfm); break;
      case 2: gemv_tile<WV, 2, NB>(xm, Kp, w, n, p.K, res, pfm); break;
      case 3: if constexpr (GEMV_MB >= 3) gemv_tile<WV, 3, NB>(xm, Kp, w, n, p.K, res, pfm); break;
      case 4: if constexpr (GEMV_MB >= 4) gemv_tile<WV, 4, NB>(xm, Kp, w, n, p.K, res, pfm); break;
    }
    for (int64_t i = 0; i < mb; ++i) {
      T* o = out + (m0 + i) * p.out_stride + n;
      for (int j = 0; j < NB; ++j) o[j] = from_f32<T>(res[i * NB + j] + bias_f[j]);
    }
  }
}

template <class T, class WV>
void gemv(const LinearParams& p, const WV& w, int64_t n0, int64_t n1) {
  static thread_local Scratch xbuf;
  const int64_t Kp = (p.K + W - 1) / W * W;
  float* xf = xbuf.get(size_t(p.M * Kp));
  x_to_f32(xf, Kp, static_cast<const T*>(p.x), p.x_stride, p.M, p.K);
  const T* bias = static_cast<const T*>(p.bias);
  float bf[GEMV_NB];
  auto load_bias = [&](int64_t nn, int cnt) {
    for (int j = 0; j < cnt; ++j) bf[j] = bias ? to_f32(bias[nn + j]) : 0.f;
  };
  int64_t n = n0;
  for (; n + GEMV_NB <= n1; n += GEMV_NB) {
    load_bias(n, GEMV_NB);
    gemv_rows<T, WV, GEMV_NB>(p, w, xf, Kp, n, bf);
  }
  for (; n < n1; ++n) {
    load_bias(n, 1);
    gemv_rows<T, WV, 1>(p, w, xf, Kp, n, bf);
  }
}

// ---------------------------------------------------------------------------------------------------
// GEMM

// Pack weight rows [n, n + nc) x columns [k0, k0 + kc) as fp32 b[k][NC], zero past nc.
template <class WV>
inline void pack_panel(float* b, const WV& w, int64_t K, int64_t n, int64_t nc, int64_t k0, int64_t kc) {
  int64_t c = 0;
#ifdef KESTREL_GEMM_TRANSPOSE16
  // fp32 weights with a vectorised 16 x 16 transpose (the TU provides transpose16x16_u32).
  if constexpr (WV::kF32 && W == 16) {
    const bool pf = kc == K;  // whole rows: prefetch the next 16 in memory order (see the bf16 version)
    for (; c + 16 <= nc; c += 16) {
      const char* src = w.row(n + c) + k0 * 4;
      const char* next = src + 16 * K * 4;
      int64_t k = 0;
      for (; k + 16 <= kc; k += 16) {
        if (pf) {
          for (int i = 0; i < 16; ++i) __builtin_prefetch(next + (k + i) * 64, 0, 2);
        }
        transpose16x16_u32(src + k * 4, K * 4, reinterpret_cast<uint32_t*>(b + k * NC + c), NC);
      }
      for (int64_t cc = c; cc < c + 16; ++cc)
        for (int64_t kk = k; kk < kc; ++kk) b[kk * NC + cc] = w.at(n + cc, k0 + kk);
    }
  }
#endif
  for (; c < NC; ++c) {
    if (c < nc) {
      for (int64_t k = 0; k < kc; ++k) b[k * NC + c] = w.at(n + c, k0 + k);
    } else {
      for (int64_t k = 0; k < kc; ++k) b[k * NC + c] = 0.f;
    }
  }
}

// MRr rows of a (fp32, row stride lda) x the packed panel b (kc x NC). first: start from zero,
// else from c (fp32, row stride NC); last: add bias (NC floats), round and write the nc valid columns
// to out (row stride os); else write the partial sums back to c.
template <class T, int MRr>
inline void micro_kernel(const float* a, int64_t lda, const float* b, int64_t kc, float* c, bool first, bool last,
                         T* out, int64_t os, const float* bias, int64_t nc) {
  R acc[MRr][NR];
  for (int i = 0; i < MRr; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = first ? Vec::zero() : Vec::load(c + i * NC + j * W);
  for (int64_t k = 0; k < kc; ++k) {
    R bv[NR];
    for (int j = 0; j < NR; ++j) bv[j] = Vec::load(b + k * NC + j * W);
    for (int i = 0; i < MRr; ++i) {
      const R av = Vec::set1(a[i * lda + k]);
      for (int j = 0; j < NR; ++j) acc[i][j] = Vec::fma(av, bv[j], acc[i][j]);
    }
  }
  if (!last) {
    for (int i = 0; i < MRr; ++i)
      for (int j = 0; j < NR; ++j) Vec::store(c + i * NC + j * W, acc[i][j]);
    return;
  }
  for (int j = 0; j < NR; ++j) {
    const R bv = Vec::load(bias + j * W);
    const int64_t left = nc - j * W;
    if (left <= 0) break;
    for (int i = 0; i < MRr; ++i) store_part(out + i * os + j * W, Vec::add(acc[i][j], bv), left);
  }
}

template <class T, int MRr>
inline void micro_kernel_any(int64_t mr, const float* a, int64_t lda, const float* b, int64_t kc, float* c,
                             bool first, bool last, T* out, int64_t os, const float* bias, int64_t nc) {
  if constexpr (MRr > 0) {
    if (mr == MRr) return micro_kernel<T, MRr>(a, lda, b, kc, c, first, last, out, os, bias, nc);
    micro_kernel_any<T, MRr - 1>(mr, a, lda, b, kc, c, first, last, out, os, bias, nc);
  }
}

// x rows [0, M) as fp32 with row stride lda, columns [n0, n1).
template <class T, class WV>
void gemm_rows(const LinearParams& p, const WV& w, const float* a, int64_t lda, int64_t M, T* out, int64_t n0,
               int64_t n1) {
  static thread_local Scratch pbuf, cbuf;
  const int64_t K = p.K;
  float* b = pbuf.get(size_t(KC * NC));
  float* c = K > KC ? cbuf.get(size_t(M * NC)) : nullptr;
  const T* bias = static_cast<const T*>(p.bias);
  alignas(64) float bp[NC];
  for (int64_t n = n0; n < n1; n += NC) {
    const int64_t nc = imin(NC, n1 - n);
    for (int64_t j = 0; j < NC; ++j) bp[j] = (bias && j < nc) ? to_f32(bias[n + j]) : 0.f;
    for (int64_t k0 = 0; k0 < K; k0 += KC) {
      const int64_t kc = imin(KC, K - k0);
      pack_panel(b, w, K, n, nc, k0, kc);
      const bool first = k0 == 0, last = k0 + kc == K;
      for (int64_t m = 0; m < M; m += MR) {
        micro_kernel_any<T, MR>(imin(MR, M - m), a + m * lda + k0, lda, b, kc, c ? c + m * NC : nullptr, first,
                                last, out + m * p.out_stride + n, p.out_stride, bp, nc);
      }
    }
  }
}

template <class T, class WV>
void gemm_f32(const LinearParams& p, const WV& w, int64_t n0, int64_t n1) {
  T* out = static_cast<T*>(p.out);
  if constexpr (sizeof(T) == 4) {
    gemm_rows<T>(p, w, static_cast<const float*>(p.x), p.x_stride, p.M, out, n0, n1);
  } else {
    // x converted to fp32 in row blocks of at most ~2 MB (each block repacks the weights: one extra
    // pass over the panel per block, small against the block's MC * N * K FMAs).
    static thread_local Scratch abuf;
    const int64_t mc = imin(p.M, (((int64_t(1) << 19) / p.K) / MR + 1) * MR);
    float* a = abuf.get(size_t(mc * p.K));
    const T* x = static_cast<const T*>(p.x);
    for (int64_t m0 = 0; m0 < p.M; m0 += mc) {
      const int64_t mm = imin(mc, p.M - m0);
      x_to_f32(a, p.K, x + m0 * p.x_stride, p.x_stride, mm, p.K);
      gemm_rows<T>(p, w, a, p.K, mm, out + m0 * p.out_stride, n0, n1);
    }
  }
}

template <class T, class WV>
void linear_w(const LinearParams& p, const WV& w, int64_t n0, int64_t n1) {
  if (p.M <= GEMV_MAX_M || p.gemv_any_m)
    gemv<T>(p, w, n0, n1);
  else
    gemm_f32<T>(p, w, n0, n1);
}

template <class T>
void linear_t(const LinearParams& p, int64_t n0, int64_t n1) {
  if (p.w_scales != nullptr)
    linear_w<T>(p, Q8W{static_cast<const int8_t*>(p.w), p.w_scales, p.K}, n0, n1);
  else
    linear_w<T>(p, DenseW<T>{static_cast<const T*>(p.w), p.K}, n0, n1);
}

}  // namespace gemm

void linear_k(const LinearParams& p, int64_t n0, int64_t n1) {
  switch (p.dtype) {
    case kFloat32: return gemm::linear_t<float>(p, n0, n1);
    case kBFloat16: return gemm::linear_t<bf16_t>(p, n0, n1);
    case kFloat16: return gemm::linear_t<f16_t>(p, n0, n1);
  }
}

int64_t n_align_k(const LinearParams& p) {
  return p.M <= gemm::GEMV_MAX_M || p.gemv_any_m ? gemm::GEMV_NB : gemm::NC;
}

}  // namespace
}  // namespace kestrel::cpu::KESTREL_ISA_NS
