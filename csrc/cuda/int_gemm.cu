// Integer-weight linear layers on the tensor cores (W4A16 / W8A16): y[M, N] = x[M, K] @ W^T (+ bias) for 1..64
// rows of x (groups of whole quads: int_gemm_wide.cuh; groups of 16 / 32: 1..16 rows, the kernel below), W's
// 4- or 8-bit codes dequantized in registers straight into the operand of mma.m16n8k16, and the dequantization
// of a whole weight (the GEMM of a prefill). The weight's layout ("mma", packed by engine/weight_quant.py
// IntCodes.pack) is the MMA's A fragment order, so that one 16-byte load per lane gives it
// four fragments and no shared memory stands between the load and the product (Marlin's idea):
//
//   rows in tiles of 16 (nt), K in quads of 64 (kq), both padded with code 0; for each (nt, kq) 32 lanes x WPL
//   words (WPL = 4 for 4 bits, 8 for 8 bits: the high nibbles' word, then the low nibbles', per k-tile j). Lane
//   l = 4 g + t (g = l / 4, t = l % 4), k-tile j (0..3): the word's 8 nibbles hold W at rows g and g + 8 of the
//   tile and K positions kb + 0..3, kb = 64 kq + 16 t + 4 j; nibble s -> (row g + 8 (s & 1), kb + ((s >> 2) & 1) +
//   2 ((s >> 1) & 1)).
//
// The MMA contracts over its 16 fragment columns in any order as long as both operands agree: fragment column
// 2 t + e of k-tile j is K position 64 kq + 16 t + 4 j + e, column 8 + 2 t + e is ... + 2 + e, so a lane's
// operand B (x) for the four k-tiles of a quad is the 16 consecutive elements x[m, 64 kq + 16 t ...]: two 16-byte
// loads. Nibble pairs become the codes 128 + c (bf16) / 1024 + c (fp16) by one lop3 with the exponent bits;
// subtracting (bias + zero code) is exact. Groups of a multiple of 64 positions: the products of a group
// accumulate in fp32 and are scaled once per group (the scale never touches the weight in bf16); groups of 16 /
// 32 (a lane's 16 positions lie in one group): the weight is scaled in registers (one more rounding).
#include <atomic>
#include <type_traits>

#include "common.cuh"
#include "ops.h"

namespace kestrel::cuda {
namespace {

constexpr int kMaxWarps = 16;

template <class T>
struct Half2;
template <>
struct Half2<__nv_bfloat16> {
  using V = __nv_bfloat162;
  static constexpr uint32_t kMagic = 0x43004300u;  // bf16 128.0 in both halves: 128 + c for a nibble c
  static constexpr float kBias = 128.f;
  __device__ static V pair(float a) { return __float2bfloat162_rn(a); }
};
template <>
struct Half2<__half> {
  using V = __half2;
  static constexpr uint32_t kMagic = 0x64006400u;  // fp16 1024.0: 1024 + c
  static constexpr float kBias = 1024.f;
  __device__ static V pair(float a) { return __float2half2_rn(a); }
};

template <class V>
__device__ __forceinline__ V as(uint32_t u) {
  V v;
  memcpy(&v, &u, 4);
  return v;
}
template <class V>
__device__ __forceinline__ uint32_t bits(V v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}

// (a & b) | c
__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// The nibble pairs (s, s + 4) of w as the codes 128 + c / 1024 + c in both halves, s = 0..3.
template <class T>
__device__ __forceinline__ void nibble_pairs(uint32_t w, uint32_t r[4]) {
  r[0] = lop3_and_or(w, 0x000F000Fu, Half2<T>::kMagic);
  r[1] = lop3_and_or(w >> 4, 0x000F000Fu, Half2<T>::kMagic);
  r[2] = lop3_and_or(w >> 8, 0x000F000Fu, Half2<T>::kMagic);
  r[3] = lop3_and_or(w >> 12, 0x000F000Fu, Half2<T>::kMagic);
}

// The four A registers of one k-tile, (code - zero) [* scale]: registers 0 and 2 hold row g, 1 and 3 row g + 8.
// 4 bits: w[0]; 8 bits: w[0] the high nibbles, w[1] the low. zb[h]: bias + zero (4 bits) or the zero code (8
// bits) of row g + 8 h, in both halves; sc[h]: the scale (SCALED only: groups of 16 / 32).
template <class T, int BITS, bool SCALED>
__device__ __forceinline__ void dequant_tile(const uint32_t* w, const typename Half2<T>::V zb[2],
                                             const typename Half2<T>::V sc[2], uint32_t a[4]) {
  using V = typename Half2<T>::V;
  uint32_t r[4];
  nibble_pairs<T>(w[0], r);
  if constexpr (BITS == 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      V v = __hsub2(as<V>(r[i]), zb[i & 1]);
      if constexpr (SCALED) v = __hmul2(v, sc[i & 1]);
      a[i] = bits(v);
    }
  } else {
    uint32_t lo[4];
    nibble_pairs<T>(w[1], lo);
    const V bias = Half2<T>::pair(Half2<T>::kBias), sixteen = Half2<T>::pair(16.f);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const V hi = __hsub2(as<V>(r[i]), bias), l = __hsub2(as<V>(lo[i]), bias);
      V v = __hsub2(__hfma2(hi, sixteen, l), zb[i & 1]);  // 16 hi + lo - z: integers below 256, exact
      if constexpr (SCALED) v = __hmul2(v, sc[i & 1]);
      a[i] = bits(v);
    }
  }
}

template <class T>
__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Weights are read once: no L1 allocation.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float load_scale(const void* s, int64_t i, int sdt) {
  if (sdt == kFloat16) return __half2float(static_cast<const __half*>(s)[i]);
  if (sdt == kBFloat16) return __bfloat162float(static_cast<const __nv_bfloat16*>(s)[i]);
  return static_cast<const float*>(s)[i];
}

struct IntArgs {
  void* out;
  int64_t out_stride;
  const void* x;
  int64_t x_stride;
  const uint4* q;
  const void* scales;
  int sdt;  // scale dtype code
  int64_t s_stride;
  const uint8_t* zeros;
  int64_t z_stride;
  const void* bias;
  int M, N, K, group, kq_total, kq_per_warp;
};

// The scale and zero of group gi for a lane's two rows (row[0] = g, row[1] = g + 8 of its tile).
__device__ __forceinline__ void load_group(const IntArgs& p, const int row[2], int gi, float s[2], float z[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    z[h] = float(p.zeros[int64_t(row[h]) * p.z_stride + gi]);
    s[h] = load_scale(p.scales, int64_t(row[h]) * p.s_stride + gi, p.sdt);
  }
}

// The zeros as dequant_tile subtracts them: bias + zero (4 bits) or the zero code (8 bits), in both halves.
template <class T, int BITS>
__device__ __forceinline__ void zero_pairs(const float z[2], typename Half2<T>::V zb[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) zb[h] = Half2<T>::pair(BITS == 4 ? Half2<T>::kBias + z[h] : z[h]);
}

// Groups of whole quads, scaled after the products (the x-sharing kernel): a group's products accumulate unscaled in
// `part` and go into `acc` times the group's scale (per row half) when the walk over K enters the next group, and
// at its end (flush). The next group's scale and zero are loaded a group ahead.
template <class T, int BITS, int MT>
struct QuadGroups {
  using V = typename Half2<T>::V;
  float acc[MT][4] = {};
  float part[MT][4] = {};
  float sc[2] = {0.f, 0.f}, nsc[2] = {0.f, 0.f}, nzf[2] = {0.f, 0.f};
  V zb[2];
  int cur = 0, last = 0;

  __device__ __forceinline__ void begin(const IntArgs& p, const int row[2], int kbeg, int kend) {
    last = (p.K - 1) / p.group;
    cur = (kbeg * 64) / p.group;
    if (kbeg < kend) {
      float zf[2];
      load_group(p, row, cur, sc, zf);
      if (cur < last) load_group(p, row, cur + 1, nsc, nzf);
      zero_pairs<T, BITS>(zf, zb);
    }
  }
  // Before quad kq's products: its group is at most one past the current one (groups span whole quads).
  __device__ __forceinline__ void enter(const IntArgs& p, const int row[2], int kq) {
    const int gi = (kq * 64) / p.group;
    if (gi == cur) return;
    flush();
#pragma unroll
    for (int h = 0; h < 2; ++h) sc[h] = nsc[h];
    zero_pairs<T, BITS>(nzf, zb);
    cur = gi;
    if (gi < last) load_group(p, row, gi + 1, nsc, nzf);
  }
  __device__ __forceinline__ void flush() {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][i] += sc[i >> 1] * part[mt][i], part[mt][i] = 0.f;
  }
};

// One quad's products (both kernels): the lane's weight words w of the quad's four k-tiles, dequantized (zb; sc
// too where SCALED), times x's B fragments xv (the lane's 16 positions of each 8-row group of x), added into c.
template <class T, int BITS, int MT, bool SCALED>
__device__ __forceinline__ void quad_products(const uint4* w, const typename Half2<T>::V zb[2],
                                              const typename Half2<T>::V sc[2], const uint4 xv[MT][2],
                                              float c[MT][4]) {
  constexpr int WV = BITS / 4;
  const uint32_t* wq = reinterpret_cast<const uint32_t*>(w);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t a[4];
    const uint32_t wj[2] = {wq[j * WV], WV == 2 ? wq[j * WV + 1] : 0u};
    dequant_tile<T, BITS, SCALED>(wj, zb, sc, a);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const uint32_t* xw = reinterpret_cast<const uint32_t*>(xv[mt]);
      mma<T>(c[mt], a, xw[2 * j], xw[2 * j + 1]);
    }
  }
}

// Groups of 16 / 32 positions (a lane's 16 positions of a quad lie in one group: the weight is scaled in
// registers, one more rounding): one block per tile of 16 output rows; its warps split the quads of K; fp32 partial
// sums meet in shared memory. MT: 8-row groups of x (1: M <= 8, 2: M <= 16). U: quads per loop step (the weight
// loads of the next step are in flight while this one computes). Groups of whole quads take the x-sharing kernel
// (int_gemm_wide.cuh), which replaced this one for them at every M (its sweep there).
template <class T, int BITS, int MT, int U>
__global__ void __launch_bounds__(kMaxWarps * 32) int_mma_kernel(IntArgs p) {
  using V = typename Half2<T>::V;
  constexpr int WV = BITS / 4;  // 16-byte words per lane per quad
  __shared__ float red[kMaxWarps][MT * 4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int nt = blockIdx.x;
  const int row[2] = {min(nt * 16 + g, p.N - 1), min(nt * 16 + g + 8, p.N - 1)};  // for scales / zeros
  const int kbeg = warp * p.kq_per_warp, kend = min(p.kq_total, kbeg + p.kq_per_warp);
  const uint4* q = p.q + (int64_t(nt) * p.kq_total * 32 + lane) * WV;
  const T* x = static_cast<const T*>(p.x);

  allow_dependent_launch();
  uint4 wbuf[U][WV];
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int v = 0; v < WV; ++v)
      wbuf[u][v] = kbeg + u < kend ? load_stream(q + int64_t(kbeg + u) * 32 * WV + v) : make_uint4(0, 0, 0, 0);
  wait_for_producer();  // x is the previous kernel's output

  float acc[MT][4] = {};
  for (int kq0 = kbeg; kq0 < kend; kq0 += U) {
    uint4 nbuf[U][WV];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int v = 0; v < WV; ++v)
        nbuf[u][v] = kq0 + U + u < kend ? load_stream(q + int64_t(kq0 + U + u) * 32 * WV + v)
                                        : make_uint4(0, 0, 0, 0);
    float lsc[U][2], lzf[U][2];  // each quad's group scale and zero, per lane
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (kq0 + u < kend) load_group(p, row, min((kq0 + u) * 64 + t * 16, p.K - 1) / p.group, lsc[u], lzf[u]);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kq = kq0 + u;
      if (kq >= kend) break;
      const int xk = kq * 64 + t * 16;  // (a lane past K: its x is 0, any group will do)
      V zb[2], wsc[2];
      zero_pairs<T, BITS>(lzf[u], zb);
#pragma unroll
      for (int h = 0; h < 2; ++h) wsc[h] = Half2<T>::pair(lsc[u][h]);
      uint4 xv[MT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int m = g + 8 * mt;
        if (m < p.M && xk < p.K) {
          const uint4* xp = reinterpret_cast<const uint4*>(x + int64_t(m) * p.x_stride + xk);
          xv[mt][0] = __ldg(xp);
          xv[mt][1] = __ldg(xp + 1);
        } else {
          xv[mt][0] = xv[mt][1] = make_uint4(0, 0, 0, 0);
        }
      }
      quad_products<T, BITS, MT, true>(wbuf[u], zb, wsc, xv, acc);
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int v = 0; v < WV; ++v) wbuf[u][v] = nbuf[u][v];
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][mt * 4 + i][lane] = acc[mt][i];
  __syncthreads();
  // Thread (v, l) of the first MT * 4 * 32 threads sums value v of lane l over the warps and writes it.
  for (int idx = threadIdx.x; idx < MT * 4 * 32; idx += blockDim.x) {
    const int v = idx >> 5, l = idx & 31;
    float s = 0.f;
    for (int w = 0; w < nwarps; ++w) s += red[w][v][l];
    const int mt = v >> 2, i = v & 3;
    const int n = nt * 16 + (l >> 2) + 8 * (i >> 1), m = 8 * mt + 2 * (l & 3) + (i & 1);
    if (n < p.N && m < p.M) {
      if (p.bias) s += ld(static_cast<const T*>(p.bias) + n);
      static_cast<T*>(p.out)[int64_t(m) * p.out_stride + n] = from_f<T>(s);
    }
  }
}

// One thread per (tile, quad, lane, k-tile) word of the weight: 8 values, 4 consecutive positions in each of two
// rows, written as (code - zero) * scale rounded to T.
template <class T, int BITS>
__global__ void int_mma_dequantize_kernel(IntArgs p) {
  dependent_entry();
  constexpr int WPL = BITS == 4 ? 4 : 8;
  const int64_t words = int64_t((p.N + 15) / 16) * p.kq_total * 32 * 4;  // (word groups of one k-tile)
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= words) return;
  const int j = int(i & 3), lane = int((i >> 2) & 31);
  const int64_t tq = i >> 7;  // nt * kq_total + kq
  const int kq = int(tq % p.kq_total), nt = int(tq / p.kq_total);
  const int g = lane >> 2, t = lane & 3;
  const int kb = kq * 64 + t * 16 + j * 4;
  if (kb >= p.K) return;
  const uint32_t* wq = reinterpret_cast<const uint32_t*>(p.q) + (tq * 32 + lane) * WPL + j * (WPL / 4);
  const uint32_t hi = wq[0], lo = BITS == 8 ? wq[1] : 0u;
  T* out = static_cast<T*>(p.out);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int n = nt * 16 + g + 8 * h;
    if (n >= p.N) continue;
    const int gi = kb / p.group;
    const float z = float(p.zeros[int64_t(n) * p.z_stride + gi]);
    const float s = load_scale(p.scales, int64_t(n) * p.s_stride + gi, p.sdt);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int slot = h + 4 * (e & 1) + 2 * (e >> 1);
      const int c = BITS == 4 ? int((hi >> (4 * slot)) & 15u)
                              : int(((hi >> (4 * slot)) & 15u) * 16u + ((lo >> (4 * slot)) & 15u));
      if (kb + e < p.K) out[int64_t(n) * p.out_stride + kb + e] = from_f<T>((float(c) - z) * s);
    }
  }
}

// Warps per block fixed by set_int_mma_warps (KernelConfig.int_mma_warps, engine.ops.configure at engine start);
// 0: enough blocks x warps to put ~16 warps on every SM. At most one per U quads of K.
std::atomic<int> g_warps{0};

int warps_for(int ntiles, int kq_total, int u, int device) {
  const int fixed = g_warps.load(std::memory_order_relaxed);
  if (fixed >= 1 && fixed <= kMaxWarps) return std::min(fixed, std::max(1, kq_total));
  const int want = (sm_count(device) * 16 + ntiles - 1) / ntiles;
  int w = 1;
  while (w < want && w < kMaxWarps) w *= 2;
  return std::max(1, std::min(w, (kq_total + u - 1) / u));
}

template <class T, int BITS, int MT, int U>
void launch_lane_groups(IntArgs a, int device, cudaStream_t st) {
  const int ntiles = (a.N + 15) / 16;
  const int w = warps_for(ntiles, a.kq_total, U, device);
  a.kq_per_warp = (a.kq_total + w - 1) / w;
  launch("int_mma_linear", int_mma_kernel<T, BITS, MT, U>, dim3(ntiles), dim3(w * 32), st, device, a);
}

}  // namespace

#include "int_gemm_wide.cuh"

void set_int_mma_warps(int warps) {
  if (warps < 0 || warps > kMaxWarps) throw std::invalid_argument("int_mma warps: expected 0..16");
  g_warps.store(warps, std::memory_order_relaxed);
}

void int_mma_linear(int dtype, uintptr_t out, int64_t out_stride, uintptr_t x, int64_t x_stride, uintptr_t q,
                    uintptr_t scales, int scale_dtype, int64_t s_stride, uintptr_t zeros, int64_t z_stride,
                    uintptr_t bias, int64_t M, int64_t N, int64_t K, int64_t bits, int64_t group, int device,
                    uintptr_t stream, int64_t tiles_per_block, int64_t k_groups) {
  // A group of whole quads (or one group for all of K) is scaled after the products; 16 / 32: in the weight.
  const bool lane_groups = group % 64 != 0 && group < K;
  if (M < 1 || M > (lane_groups ? 16 : 64))
    throw std::invalid_argument(lane_groups ? "int_mma_linear: M must be 1..16 for groups of 16 / 32"
                                            : "int_mma_linear: M must be 1..64");
  if (bits != 4 && bits != 8) throw std::invalid_argument("int_mma_linear: bits must be 4 or 8");
  if (K % 16 || group % 16 || group <= 0) throw std::invalid_argument("int_mma_linear: K and group: multiples of 16");
  if (x % 16 || x_stride % 8) throw std::invalid_argument("int_mma_linear: x must be 16-byte aligned rows");
  if (N < 1) return;
  use_device(device);
  IntArgs a{reinterpret_cast<void*>(out), out_stride, reinterpret_cast<const void*>(x), x_stride,
            reinterpret_cast<const uint4*>(q), reinterpret_cast<const void*>(scales), scale_dtype, s_stride,
            reinterpret_cast<const uint8_t*>(zeros), z_stride, reinterpret_cast<const void*>(bias), int(M), int(N),
            int(K), int(group), int((K + 63) / 64), 0};
  auto st = reinterpret_cast<cudaStream_t>(stream);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    if (!lane_groups) {  // groups of whole quads: the x-sharing kernel (int_gemm_wide.cuh) at every M
      if (bits == 4) wide::linear<T, 4>(a, int(tiles_per_block), int(k_groups), device, st);
      else wide::linear<T, 8>(a, int(tiles_per_block), int(k_groups), device, st);
    } else if (bits == 4) {
      if (M <= 8) launch_lane_groups<T, 4, 1, 4>(a, device, st);
      else launch_lane_groups<T, 4, 2, 2>(a, device, st);
    } else {
      if (M <= 8) launch_lane_groups<T, 8, 1, 2>(a, device, st);
      else launch_lane_groups<T, 8, 2, 2>(a, device, st);
    }
  };
  if (dtype == kBFloat16) run(__nv_bfloat16{});
  else if (dtype == kFloat16) run(__half{});
  else throw std::invalid_argument("int_mma_linear: x must be bfloat16 or float16");
}

void int_mma_dequantize(int dtype, uintptr_t out, int64_t out_stride, uintptr_t q, uintptr_t scales,
                        int scale_dtype, int64_t s_stride, uintptr_t zeros, int64_t z_stride, int64_t N, int64_t K,
                        int64_t bits, int64_t group, int device, uintptr_t stream) {
  if (bits != 4 && bits != 8) throw std::invalid_argument("int_mma_dequantize: bits must be 4 or 8");
  if (group <= 0) throw std::invalid_argument("int_mma_dequantize: group must be positive");
  if (N < 1 || K < 1) return;
  use_device(device);
  IntArgs a{reinterpret_cast<void*>(out), out_stride, nullptr, 0, reinterpret_cast<const uint4*>(q),
            reinterpret_cast<const void*>(scales), scale_dtype, s_stride, reinterpret_cast<const uint8_t*>(zeros),
            z_stride, nullptr, 0, int(N), int(K), int(group), int((K + 63) / 64), 0};
  const int64_t words = (N + 15) / 16 * a.kq_total * 128;
  const dim3 grid(unsigned((words + 255) / 256)), block(256);
  auto st = reinterpret_cast<cudaStream_t>(stream);
  KESTREL_CUDA_DTYPE_SWITCH(dtype, {
    if (bits == 4) launch("int_mma_dequantize", int_mma_dequantize_kernel<T, 4>, grid, block, st, device, a);
    else launch("int_mma_dequantize", int_mma_dequantize_kernel<T, 8>, grid, block, st, device, a);
  });
}

}  // namespace kestrel::cuda
