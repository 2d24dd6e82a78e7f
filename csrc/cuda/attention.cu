// Paged decode attention on CUDA (flash-decoding style).
//
// Grid (num_heads / G, B, splits): each block takes the G query heads that share a KV head (G = 1: one query
// head) of one sequence over one partition of its context; 4 warps walk the partition, each warp scoring 4 tokens
// per step against all G heads (lanes split head_dim, each key and value loaded once, four independent loads and
// reductions in flight), with an online softmax in fp32 per warp and head. Warps merge
// through shared memory. With one split the block writes the output; with several, each writes its
// partial (max, sum, acc[hd]) to a workspace and a second kernel merges the partitions.
// The number of splits depends only on host-known sizes (B, heads, block table capacity, and the partition
// size or count when the caller fixes it), so the launch can be captured in a CUDA graph; partitions past a
// sequence's context exit at once without writing, and the merge reads only the partitions its context covers.
// Partitions are either of a fixed length (part_tokens > 0) or, with part_tokens = -splits (CUDA graphs), each
// sequence's context cut into that many equal partitions of at least kMinDynPart tokens on the device (a graph's
// table is as wide as the longest possible context: fixed partitions over it launched mostly empty blocks).
//
// paged_decode_vec_kernel (bf16 / fp16, fp32 up to head size 128; head sizes 64, 128, 256): 16-byte loads, a
// lane group of head_dim / 8 lanes per token (two tokens per warp load at head size 128), the keys and values
// of U tokens per lane group loaded together before any use; the scalar kernel (2-byte loads, keys before
// values) takes the other shapes. H200, Llama-3-8B shape, 512-token contexts: measured in kestrel bench gpu.
//
// fp8 caches (--kv-cache-dtype fp8; fp8_cache.cuh): both kernels are instantiated for a cache element C = fp8_t
// beside C = T (the model dtype's instances are unchanged): the vector kernel keeps its lanes and tokens and loads
// 8 bytes (4 for fp32 queries) of e4m3 where it loaded 16 of bf16; the key scale is folded into the query, the
// value scale applied to each warp's accumulator before the merge (softmax weights do not depend on it).
#include <cstdlib>
#include <type_traits>

#include "common.cuh"
#include "fp8_cache.cuh"
#include "ops.h"

namespace kestrel::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kTokensPerWarpStep = 4;
constexpr int kMaxHeadDim = 256;
constexpr int kMinPartition = 64;  // tokens
constexpr int kMaxSplits = 1024;   // partitions per context at most (plan)
constexpr int kMinDynPart = 32;    // tokens: the shortest partition of a context cut into -part_tokens pieces

// The partition length of a sequence with `ctx` tokens: fixed (part_tokens > 0) or its context over the grid's
// splits, rounded up to 16 tokens, at least kMinDynPart (part_tokens < 0).
__device__ __forceinline__ int part_len(int ctx, int splits, int part_tokens) {
  if (part_tokens > 0) return part_tokens;
  const int p = ((ctx + splits - 1) / splits + 15) / 16 * 16;
  return p > kMinDynPart ? p : kMinDynPart;
}

// The output of one (query head, sequence) from the per-warp (max, sum, acc) in shared memory: written to `out`
// with one split, to the workspace with several.
template <class T, int G, int HDS>
__device__ __forceinline__ void finish_block(T* __restrict__ out, int64_t os0, int64_t os1, float* __restrict__ ws,
                                             const float (&sm_m)[kWarps][G], const float (&sm_l)[kWarps][G],
                                             const float (&sm_acc)[kWarps][G][HDS], int b, int h0, int nh, int hd,
                                             int part, int splits) {
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      if (sm_l[w][g] > 0.f) M = fmaxf(M, sm_m[w][g]);
    float L = 0.f, f[kWarps];
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      f[w] = sm_l[w][g] > 0.f ? expf(sm_m[w][g] - M) : 0.f;
      L += sm_l[w][g] * f[w];
    }
    const int h = h0 + g;
    const float inv = L > 0.f ? 1.f / L : 0.f;
    float* wp = splits == 1 ? nullptr : ws + ((int64_t(b) * nh + h) * splits + part) * (2 + hd);
    if (wp && threadIdx.x == 0) {
      wp[0] = M;
      wp[1] = L;
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
      float o = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) o += sm_acc[w][g][d] * f[w];
      if (wp)
        wp[2 + d] = o;
      else
        out[b * os0 + h * os1 + d] = from_f<T>(o * inv);
    }
  }
}

// A cached key or value element as float: C = T as it is, C = fp8_t converted (the scale applied by the caller).
template <class C>
__device__ __forceinline__ float ld_cache(const C* p) {
  if constexpr (std::is_same_v<C, fp8_t>) return fp8_to_f(*p);
  else return ld(p);
}

// The scale of an fp8 cache (1 for the model dtype's: not read).
template <class T, class C>
__device__ __forceinline__ float read_scale(const float* __restrict__ scale) {
  if constexpr (std::is_same_v<C, T>) return 1.f;
  else return *scale;
}

// G query heads per block: the query heads that share one KV head (GQA) read each key and value once for all of
// them (G = num_heads / num_kv_heads when it is 2, 4 or 8 and the registers allow; grid.x = KV heads). G = 1: one
// query head per block (grid.x = query heads), any ratio.
template <class T, class C, int VPL, int G>  // VPL: head_dim values per lane (head_dim <= 32 * VPL)
__global__ void __launch_bounds__(kWarps * 32)
    paged_decode_kernel(T* __restrict__ out, int64_t os0, int64_t os1, float* __restrict__ ws,
                        const T* __restrict__ q, int64_t qs0, int64_t qs1, const C* __restrict__ kc,
                        const C* __restrict__ vc, const int32_t* __restrict__ block_tables, int64_t bts,
                        const int32_t* __restrict__ ctx_lens, int nh, int nkv, int hd, int bs, float scale,
                        int part_tokens, const float* __restrict__ k_scale, const float* __restrict__ v_scale) {
  dependent_entry();
  constexpr int U = kTokensPerWarpStep;
  const int b = blockIdx.y, part = blockIdx.z, splits = gridDim.z;
  const int h0 = G == 1 ? int(blockIdx.x) : int(blockIdx.x) * G;  // the first query head of the block
  const int kvh = G == 1 ? h0 / (nh / nkv) : int(blockIdx.x);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ctx = ctx_lens[b];
  const int plen = part_len(ctx, splits, part_tokens);
  const int t_begin = part * plen;
  const int t_end = min(ctx, t_begin + plen);
  if (splits > 1 && t_begin >= ctx) return;  // past the context: the merge does not read this partition
  const int32_t* bt = block_tables + b * bts;
  const int64_t tok_stride = int64_t(nkv) * hd;

  float qr[G][VPL], acc[G][VPL], m[G], l[G];
  const float qscale = scale * read_scale<T, C>(k_scale);
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int v = 0; v < VPL; ++v) {
      const int d = lane + 32 * v;
      qr[g][v] = d < hd ? ld(q + b * qs0 + (h0 + g) * qs1 + d) * qscale : 0.f;
      acc[g][v] = 0.f;
    }
    m[g] = -INFINITY;
    l[g] = 0.f;
  }

  for (int t0 = t_begin + warp * U; t0 < t_end; t0 += kWarps * U) {
    int64_t base[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int t = min(t0 + u, t_end - 1);  // clamp: out-of-range tokens are masked below
      base[u] = (int64_t(bt[t / bs]) * bs + t % bs) * tok_stride + int64_t(kvh) * hd;
    }
    float kf[U][VPL];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int v = 0; v < VPL; ++v) {
        const int d = lane + 32 * v;
        kf[u][v] = d < hd ? ld_cache(kc + base[u] + d) : 0.f;
      }
    float s[G][U];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float p = 0.f;
#pragma unroll
        for (int v = 0; v < VPL; ++v) p += qr[g][v] * kf[u][v];
        s[g][u] = p;
      }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
      for (int g = 0; g < G; ++g)
#pragma unroll
        for (int u = 0; u < U; ++u) s[g][u] += __shfl_xor_sync(0xffffffffu, s[g][u], o);
    float vf[U][VPL];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int v = 0; v < VPL; ++v) {
        const int d = lane + 32 * v;
        vf[u][v] = d < hd ? ld_cache(vc + base[u] + d) : 0.f;
      }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float mn = m[g];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (t0 + u >= t_end) s[g][u] = -INFINITY;
        mn = fmaxf(mn, s[g][u]);
      }
      const float alpha = expf(m[g] - mn);
      float p[U];
      float lg = l[g] * alpha;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        p[u] = expf(s[g][u] - mn);
        lg += p[u];
      }
      l[g] = lg;
#pragma unroll
      for (int v = 0; v < VPL; ++v) {
        float a = acc[g][v] * alpha;
#pragma unroll
        for (int u = 0; u < U; ++u) a += p[u] * vf[u][v];
        acc[g][v] = a;
      }
      m[g] = mn;
    }
  }

  if constexpr (!std::is_same_v<C, T>) {
    const float vsc = *v_scale;
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int v = 0; v < VPL; ++v) acc[g][v] *= vsc;
  }
  __shared__ float sm_m[kWarps][G], sm_l[kWarps][G];
  __shared__ float sm_acc[kWarps][G][kMaxHeadDim / (G > 4 ? 2 : 1)];
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      sm_m[warp][g] = m[g];
      sm_l[warp][g] = l[g];
    }
  }
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int v = 0; v < VPL; ++v) {
      const int d = lane + 32 * v;
      if (d < hd) sm_acc[warp][g][d] = acc[g][v];
    }
  __syncthreads();
  finish_block<T, G>(out, os0, os1, ws, sm_m, sm_l, sm_acc, b, h0, nh, hd, part, splits);
}

// A token's row in the paged cache: a shift and a mask when the block size is a power of two (16, 64: the usual
// ones), else a division (one per token per warp step made the kernel's address arithmetic its largest cost).
struct PageIndex {
  int bs, shift;  // shift < 0: not a power of two
  __device__ __forceinline__ int64_t row(const int32_t* __restrict__ bt, int t) const {
    if (shift >= 0) return (int64_t(bt[t >> shift]) << shift) | (t & (bs - 1));
    return int64_t(bt[t / bs]) * bs + t % bs;
  }
};

__host__ __device__ constexpr int ilog2(int n) { return n <= 1 ? 0 : 1 + ilog2(n / 2); }

// Sum each of N values over the LPT lanes of a lane group and give every lane all N sums. A halving exchange:
// each round a lane sends half of its partial sums to its partner and keeps the other half, so the rounds move
// N/2, N/4, ... values (N - 1 shuffles instead of N x log2(LPT)); then the sums are broadcast back (N shuffles).
// After the halving rounds lane li holds the sums of values i + left * li (N >= LPT) or li >> log2(LPT / N).
template <int N, int LPT>
__device__ __forceinline__ void group_sum_all(float (&v)[N], int li) {
  constexpr int kHalvings = ilog2(N < LPT ? N : LPT);
  constexpr int kLeft = N >> kHalvings;
  float w[N];
#pragma unroll
  for (int i = 0; i < N; ++i) w[i] = v[i];
#pragma unroll
  for (int k = 0; k < kHalvings; ++k) {
    const int o = LPT >> (k + 1), half = N >> (k + 1);
    const bool up = li & o;
#pragma unroll
    for (int i = 0; i < half; ++i) {
      const float send = up ? w[i] : w[i + half];
      const float keep = up ? w[i + half] : w[i];
      w[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
  }
#pragma unroll
  for (int o = (LPT >> kHalvings) / 2; o > 0; o >>= 1)
#pragma unroll
    for (int i = 0; i < kLeft; ++i) w[i] += __shfl_xor_sync(0xffffffffu, w[i], o);
#pragma unroll
  for (int j = 0; j < N; ++j)
    v[j] = __shfl_sync(0xffffffffu, w[j % kLeft], N >= LPT ? j / kLeft : j * (LPT / N), LPT);
}

// 16-byte loads: LPT = HD / E lanes hold one token's head vector (E elements each), TPW = 32 / LPT tokens per
// warp load; each lane group walks its own tokens with its own online softmax, merged across the warp's groups
// by shuffles and across warps through shared memory. U token loads (keys and values) in flight per lane.
// Scores are kept in base-2 units (q pre-scaled by log2 e, exp2f: one MUFU op, where expf is a longer exact
// sequence); the maxima go to shared memory in natural units, as finish_block and the merge kernel expect.
// Blocks per SM the registers must allow: G = 4 needs 168 registers at U = 4, fits 128 (four blocks) at U = 2
// and 102 (five) at U = 1 without spills; the other instances need no bound.
// The fp8 instances' conversions take a few registers more: G x U = 4 spilled at 96 (5 blocks), so they keep 4.
constexpr int vec_min_blocks(int G, int U, bool fp8 = false) {
  return G * U <= 4 && !fp8 ? 5 : G * U <= 8 ? 4 : 1;
}

// E cached elements as a load unit: a 16-byte Pack<T>, or the same count of e4m3 bytes.
template <class T, class C>
using CachePack = std::conditional_t<std::is_same_v<C, T>, Pack<T>, Fp8Pack<Pack<T>::N>>;

template <class T, class C>
__device__ __forceinline__ void cache_pack_to_f(const CachePack<T, C>& p, float (&out)[Pack<T>::N]) {
  if constexpr (std::is_same_v<C, T>) {
#pragma unroll
    for (int e = 0; e < Pack<T>::N; ++e) out[e] = ld(&p.v[e]);
  } else {
    fp8_pack_to_f(p, out);
  }
}

template <class T, class C, int HD, int G, int U>
__global__ void __launch_bounds__(kWarps * 32, vec_min_blocks(G, U, !std::is_same_v<C, T>))
    paged_decode_vec_kernel(T* __restrict__ out, int64_t os0, int64_t os1, float* __restrict__ ws,
                            const T* __restrict__ q, int64_t qs0, int64_t qs1, const C* __restrict__ kc,
                            const C* __restrict__ vc, const int32_t* __restrict__ block_tables, int64_t bts,
                            const int32_t* __restrict__ ctx_lens, int nh, int nkv, int hd, int bs, float scale,
                            int part_tokens, const float* __restrict__ k_scale, const float* __restrict__ v_scale) {
  dependent_entry();
  constexpr int E = Pack<T>::N, LPT = HD / E, TPW = 32 / LPT;
  using KV = CachePack<T, C>;
  constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
  static_assert(LPT >= 1 && LPT <= 32 && (32 % LPT) == 0, "head size / vector width must divide a warp");
  const int b = blockIdx.y, part = blockIdx.z, splits = gridDim.z;
  const int h0 = G == 1 ? int(blockIdx.x) : int(blockIdx.x) * G;
  const int kvh = G == 1 ? h0 / (nh / nkv) : int(blockIdx.x);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = lane / LPT, li = lane % LPT;
  const int ctx = ctx_lens[b];
  const int plen = part_len(ctx, splits, part_tokens);
  const int t_begin = part * plen;
  const int t_end = min(ctx, t_begin + plen);
  if (splits > 1 && t_begin >= ctx) return;
  const int32_t* bt = block_tables + b * bts;
  const PageIndex page{bs, (bs & (bs - 1)) == 0 ? __ffs(bs) - 1 : -1};
  const int64_t tok_stride = int64_t(nkv) * HD;
  const C* kh = kc + int64_t(kvh) * HD + li * E;
  const C* vh = vc + int64_t(kvh) * HD + li * E;

  float qr[G][E], acc[G][E], m[G], l[G];
  const float qscale = scale * kLog2e * read_scale<T, C>(k_scale);
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const Pack<T> qp = *reinterpret_cast<const Pack<T>*>(q + b * qs0 + (h0 + g) * qs1 + li * E);
#pragma unroll
    for (int e = 0; e < E; ++e) {
      qr[g][e] = ld(&qp.v[e]) * qscale;
      acc[g][e] = 0.f;
    }
    m[g] = -INFINITY;
    l[g] = 0.f;
  }

  constexpr int kStep = kWarps * U * TPW;
  for (int t0 = t_begin + warp * U * TPW; t0 < t_end; t0 += kStep) {
    KV kp[U], vp[U];
    bool valid[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int tok = t0 + u * TPW + sub;
      valid[u] = tok < t_end;
      const int64_t base = page.row(bt, min(tok, t_end - 1)) * tok_stride;  // clamped: masked below
      kp[u] = *reinterpret_cast<const KV*>(kh + base);
      vp[u] = *reinterpret_cast<const KV*>(vh + base);
    }
    float s[G * U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float k[E];
      cache_pack_to_f<T, C>(kp[u], k);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float p = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) p += qr[g][e] * k[e];
        s[g * U + u] = p;
      }
    }
    group_sum_all<G * U, LPT>(s, li);
    float v[U][E];
#pragma unroll
    for (int u = 0; u < U; ++u) cache_pack_to_f<T, C>(vp[u], v[u]);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float mn = m[g];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (!valid[u]) s[g * U + u] = -INFINITY;
        mn = fmaxf(mn, s[g * U + u]);
      }
      const float ms = mn == -INFINITY ? 0.f : mn;  // a lane group with no token yet keeps l = acc = 0
      const float alpha = exp2f(m[g] - ms);
      float p[U];
      float lg = l[g] * alpha;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        p[u] = exp2f(s[g * U + u] - ms);
        lg += p[u];
      }
      l[g] = lg;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        float a = acc[g][e] * alpha;
#pragma unroll
        for (int u = 0; u < U; ++u) a += p[u] * v[u][e];
        acc[g][e] = a;
      }
      m[g] = mn;
    }
  }
  // the warp's lane groups into one (max, sum, acc) per head
#pragma unroll
  for (int o = LPT; o < 32; o <<= 1)
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float mo = __shfl_xor_sync(0xffffffffu, m[g], o), lo = __shfl_xor_sync(0xffffffffu, l[g], o);
      const float M = fmaxf(m[g], mo);
      const float fa = l[g] > 0.f ? exp2f(m[g] - M) : 0.f, fb = lo > 0.f ? exp2f(mo - M) : 0.f;
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const float ao = __shfl_xor_sync(0xffffffffu, acc[g][e], o);
        acc[g][e] = acc[g][e] * fa + ao * fb;
      }
      l[g] = l[g] * fa + lo * fb;
      m[g] = M;
    }

  if constexpr (!std::is_same_v<C, T>) {
    const float vsc = *v_scale;
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int e = 0; e < E; ++e) acc[g][e] *= vsc;
  }
  __shared__ float sm_m[kWarps][G], sm_l[kWarps][G];
  __shared__ float sm_acc[kWarps][G][HD];
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      sm_m[warp][g] = m[g] * kLn2;  // natural units from here on
      sm_l[warp][g] = l[g];
    }
  }
  if (sub == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int e = 0; e < E; ++e) sm_acc[warp][g][li * E + e] = acc[g][e];
  }
  __syncthreads();
  finish_block<T, G>(out, os0, os1, ws, sm_m, sm_l, sm_acc, b, h0, nh, hd, part, splits);
}

// Merge the partitions of one (head, sequence) that its context covers. The partitions' maxima and weights are
// found by the block together (threads over partitions), the weights kept in shared memory, then one thread per
// output element sums its column with loads that depend on nothing before them (a loop that tested each
// partition's sum before loading its column took 8.8 us per layer at batch 1 over 17 partitions on the H200).
template <class T>
__global__ void paged_decode_reduce_kernel(T* __restrict__ out, int64_t os0, int64_t os1,
                                           const float* __restrict__ ws, const int32_t* __restrict__ ctx_lens,
                                           int nh, int hd, int splits, int part_tokens) {
  dependent_entry();
  __shared__ float weight[kMaxSplits];
  const int h = blockIdx.x, b = blockIdx.y;
  const int64_t stride = 2 + hd;
  const float* wp = ws + (int64_t(b) * nh + h) * splits * stride;
  const int plen = part_len(ctx_lens[b], splits, part_tokens);
  const int parts = min(splits, (ctx_lens[b] + plen - 1) / plen);
  float m = -INFINITY;
  for (int p = threadIdx.x; p < parts; p += blockDim.x)
    if (wp[p * stride + 1] > 0.f) m = fmaxf(m, wp[p * stride]);
  const float M = block_max(m);
  float l = 0.f;
  for (int p = threadIdx.x; p < parts; p += blockDim.x) {
    const float lp = wp[p * stride + 1];
    const float f = lp > 0.f ? expf(wp[p * stride] - M) : 0.f;  // a partition with no token wrote zeros
    weight[p] = f;
    l += lp * f;
  }
  const float L = block_sum(l);  // synchronises the block: the weights are visible below
  const float inv = L > 0.f ? 1.f / L : 0.f;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.f;
    for (int p = 0; p < parts; ++p) o += weight[p] * wp[p * stride + 2 + d];
    out[b * os0 + h * os1 + d] = from_f<T>(o * inv);
  }
}

struct Plan {
  int splits;
  int part_tokens;
};

// Query heads per block (the kernel's G): the GQA group when it is 2, 4 or 8 and G x VPL <= 32 (registers), else 1.
int group_for(int64_t nh, int64_t nkv, int64_t hd) {
  const int64_t vpl = hd <= 64 ? 2 : hd <= 128 ? 4 : 8;
  const int64_t g = nkv > 0 ? nh / nkv : 1;
  return (g == 2 || g == 4 || g == 8) && g * vpl <= 32 ? int(g) : 1;
}

// Enough blocks to fill the GPU about twice, partitions of >= kMinPartition tokens; or partitions of the given
// size (rounded up to a warp step, at most kMaxSplits of them) over the whole capacity. `base`: blocks per partition.
Plan plan(int64_t base, int64_t max_tokens, int64_t part_tokens, int device) {
  const int64_t step = kWarps * kTokensPerWarpStep;
  if (part_tokens < 0) {  // -splits: each context cut on the device into that many partitions (part_len)
    const int64_t most = std::max<int64_t>(1, (max_tokens + kMinDynPart - 1) / kMinDynPart);
    return Plan{int(std::max<int64_t>(1, std::min<int64_t>({-part_tokens, most, int64_t(kMaxSplits)}))),
                int(part_tokens)};
  }
  if (part_tokens > 0) {
    int64_t part = std::max<int64_t>({(part_tokens + step - 1) / step * step,
                                      (max_tokens + kMaxSplits - 1) / kMaxSplits, step});
    part = (part + step - 1) / step * step;
    return Plan{int((max_tokens + part - 1) / part), int(part)};
  }
  const int64_t target = 2 * int64_t(sm_count(device));
  int64_t splits = base >= target ? 1 : (target + base - 1) / base;
  const int64_t max_splits = (max_tokens + kMinPartition - 1) / kMinPartition;
  splits = std::max<int64_t>(1, std::min<int64_t>({splits, max_splits, int64_t(kMaxSplits)}));
  int64_t part = (max_tokens + splits - 1) / splits;
  part = (part + step - 1) / step * step;
  if (part <= 0) part = step;
  splits = (max_tokens + part - 1) / part;
  if (splits < 1) splits = 1;
  return Plan{int(splits), int(part)};
}

// Tokens per lane group per warp step in the G = 4 vector kernel (its U) is 2: it fits the kernel in 128 registers
// (4 blocks per SM; U = 4 needs 165, 3 blocks). U = 2 was faster than 1 and 4 at every batch and context kestrel
// bench gpu measured on the H200 (docs/benchmarks/gpu_decode_2026-12-02.md, run g: b64 x 512 2,142 GB/s against
// 1,642 (U = 1) and 1,732 (U = 4)); the other two were deleted with their switch (issue 46).

template <class T, class C>
void launch_decode(int vpl, dim3 grid, dim3 rgrid, int rthreads, cudaStream_t st, int device, const Plan& p,
                   uintptr_t out,
                   int64_t os0, int64_t os1, float* ws, uintptr_t q, int64_t qs0, int64_t qs1, uintptr_t k_cache,
                   uintptr_t v_cache, uintptr_t block_tables, int64_t bts, uintptr_t context_lens, int64_t nh,
                   int64_t nkv, int64_t hd, int64_t bs, float scale, uintptr_t k_scale, uintptr_t v_scale) {
  T* o = reinterpret_cast<T*>(out);
  const T* qp = reinterpret_cast<const T*>(q);
  const C* kp = reinterpret_cast<const C*>(k_cache);
  const C* vp = reinterpret_cast<const C*>(v_cache);
  const int32_t* btp = reinterpret_cast<const int32_t*>(block_tables);
  const int32_t* clp = reinterpret_cast<const int32_t*>(context_lens);
  const float* ksp = reinterpret_cast<const float*>(k_scale);
  const float* vsp = reinterpret_cast<const float*>(v_scale);
  auto run = [&](auto kernel) {
    launch("paged_decode_attention", kernel, grid, dim3(kWarps * 32), st, device, o, os0, os1, ws, qp, qs0, qs1, kp, vp,
           btp, bts, clp, int(nh), int(nkv), int(hd), int(bs), scale, p.part_tokens, ksp, vsp);
  };
  const int G = group_for(nh, nkv, hd);
  constexpr int E = Pack<T>::N;
  const bool vec = (hd == 64 || hd == 128 || (hd == 256 && E == 8)) && q % 16 == 0 && k_cache % 16 == 0 &&
                   v_cache % 16 == 0 && qs0 % E == 0 && qs1 % E == 0;
  auto pick_vec = [&](auto hd_c) {
    constexpr int HD = decltype(hd_c)::value;
    if constexpr (HD / E <= 32) {
      if (G == 8) return run(paged_decode_vec_kernel<T, C, HD, 8, 2>);
      if (G == 4) return run(paged_decode_vec_kernel<T, C, HD, 4, 2>);
      if (G == 2) return run(paged_decode_vec_kernel<T, C, HD, 2, 4>);
      return run(paged_decode_vec_kernel<T, C, HD, 1, 4>);
    }
  };
  auto pick = [&](auto vpl_c) {
    constexpr int V = decltype(vpl_c)::value;
    if constexpr (8 * V <= 32)
      if (G == 8) return run(paged_decode_kernel<T, C, V, 8>);
    if constexpr (4 * V <= 32)
      if (G == 4) return run(paged_decode_kernel<T, C, V, 4>);
    if (G == 2) return run(paged_decode_kernel<T, C, V, 2>);
    run(paged_decode_kernel<T, C, V, 1>);
  };
  if (vec && hd == 64) pick_vec(std::integral_constant<int, 64>{});
  else if (vec && hd == 128) pick_vec(std::integral_constant<int, 128>{});
  else if (vec && hd == 256) pick_vec(std::integral_constant<int, 256>{});
  else if (vpl <= 2) pick(std::integral_constant<int, 2>{});
  else if (vpl <= 4) pick(std::integral_constant<int, 4>{});
  else pick(std::integral_constant<int, 8>{});
  if (p.splits > 1)
    launch("paged_decode_attention (merge)", paged_decode_reduce_kernel<T>, rgrid, dim3(rthreads), st, device, o, os0,
           os1, ws, clp, int(nh), int(hd), p.splits, p.part_tokens);
}

}  // namespace

int64_t paged_decode_attention_workspace(int64_t B, int64_t nh, int64_t nkv, int64_t hd, int64_t max_tokens,
                                         int64_t part_tokens, int device) {
  const Plan p = plan(B * nh / group_for(nh, nkv, hd), max_tokens, part_tokens, device);
  return p.splits > 1 ? B * nh * p.splits * (2 + hd) : 0;
}

void paged_decode_attention(int dt, uintptr_t out, int64_t os0, int64_t os1, uintptr_t q, int64_t qs0, int64_t qs1,
                            uintptr_t k_cache, uintptr_t v_cache, uintptr_t block_tables, int64_t bts,
                            int64_t max_blocks, uintptr_t context_lens, int64_t B, int64_t nh, int64_t nkv,
                            int64_t hd, int64_t bs, double scale, uintptr_t workspace, int64_t workspace_floats,
                            int64_t part_tokens, int cdt, uintptr_t k_scale, uintptr_t v_scale, int device,
                            uintptr_t stream) {
  if (B <= 0 || nh <= 0) return;
  if (hd > kMaxHeadDim) throw std::invalid_argument("paged_decode_attention (CUDA): head_size must be <= 256");
  if (nkv <= 0 || nh % nkv) throw std::invalid_argument("paged_decode_attention: num_heads % num_kv_heads != 0");
  if (B > 65535 || nh > 0x7fffffff) throw std::invalid_argument("paged_decode_attention (CUDA): too many sequences");
  const bool fp8 = cdt == kCacheFp8E4M3;
  if (!fp8 && cdt != dt)
    throw std::invalid_argument("paged_decode_attention (CUDA): the cache dtype must be q's or fp8 e4m3 (code 3)");
  if (fp8 && (!k_scale || !v_scale))
    throw std::invalid_argument("paged_decode_attention (CUDA): an fp8 cache needs k_scale and v_scale");
  const int64_t max_tokens = std::max<int64_t>(1, max_blocks * bs);
  if (max_tokens > 0x7fffffff) throw std::invalid_argument("paged_decode_attention (CUDA): context too long");
  const int group = group_for(nh, nkv, hd);
  const Plan p = plan(B * nh / group, max_tokens, part_tokens, device);
  if (p.splits > 1 && workspace_floats < B * nh * p.splits * (2 + hd))
    throw std::invalid_argument("paged_decode_attention (CUDA): workspace too small");
  use_device(device);
  auto st = reinterpret_cast<cudaStream_t>(stream);
  const int vpl = int((hd + 31) / 32);
  float* ws = reinterpret_cast<float*>(workspace);
  dim3 grid(static_cast<unsigned>(nh / group), static_cast<unsigned>(B), static_cast<unsigned>(p.splits));
  dim3 rgrid(static_cast<unsigned>(nh), static_cast<unsigned>(B));
  const int rthreads = int((hd + 31) / 32 * 32);
  if (fp8) {
    KESTREL_CUDA_DTYPE_SWITCH(dt, (launch_decode<T, fp8_t>(vpl, grid, rgrid, rthreads, st, device, p, out, os0, os1,
                                                           ws, q, qs0, qs1, k_cache, v_cache, block_tables, bts,
                                                           context_lens, nh, nkv, hd, bs, float(scale), k_scale,
                                                           v_scale)));
  } else {
    KESTREL_CUDA_DTYPE_SWITCH(dt, (launch_decode<T, T>(vpl, grid, rgrid, rthreads, st, device, p, out, os0, os1, ws,
                                                       q, qs0, qs1, k_cache, v_cache, block_tables, bts, context_lens,
                                                       nh, nkv, hd, bs, float(scale), 0, 0)));
  }
  check_launch("paged_decode_attention");
}

std::string runtime_info() {
  int rt = 0, drv = 0, n = 0;
  cudaRuntimeGetVersion(&rt);
  cudaError_t e = cudaDriverGetVersion(&drv);
  std::string s = "CUDA runtime " + std::to_string(rt / 1000) + "." + std::to_string(rt % 1000 / 10);
  if (e != cudaSuccess || drv == 0) return s + ", no CUDA driver";
  s += ", driver " + std::to_string(drv / 1000) + "." + std::to_string(drv % 1000 / 10);
  e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return s + ", " + cudaGetErrorString(e);
  return s + ", " + std::to_string(n) + " device(s)";
}

}  // namespace kestrel::cuda
