// The integer tensor-core linear for 1..64 rows of x with x shared by the output tiles of a block (included by
// int_gemm.cu, whose fragment helpers it uses; groups of whole quads only: a multiple of 64 positions, or one
// group for all of K).
//
// int_gemm.cu's per-tile kernel reads x from L2 once per 16 output rows: at 16 rows of x that is 4x the bytes of the
// int4 weight it streams, at 64 rows 16x, so past 16 rows it was L2-bound and sliced launches re-read the weight
// (batch-64 decode 0.41x / 0.49x bf16, docs/benchmarks/gpu_quant_2026-12-07.md). Here a block covers NB tiles x KW
// k-groups (warp w: tile blockIdx.x * NB + w % NB, k-group w / NB); each k-group's NB warps walk the same quads of K,
// and per step of U quads they stage x[0 : 8 MT, 64 U positions] in shared memory together (each thread a few
// 16-byte pieces, loaded into registers a step ahead with the weights), meet at a named barrier, and take their
// B fragments from there: x leaves L2 once per NB tiles. The k-groups' sums meet in shared memory in a fixed order
// (deterministic: a CUDA graph replay equals the eager call bit for bit).
//
// Measured on an H100 (2026-12-07, dev run of this kernel against the per-tile one, Llama-3-8B shapes, weights
// past L2): gate_up int4 at 64 rows 201.9 -> 88.7 us (bf16 cuBLAS 87.5), LM head 1,013.5 -> 356.0 us (385.1);
// at 1 row qkv 12.5 -> 10.6 us, gate_up 36.8 -> 32.9 us; numerics those of the per-tile kernel (per-group fp32
// scaling after the products).
//
// Included by int_gemm.cu inside namespace kestrel::cuda, after its fragment helpers.
#pragma once

namespace wide {

__device__ __forceinline__ void group_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

template <int NB, int MT>
constexpr int max_k_groups() {  // 512 threads a block; 256 where 64 rows need ~180 registers a thread
  return NB == 8 ? 2 : NB == 4 ? 4 : (MT == 8 ? 4 : 8);
}

template <class T, int BITS, int MT, int U, int NB>
__global__ void __launch_bounds__(NB * max_k_groups<NB, MT>() * 32) kernel(IntArgs p) {
  using V = typename Half2<T>::V;
  constexpr int WV = BITS / 4;
  constexpr int KWMAX = max_k_groups<NB, MT>();
  constexpr int XROW = 8 * U + 1;                // 16-byte words per staged row: 64 U positions, one of padding
  constexpr int ROWS = 8 * MT;                   // staged rows of x
  constexpr int PIECES = ROWS * 8 * U;           // 16-byte words of a k-group's chunk
  constexpr int GT = NB * 32;                    // threads of a k-group
  constexpr int PER = (PIECES + GT - 1) / GT;    // words each thread stages
  constexpr int XWORDS = KWMAX * ROWS * XROW, RWORDS = NB * MT * 4 * 32 / 4;
  __shared__ uint4 smem[XWORDS > RWORDS ? XWORDS : RWORDS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = warp % NB, kg = warp / NB, kw = (blockDim.x >> 5) / NB;
  const int gt = sub * 32 + lane;
  const int g = lane >> 2, t = lane & 3;
  const int ntiles = (p.N + 15) / 16;
  const int nt = min(int(blockIdx.x) * NB + sub, ntiles - 1);  // a warp past the last tile repeats it, writes nothing
  const int row[2] = {min(nt * 16 + g, p.N - 1), min(nt * 16 + g + 8, p.N - 1)};
  const int kbeg = kg * p.kq_per_warp, kend = min(p.kq_total, kbeg + p.kq_per_warp);
  const uint4* q = p.q + (int64_t(nt) * p.kq_total * 32 + lane) * WV;
  const T* x = static_cast<const T*>(p.x);
  uint4* xs = smem + kg * ROWS * XROW;

  auto load_x = [&](int kq0, uint4 xr[PER]) {
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int piece = gt + i * GT;
      const int r = piece / (8 * U), c = piece % (8 * U);
      const int k = kq0 * 64 + c * 8;
      xr[i] = (piece < PIECES && r < p.M && k < p.K && kq0 + c / 8 < kend)
                  ? __ldg(reinterpret_cast<const uint4*>(x + int64_t(r) * p.x_stride + k))
                  : make_uint4(0, 0, 0, 0);
    }
  };
  auto store_x = [&](const uint4 xr[PER]) {
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int piece = gt + i * GT;
      if (piece < PIECES) xs[(piece / (8 * U)) * XROW + piece % (8 * U)] = xr[i];
    }
  };

  allow_dependent_launch();
  uint4 wbuf[U][WV];
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int v = 0; v < WV; ++v)
      wbuf[u][v] = kbeg + u < kend ? load_stream(q + int64_t(kbeg + u) * 32 * WV + v) : make_uint4(0, 0, 0, 0);
  wait_for_producer();  // x is the previous kernel's output
  uint4 xr[PER];
  load_x(kbeg, xr);
  store_x(xr);

  QuadGroups<T, BITS, MT> acc;
  acc.begin(p, row, kbeg, kend);
  const V unused[2] = {Half2<T>::pair(1.f), Half2<T>::pair(1.f)};
  group_barrier(1 + kg, GT);

  for (int kq0 = kbeg; kq0 < kend; kq0 += U) {
    uint4 nbuf[U][WV];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int v = 0; v < WV; ++v)
        nbuf[u][v] = kq0 + U + u < kend ? load_stream(q + int64_t(kq0 + U + u) * 32 * WV + v)
                                        : make_uint4(0, 0, 0, 0);
    const bool more = kq0 + U < kend;  // the same for every warp of the k-group
    if (more) load_x(kq0 + U, xr);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int kq = kq0 + u;
      if (kq >= kend) break;
      acc.enter(p, row, kq);
      uint4 xv[MT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const uint4* xp = xs + (g + 8 * mt) * XROW + 8 * u + 2 * t;
        xv[mt][0] = xp[0];
        xv[mt][1] = xp[1];
      }
      quad_products<T, BITS, MT, false>(wbuf[u], acc.zb, unused, xv, acc.part);
    }
    if (more) {
      group_barrier(1 + kg, GT);  // every warp of the k-group is done with this chunk
      store_x(xr);
      group_barrier(1 + kg, GT);  // the next chunk is in place
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int v = 0; v < WV; ++v) wbuf[u][v] = nbuf[u][v];
  }
  acc.flush();

  // The k-groups' sums, added in k-group order in shared memory (x's chunks are dead by then).
  float* red = reinterpret_cast<float*>(smem);  // [NB][MT * 4][32]
  __syncthreads();
  for (int s = 0; s < kw; ++s) {
    if (kg == s) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float& r = red[(sub * MT * 4 + mt * 4 + i) * 32 + lane];
          r = s == 0 ? acc.acc[mt][i] : r + acc.acc[mt][i];
        }
    }
    __syncthreads();
  }
  for (int idx = threadIdx.x; idx < NB * MT * 4 * 32; idx += blockDim.x) {
    const int s = idx / (MT * 128), v = (idx >> 5) % (MT * 4), l = idx & 31;
    const int tile = int(blockIdx.x) * NB + s;
    const int mt = v >> 2, i = v & 3;
    const int n = tile * 16 + (l >> 2) + 8 * (i >> 1), m = 8 * mt + 2 * (l & 3) + (i & 1);
    if (tile < ntiles && n < p.N && m < p.M) {
      float y = red[idx];
      if (p.bias) y += ld(static_cast<const T*>(p.bias) + n);
      static_cast<T*>(p.out)[int64_t(m) * p.out_stride + n] = from_f<T>(y);
    }
  }
}

// Tiles per block and k-groups, measured on an H100 (132 SMs; the dev run above swept NB 2 / 4 / 8 x KW 1 / 2 / 4,
// the engine-build sweep of 2026-12-07 NB x KW up to 8 at 1-16 rows): shapes of many tiles (gate_up 1,792, the LM
// head 8,016: over 4 per SM) take 8 tiles and one k-group from 9 rows (2 x 2 below: more blocks for 1-8 rows); qkv
// (384 tiles) 4 k-groups of 4 tiles; the shapes of few tiles (o and down, 256) 8 k-groups of 2 tiles, which put 16
// warps on each SM instead of 8 (int4 at 1 row: o 10.2 -> 7.3 us, down 30.2 -> 17.0 us; int8: 14.7 -> 9.7,
// 44.9 -> 24.4; at 16 rows o 9.7 -> 8.0, down 23.8 -> 21.4, where the per-tile kernel had taken them).
inline void choose(int ntiles, int M, int sms, int& nb, int& kw) {
  if (ntiles > 4 * sms) {
    nb = M > 8 ? 8 : 2;
    kw = M > 8 ? 1 : 2;
  } else if (2 * ntiles >= 5 * sms) {
    nb = 4;
    kw = 4;
  } else {
    nb = 2;
    kw = 8;
  }
}


template <class T, int BITS, int MT, int U, int NB>
void launch_nb(IntArgs a, int kw, int device, cudaStream_t st) {
  kw = std::max(1, std::min({kw, max_k_groups<NB, MT>(), a.kq_total}));
  a.kq_per_warp = (a.kq_total + kw - 1) / kw;  // quads per k-group
  const int blocks = ((a.N + 15) / 16 + NB - 1) / NB;
  cuda::launch("int_mma_linear", kernel<T, BITS, MT, U, NB>, dim3(blocks), dim3(NB * kw * 32), st, device, a);
}

template <class T, int BITS, int MT, int U>
void launch_rows(IntArgs a, int nb, int kw, int device, cudaStream_t st) {
  if (nb == 8) launch_nb<T, BITS, MT, U, 8>(a, kw, device, st);
  else if (nb == 4) launch_nb<T, BITS, MT, U, 4>(a, kw, device, st);
  else launch_nb<T, BITS, MT, U, 2>(a, kw, device, st);
}

// nb / kw: 0 = choose() (the engine); else forced (tests, kestrel bench quant's sweep).
template <class T, int BITS>
void linear(IntArgs a, int nb, int kw, int device, cudaStream_t st) {
  if (nb <= 0 || kw <= 0) {
    int cnb = 0, ckw = 0;
    choose((a.N + 15) / 16, a.M, sm_count(device), cnb, ckw);
    if (nb <= 0) nb = cnb;
    if (kw <= 0) kw = ckw;
  }
  if (a.M <= 8) launch_rows<T, BITS, 1, BITS == 4 ? 4 : 2>(a, nb, kw, device, st);
  else if (a.M <= 16) launch_rows<T, BITS, 2, 2>(a, nb, kw, device, st);
  else if (a.M <= 32) launch_rows<T, BITS, 4, 1>(a, nb, kw, device, st);
  else launch_rows<T, BITS, 8, 1>(a, nb, kw, device, st);
}

}  // namespace wide
