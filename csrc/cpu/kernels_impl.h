// Generic CPU kernels, written once against the `Vec` interface (vec_scalar.h / vec_avx2.h /
// vec_avx512.h) and compiled once per ISA: kernels_<isa>.cpp defines KESTREL_ISA_NS, includes its
// vec header and then this file. Everything lands in namespace kestrel::cpu::<isa> (anonymous inside),
// so no symbol is shared between translation units compiled with different -m flags.
//
// All arithmetic is fp32; storage is float / bf16 / fp16. These functions are serial: the dispatcher
// (dispatch.cpp) splits rows / work items across threads.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels.h"
#include "types.h"

#ifndef KESTREL_ISA_NS
#error "define KESTREL_ISA_NS before including kernels_impl.h"
#endif

namespace kestrel::cpu::KESTREL_ISA_NS {
namespace {

using R = typename Vec::R;
constexpr int W = Vec::W;

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// ---------------------------------------------------------------------------------------------------
// RMSNorm. HF/vLLM semantics: y = dtype(dtype(x * rsqrt(mean(x^2) + eps)) * w), statistics in fp32.

template <class T>
inline float sum_squares(const T* x, int64_t H) {
  R a0 = Vec::zero(), a1 = Vec::zero();
  int64_t i = 0;
  for (; i + 2 * W <= H; i += 2 * W) {
    R v0 = Vec::load(x + i), v1 = Vec::load(x + i + W);
    a0 = Vec::fma(v0, v0, a0);
    a1 = Vec::fma(v1, v1, a1);
  }
  for (; i + W <= H; i += W) {
    R v = Vec::load(x + i);
    a0 = Vec::fma(v, v, a0);
  }
  float ss = Vec::hsum(Vec::add(a0, a1));
  for (; i < H; ++i) {
    float f = to_f32(x[i]);
    ss += f * f;
  }
  return ss;
}

template <class T>
inline void normalize_row(T* o, const T* src, const T* w, int64_t H, float inv) {
  const R vinv = Vec::set1(inv);
  int64_t i = 0;
  for (; i + W <= H; i += W) {
    R y = Vec::template round<T>(Vec::mul(Vec::load(src + i), vinv));
    Vec::store(o + i, Vec::mul(y, Vec::load(w + i)));
  }
  for (; i < H; ++i) o[i] = from_f32<T>(round_to<T>(to_f32(src[i]) * inv) * to_f32(w[i]));
}

template <class T>
void rms_norm_t(T* out, int64_t os, const T* x, int64_t xs, const T* w, int64_t H, float eps, int64_t t0,
                int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    const T* xr = x + t * xs;
    const float inv = 1.0f / std::sqrt(sum_squares(xr, H) / float(H) + eps);
    normalize_row(out + t * os, xr, w, H, inv);
  }
}

// residual = dtype(x + residual); x = rmsnorm(residual) * w (statistics from the stored residual).
template <class T>
void fused_add_rms_norm_t(T* x, int64_t xs, T* r, int64_t rs, const T* w, int64_t H, float eps, int64_t t0,
                          int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    T* xr = x + t * xs;
    T* rr = r + t * rs;
    R a0 = Vec::zero();
    int64_t i = 0;
    for (; i + W <= H; i += W) {
      R s = Vec::template round<T>(Vec::add(Vec::load(xr + i), Vec::load(rr + i)));
      Vec::store(rr + i, s);
      a0 = Vec::fma(s, s, a0);
    }
    float ss = Vec::hsum(a0);
    for (; i < H; ++i) {
      const float s = round_to<T>(to_f32(xr[i]) + to_f32(rr[i]));
      rr[i] = from_f32<T>(s);
      ss += s * s;
    }
    const float inv = 1.0f / std::sqrt(ss / float(H) + eps);
    normalize_row(xr, static_cast<const T*>(rr), w, H, inv);
  }
}

// ---------------------------------------------------------------------------------------------------
// SiLU-and-mul: out = dtype(dtype(silu(gate)) * up), as vLLM's kernel and HF's act(gate) * up round.

template <class T>
void silu_and_mul_t(T* out, int64_t os, const T* x, int64_t xs, int64_t I, int64_t t0, int64_t t1) {
  const R one = Vec::set1(1.0f);
  const R zero = Vec::zero();
  for (int64_t t = t0; t < t1; ++t) {
    const T* g = x + t * xs;
    const T* u = g + I;
    T* o = out + t * os;
    int64_t i = 0;
    for (; i + W <= I; i += W) {
      R a = Vec::load(g + i);
      R s = Vec::template round<T>(Vec::div(a, Vec::add(one, Vec::exp(Vec::sub(zero, a)))));
      Vec::store(o + i, Vec::mul(s, Vec::load(u + i)));
    }
    for (; i < I; ++i) {
      const float a = to_f32(g[i]);
      const float s = round_to<T>(a / (1.0f + std::exp(-a)));
      o[i] = from_f32<T>(s * to_f32(u[i]));
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Rotary embedding, in place. Neox: pairs (i, i + rot/2); GPT-J: pairs (2i, 2i + 1).

template <class T>
inline void rope_neox(T* x, const float* c, const float* s, int64_t half) {
  int64_t i = 0;
  for (; i + W <= half; i += W) {
    R x1 = Vec::load(x + i), x2 = Vec::load(x + half + i);
    R cv = Vec::load(c + i), sv = Vec::load(s + i);
    Vec::store(x + i, Vec::fnma(x2, sv, Vec::mul(x1, cv)));
    Vec::store(x + half + i, Vec::fma(x1, sv, Vec::mul(x2, cv)));
  }
  for (; i < half; ++i) {
    const float a = to_f32(x[i]), b = to_f32(x[half + i]);
    x[i] = from_f32<T>(a * c[i] - b * s[i]);
    x[half + i] = from_f32<T>(b * c[i] + a * s[i]);
  }
}

// ce/se: cos and signed sin expanded to one value per element (ce[2i] = ce[2i+1] = cos_i,
// se[2i] = -sin_i, se[2i+1] = sin_i), so that out = x * ce + swap_pairs(x) * se.
template <class T>
inline void rope_gptj(T* x, const float* ce, const float* se, const float* c, const float* s, int64_t rot) {
  int64_t j = 0;
  if constexpr (W >= 2) {
    for (; j + W <= rot; j += W) {
      R xv = Vec::load(x + j);
      Vec::store(x + j, Vec::fma(Vec::swap_pairs(xv), Vec::load(se + j), Vec::mul(xv, Vec::load(ce + j))));
    }
  }
  for (; j < rot; j += 2) {
    const int64_t i = j / 2;
    const float a = to_f32(x[j]), b = to_f32(x[j + 1]);
    x[j] = from_f32<T>(a * c[i] - b * s[i]);
    x[j + 1] = from_f32<T>(b * c[i] + a * s[i]);
  }
}

template <class T>
void rotary_t(const RotaryParams& p, int64_t t0, int64_t t1) {
  const int64_t rot = p.rot_dim, half = rot / 2, hd = p.head_size;
  alignas(64) float ce[kAttnMaxHeadDim];
  alignas(64) float se[kAttnMaxHeadDim];
  for (int64_t t = t0; t < t1; ++t) {
    const float* c = p.cos_sin_cache + p.positions[t] * rot;
    const float* s = c + half;
    T* q = static_cast<T*>(p.q) + t * p.q_stride;
    T* k = static_cast<T*>(p.k) + t * p.k_stride;
    if (p.is_neox) {
      for (int64_t h = 0; h < p.num_heads; ++h) rope_neox(q + h * hd, c, s, half);
      for (int64_t h = 0; h < p.num_kv_heads; ++h) rope_neox(k + h * hd, c, s, half);
    } else {
      for (int64_t i = 0; i < half; ++i) {
        ce[2 * i] = ce[2 * i + 1] = c[i];
        se[2 * i] = -s[i];
        se[2 * i + 1] = s[i];
      }
      for (int64_t h = 0; h < p.num_heads; ++h) rope_gptj(q + h * hd, ce, se, c, s, rot);
      for (int64_t h = 0; h < p.num_kv_heads; ++h) rope_gptj(k + h * hd, ce, se, c, s, rot);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Paged decode attention: one query token per row, online softmax in fp32, by pieces of spans (kernels.h).

constexpr int64_t kChunk = 32;  // tokens scored at a time (<= one cache block)
constexpr int64_t kAttnAhead = 16;  // tokens whose K / V rows are prefetched ahead (attn_piece)

constexpr int kPV = W >= 16 ? 4 : 2;  // V vectors per step of attn_pv (4 x NG accumulators fit 32 registers)

// acc[g * hd + v * W ..] += sum over the chunk's tokens j < nv[g] of sc[g][j] * V[j] for V vectors of W lanes.
template <class T, int NG, int V>
void attn_pv(float* acc, int64_t hd, const float (*sc)[kChunk], const int64_t* nv, int64_t nmax, const T* vb,
             int64_t tok_stride) {
  R a[NG][V], vv[V];
  for (int g = 0; g < NG; ++g)
    for (int v = 0; v < V; ++v) a[g][v] = Vec::load(acc + g * hd + v * W);
  for (int64_t j = 0; j < nmax; ++j) {
    for (int v = 0; v < V; ++v) vv[v] = Vec::load(vb + j * tok_stride + v * W);
    for (int g = 0; g < NG; ++g) {
      if (j >= nv[g]) continue;  // past the slot's context
      const R s = Vec::set1(sc[g][j]);
      for (int v = 0; v < V; ++v) a[g][v] = Vec::fma(s, vv[v], a[g][v]);
    }
  }
  for (int g = 0; g < NG; ++g)
    for (int v = 0; v < V; ++v) Vec::store(acc + g * hd + v * W, a[g][v]);
}

// One chunk of n cache tokens (K rows kb, V rows vb, tok_stride apart) for NG slots: scores, online-softmax update
// and acc += p . V. Slot g sees the chunk's first nv[g] tokens (0 <= nv[g] <= n: its context ends there). A slot's
// arithmetic is the same whatever the other slots are (the same steps in the same order as for a chunk of nv[g]
// tokens alone), so a row comes out the same bits on its own or in a span.
template <class T, int NG>
void attn_chunk(const AttnParams& p, const T* const* qb, const float* qf, float* acc, float* m, float* l,
                const int64_t* nv, const T* kb, const T* vb) {
  const int64_t hd = p.head_size, tok_stride = p.num_kv_heads * hd;
  alignas(64) float sc[NG][kChunk];
  int64_t jg[NG];  // slot g's scores before jg[g] are done
  int64_t nmax = 0;
  for (int g = 0; g < NG; ++g) {
    jg[g] = 0;
    nmax = nv[g] > nmax ? nv[g] : nmax;
  }
  (void)qb;

  // scores s[g][j] = (q_g * scale) . k_j. Full groups of W tokens: W accumulators per head, summed
  // with one transposing reduction; the remaining tokens one at a time with horizontal sums.
#if defined(__AVX512BF16__)
  // bfloat16 caches on AVX512_BF16: q_g . k_j by vdpbf16ps on the stored bfloat16 values (exact products,
  // float32 sums of pairs), then * scale; no conversion of K to float32, which at 4 query heads per kv head
  // was most of the kernel's vector work.
  if constexpr (std::is_same_v<T, bf16_t>) {
    if (hd % 32 == 0) {
      const R vsc = Vec::set1(p.scale);
      for (int64_t j = 0; j + 16 <= nmax; j += 16) {
        const T* kr = kb + j * tok_stride;
        for (int g = 0; g < NG; ++g) {
          if (j + 16 > nv[g]) continue;
          __m512 a[16];
          for (int u = 0; u < 16; ++u) a[u] = _mm512_setzero_ps();
          for (int64_t i = 0; i < hd; i += 32) {
            const __m512bh qv = (__m512bh)_mm512_loadu_si512(qb[g] + i);
            for (int u = 0; u < 16; ++u)
              a[u] = _mm512_dpbf16_ps(a[u], qv, (__m512bh)_mm512_loadu_si512(kr + u * tok_stride + i));
          }
          Vec::store(&sc[g][j], Vec::mul(Vec::transpose_sum(a), vsc));
        }
      }
      for (int g = 0; g < NG; ++g) jg[g] = nv[g] / 16 * 16;
    }
  }
#endif
  if constexpr (W > 1) {
    int64_t j0 = kChunk;
    for (int g = 0; g < NG; ++g) j0 = jg[g] < j0 ? jg[g] : j0;
    for (int64_t j = j0; j + W <= nmax; j += W) {  // the jg are multiples of 16 (or 0): W divides them
      const T* kr = kb + j * tok_stride;
      for (int g = 0; g < NG; ++g) {
        if (j < jg[g] || j + W > nv[g]) continue;
        R a[W];
        for (int u = 0; u < W; ++u) a[u] = Vec::zero();
        int64_t i = 0;
        for (; i + W <= hd; i += W) {
          const R qv = Vec::load(qf + g * hd + i);
          for (int u = 0; u < W; ++u) a[u] = Vec::fma(qv, Vec::load(kr + u * tok_stride + i), a[u]);
        }
        R s = Vec::transpose_sum(a);
        if (i < hd) {  // head_dim not a multiple of W
          alignas(64) float tail[W];
          for (int u = 0; u < W; ++u) {
            float acc_t = 0.f;
            for (int64_t ii = i; ii < hd; ++ii) acc_t += qf[g * hd + ii] * to_f32(kr[u * tok_stride + ii]);
            tail[u] = acc_t;
          }
          s = Vec::add(s, Vec::load(tail));
        }
        Vec::store(&sc[g][j], s);
      }
    }
    for (int g = 0; g < NG; ++g)
      if (nv[g] > jg[g]) jg[g] += (nv[g] - jg[g]) / W * W;
  }
  {
    int64_t j0 = kChunk;
    for (int g = 0; g < NG; ++g) j0 = jg[g] < j0 ? jg[g] : j0;
    for (int64_t j = j0; j < nmax; ++j) {
      const T* kr = kb + j * tok_stride;
      R a[NG];
      for (int g = 0; g < NG; ++g) a[g] = Vec::zero();
      int64_t i = 0;
      for (; i + W <= hd; i += W) {
        const R kv = Vec::load(kr + i);
        for (int g = 0; g < NG; ++g) a[g] = Vec::fma(Vec::load(qf + g * hd + i), kv, a[g]);
      }
      for (int g = 0; g < NG; ++g) {
        if (j < jg[g] || j >= nv[g]) continue;
        float s = Vec::hsum(a[g]);
        for (int64_t ii = i; ii < hd; ++ii) s += qf[g * hd + ii] * to_f32(kr[ii]);
        sc[g][j] = s;
      }
    }
  }

  // online softmax update: p_j = exp(s_j - m_new), rescale the running sum and accumulator.
  for (int g = 0; g < NG; ++g) {
    const int64_t n = nv[g];
    if (n <= 0) continue;
    float mx = m[g];
    int64_t j = 0;
    if (n >= W) {
      R vm = Vec::load(&sc[g][0]);
      for (j = W; j + W <= n; j += W) vm = Vec::max(vm, Vec::load(&sc[g][j]));
      const float vmax = Vec::hmax(vm);
      mx = vmax > mx ? vmax : mx;
    }
    for (; j < n; ++j) mx = sc[g][j] > mx ? sc[g][j] : mx;
    const float alpha = std::exp(m[g] - mx);
    m[g] = mx;
    const R vmx = Vec::set1(mx);
    R vs = Vec::zero();
    j = 0;
    for (; j + W <= n; j += W) {
      R e = Vec::exp(Vec::sub(Vec::load(&sc[g][j]), vmx));
      Vec::store(&sc[g][j], e);
      vs = Vec::add(vs, e);
    }
    float sum = Vec::hsum(vs);
    for (; j < n; ++j) {
      sc[g][j] = std::exp(sc[g][j] - mx);
      sum += sc[g][j];
    }
    l[g] = l[g] * alpha + sum;
    if (alpha != 1.0f) {
      const R va = Vec::set1(alpha);
      float* ag = acc + g * hd;
      int64_t i = 0;
      for (; i + W <= hd; i += W) Vec::store(ag + i, Vec::mul(Vec::load(ag + i), va));
      for (; i < hd; ++i) ag[i] *= alpha;
    }
  }

  // acc_g += sum_j p_j * v_j over the slot's own tokens: V rows converted once for the NG slots, kPV vectors of
  // them at a time (each sc broadcast once per kPV vectors), the same fma per element in the same order
  int64_t i = 0;
  for (; i + kPV * W <= hd; i += kPV * W) attn_pv<T, NG, kPV>(acc + i, hd, sc, nv, nmax, vb + i, tok_stride);
  for (; i + W <= hd; i += W) attn_pv<T, NG, 1>(acc + i, hd, sc, nv, nmax, vb + i, tok_stride);
  for (; i < hd; ++i) {
    for (int64_t j = 0; j < nmax; ++j) {
      const float vv = to_f32(vb[j * tok_stride + i]);
      for (int g = 0; g < NG; ++g)
        if (j < nv[g]) acc[g * hd + i] += sc[g][j] * vv;
    }
  }
}

template <class T>
void attn_piece(const AttnParams& p, const AttnPiece& pc, int64_t kvh, int64_t part) {
  const int64_t hd = p.head_size, bs = p.block_size, nkv = p.num_kv_heads;
  const int64_t G = p.num_heads / nkv, S = pc.num_slots;
  const int64_t tok_stride = nkv * hd;
  const int64_t blk_stride = bs * tok_stride;
  const T* kc = static_cast<const T*>(p.k_cache) + kvh * hd;
  const T* vc = static_cast<const T*>(p.v_cache) + kvh * hd;
  const int32_t* bt = p.block_tables + pc.table_row * p.bt_stride;
  const int64_t t_begin = part * p.part_tokens;

  alignas(64) float qf[kAttnMaxSlots * kAttnMaxHeadDim];
  alignas(64) float acc[kAttnMaxSlots * kAttnMaxHeadDim];
  float m[kAttnMaxSlots], l[kAttnMaxSlots];
  const T* qb[kAttnMaxSlots];
  int64_t row[kAttnMaxSlots], head[kAttnMaxSlots], ctx[kAttnMaxSlots], nv[kAttnMaxSlots];
  int64_t span_ctx = 0;

  const R vscale = Vec::set1(p.scale);
  for (int64_t g = 0; g < S; ++g) {
    const int64_t slot = pc.slot0 + g;
    row[g] = pc.row0 + slot / G;
    head[g] = kvh * G + slot % G;
    ctx[g] = imin(int64_t(p.context_lens[row[g]]), t_begin + p.part_tokens);
    span_ctx = ctx[g] > span_ctx ? ctx[g] : span_ctx;
    const T* qp = static_cast<const T*>(p.q) + row[g] * p.q_s0 + head[g] * p.q_s1;
    qb[g] = qp;
    float* qg = qf + g * hd;
    int64_t i = 0;
    for (; i + W <= hd; i += W) {
      Vec::store(qg + i, Vec::mul(Vec::load(qp + i), vscale));
      Vec::store(acc + g * hd + i, Vec::zero());
    }
    for (; i < hd; ++i) {
      qg[i] = to_f32(qp[i]) * p.scale;
      acc[g * hd + i] = 0.f;
    }
    m[g] = -std::numeric_limits<float>::infinity();
    l[g] = 0.f;
  }
  const int64_t t_end = span_ctx;  // the partition's end or the span's longest context

  // The rows of one kv head are tok_stride apart in the cache (a strided stream of hd * sizeof(T) bytes per token
  // that the hardware prefetchers follow poorly once a decode step's weights have pushed the cache out of L3): the
  // rows of K and V are prefetched kAttnAhead tokens ahead of the chunk being scored. Measured on the 2-core Zen 5
  // dev VM, caches out of L3 (80-200 layers' caches cycled), context 540, bfloat16, 2 threads: SmolLM2's 9 / 3
  // heads 67.5 us a call without, 31-34 with 16 tokens ahead (8: 51, 32: 31-36, 64: 42); 1B-Llama's 32 / 8 heads
  // 113 us without, 60-65 with 16 (8: 72-78, 32: 71-82, 64: 79). The prefetches go to L2 (prefetcht2, locality
  // 1): the L1 has too few miss buffers for the 64 lines in flight. Measured 2026-12-04 on the same VM, 1B-Llama
  // shape, context 580, 64 layers' caches cycled, 2 threads, with the vdpbf16ps scores: 109-117 us a call with
  // prefetcht0, 65-68 with prefetcht1, 51 with prefetcht2 (16 or 32 tokens ahead; 64: 56-64), 115-135 with
  // prefetchnta; caches in L2: 42-44 us whichever.
  int64_t pf = t_begin;  // tokens before pf are prefetched
  auto prefetch_to = [&](int64_t t2) {
    t2 = imin(t2, t_end);
    const int64_t rowb = hd * int64_t(sizeof(T));
    for (; pf < t2; ++pf) {
      const int64_t at = int64_t(bt[pf / bs]) * blk_stride + (pf % bs) * tok_stride;
      const char* k2 = reinterpret_cast<const char*>(kc + at);
      const char* v2 = reinterpret_cast<const char*>(vc + at);
      for (int64_t c = 0; c < rowb; c += 64) {
        __builtin_prefetch(k2 + c, 0, 1);
        __builtin_prefetch(v2 + c, 0, 1);
      }
    }
  };
  prefetch_to(t_begin + kAttnAhead);

  for (int64_t t = t_begin; t < t_end;) {
    const int64_t off = t % bs;
    const int64_t n = imin(imin(bs - off, kChunk), t_end - t);
    const int64_t base = int64_t(bt[t / bs]) * blk_stride + off * tok_stride;
    const T* kb = kc + base;
    const T* vb = vc + base;
    prefetch_to(t + n + kAttnAhead);
    for (int64_t g = 0; g < S; ++g) nv[g] = imin(n, ctx[g] > t ? ctx[g] - t : 0);
    // the slots kAttnGroup at a time: the chunk's K / V rows come from memory once, then from L1
    for (int64_t g0 = 0; g0 < S; g0 += kAttnGroup) {
      switch (imin(kAttnGroup, S - g0)) {
        case 1: attn_chunk<T, 1>(p, qb + g0, qf + g0 * hd, acc + g0 * hd, m + g0, l + g0, nv + g0, kb, vb); break;
        case 2: attn_chunk<T, 2>(p, qb + g0, qf + g0 * hd, acc + g0 * hd, m + g0, l + g0, nv + g0, kb, vb); break;
        case 3: attn_chunk<T, 3>(p, qb + g0, qf + g0 * hd, acc + g0 * hd, m + g0, l + g0, nv + g0, kb, vb); break;
        default: attn_chunk<T, 4>(p, qb + g0, qf + g0 * hd, acc + g0 * hd, m + g0, l + g0, nv + g0, kb, vb); break;
      }
    }
    t += n;
  }
  static_assert(kAttnGroup == 4, "attn_piece's switch assumes groups of at most 4 slots");

  for (int64_t g = 0; g < S; ++g) {
    if (p.num_parts == 1) {
      T* o = static_cast<T*>(p.out) + row[g] * p.out_s0 + head[g] * p.out_s1;
      const float inv = l[g] > 0.f ? 1.0f / l[g] : 0.f;
      const R vinv = Vec::set1(inv);
      int64_t i = 0;
      for (; i + W <= hd; i += W) Vec::store(o + i, Vec::mul(Vec::load(acc + g * hd + i), vinv));
      for (; i < hd; ++i) o[i] = from_f32<T>(acc[g * hd + i] * inv);
    } else {
      float* w = p.ws + ((row[g] * p.num_heads + head[g]) * p.num_parts + part) * (2 + hd);
      w[0] = m[g];
      w[1] = l[g];
      for (int64_t i = 0; i < hd; ++i) w[2 + i] = acc[g * hd + i];
    }
  }
}

template <class T>
void attn_items_t(const AttnParams& p, int64_t i0, int64_t i1) {
  for (int64_t it = i0; it < i1; ++it) {
    const int64_t part = it % p.num_parts, r = it / p.num_parts;
    attn_piece<T>(p, p.pieces[r / p.num_kv_heads], r % p.num_kv_heads, part);
  }
}

template <class T>
void attn_reduce_t(const AttnParams& p, int64_t i0, int64_t i1) {
  const int64_t hd = p.head_size, P = p.num_parts;
  for (int64_t it = i0; it < i1; ++it) {
    const int64_t b = it / p.num_heads, h = it % p.num_heads;
    const float* w = p.ws + it * P * (2 + hd);
    float M = -std::numeric_limits<float>::infinity();
    for (int64_t q = 0; q < P; ++q)
      if (w[q * (2 + hd) + 1] > 0.f && w[q * (2 + hd)] > M) M = w[q * (2 + hd)];
    alignas(64) float o[kAttnMaxHeadDim];
    for (int64_t i = 0; i < hd; ++i) o[i] = 0.f;
    float L = 0.f;
    for (int64_t q = 0; q < P; ++q) {
      const float* wq = w + q * (2 + hd);
      if (!(wq[1] > 0.f)) continue;
      const float f = std::exp(wq[0] - M);
      L += wq[1] * f;
      const R vf = Vec::set1(f);
      int64_t i = 0;
      for (; i + W <= hd; i += W) Vec::store(o + i, Vec::fma(Vec::load(wq + 2 + i), vf, Vec::load(o + i)));
      for (; i < hd; ++i) o[i] += wq[2 + i] * f;
    }
    const float inv = L > 0.f ? 1.0f / L : 0.f;
    T* out = static_cast<T*>(p.out) + b * p.out_s0 + h * p.out_s1;
    const R vinv = Vec::set1(inv);
    int64_t i = 0;
    for (; i + W <= hd; i += W) Vec::store(out + i, Vec::mul(Vec::load(o + i), vinv));
    for (; i < hd; ++i) out[i] = from_f32<T>(o[i] * inv);
  }
}

// ---------------------------------------------------------------------------------------------------
// dtype dispatch (dtype codes: 0 float32, 1 bfloat16, 2 float16; validated by the dispatcher)

#define KESTREL_DTYPE_SWITCH(dt, ...)                  \
  switch (dt) {                                        \
    case kFloat32: { using T = float; __VA_ARGS__; break; }  \
    case kBFloat16: { using T = bf16_t; __VA_ARGS__; break; } \
    default: { using T = f16_t; __VA_ARGS__; break; }        \
  }

void rms_norm_k(int dt, void* out, int64_t os, const void* x, int64_t xs, const void* w, int64_t H, float eps,
                int64_t t0, int64_t t1) {
  KESTREL_DTYPE_SWITCH(dt, rms_norm_t<T>(static_cast<T*>(out), os, static_cast<const T*>(x), xs,
                                         static_cast<const T*>(w), H, eps, t0, t1))
}
void fused_add_rms_norm_k(int dt, void* x, int64_t xs, void* r, int64_t rs, const void* w, int64_t H, float eps,
                          int64_t t0, int64_t t1) {
  KESTREL_DTYPE_SWITCH(dt, fused_add_rms_norm_t<T>(static_cast<T*>(x), xs, static_cast<T*>(r), rs,
                                                   static_cast<const T*>(w), H, eps, t0, t1))
}
void rotary_k(const RotaryParams& p, int64_t t0, int64_t t1) { KESTREL_DTYPE_SWITCH(p.dtype, rotary_t<T>(p, t0, t1)) }
void silu_and_mul_k(int dt, void* out, int64_t os, const void* x, int64_t xs, int64_t I, int64_t t0, int64_t t1) {
  KESTREL_DTYPE_SWITCH(dt, silu_and_mul_t<T>(static_cast<T*>(out), os, static_cast<const T*>(x), xs, I, t0, t1))
}
void attn_items_k(const AttnParams& p, int64_t i0, int64_t i1) {
  KESTREL_DTYPE_SWITCH(p.dtype, attn_items_t<T>(p, i0, i1))
}
void attn_reduce_k(const AttnParams& p, int64_t i0, int64_t i1) {
  KESTREL_DTYPE_SWITCH(p.dtype, attn_reduce_t<T>(p, i0, i1))
}

#undef KESTREL_DTYPE_SWITCH

}  // namespace
}  // namespace kestrel::cpu::KESTREL_ISA_NS
