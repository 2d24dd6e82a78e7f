// Paged decode attention on CUDA (flash-decoding style).
//
// Grid (num_heads / G, B, splits): each block takes the G query heads that share a KV head (G = 1: one query
// head) of one sequence over one partition of its context; 4 warps walk the partition, each warp scoring 4 tokens
// per step against all G heads (lanes split head_dim, each key and value loaded once, four independent loads and
// reductions in flight), with an online softmax in fp32 per warp and head. Warps merge
// through shared memory. With one split the block writes the output; with several, each writes its
// partial (max, sum, acc[hd]) to a workspace and a second kernel merges the partitions.
// The number of splits depends only on host-known sizes (B, heads, block table capacity, and the partition
// size when the caller fixes it), so the launch can be captured in a CUDA graph; partitions past a sequence's
// context exit at once without writing, and the merge reads only the partitions its context covers.
#include <type_traits>

#include "common.cuh"
#include "ops.h"

namespace kestrel::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kTokensPerWarpStep = 4;
constexpr int kMaxHeadDim = 256;
constexpr int kMinPartition = 64;  // tokens

// G query heads per block: the query heads that share one KV head (GQA) read each key and value once for all of
// them (G = num_heads / num_kv_heads when it is 2, 4 or 8 and the registers allow; grid.x = KV heads). G = 1: one
// query head per block (grid.x = query heads), any ratio.
template <class T, int VPL, int G>  // VPL: head_dim values per lane (head_dim <= 32 * VPL)
__global__ void __launch_bounds__(kWarps * 32)
    paged_decode_kernel(T* __restrict__ out, int64_t os0, int64_t os1, float* __restrict__ ws,
                        const T* __restrict__ q, int64_t qs0, int64_t qs1, const T* __restrict__ kc,
                        const T* __restrict__ vc, const int32_t* __restrict__ block_tables, int64_t bts,
                        const int32_t* __restrict__ ctx_lens, int nh, int nkv, int hd, int bs, float scale,
                        int part_tokens) {
  constexpr int U = kTokensPerWarpStep;
  const int b = blockIdx.y, part = blockIdx.z, splits = gridDim.z;
  const int h0 = G == 1 ? int(blockIdx.x) : int(blockIdx.x) * G;  // the first query head of the block
  const int kvh = G == 1 ? h0 / (nh / nkv) : int(blockIdx.x);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int ctx = ctx_lens[b];
  const int t_begin = part * part_tokens;
  const int t_end = min(ctx, t_begin + part_tokens);
  if (splits > 1 && t_begin >= ctx) return;  // past the context: the merge does not read this partition
  const int32_t* bt = block_tables + b * bts;
  const int64_t tok_stride = int64_t(nkv) * hd;

  float qr[G][VPL], acc[G][VPL], m[G], l[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int v = 0; v < VPL; ++v) {
      const int d = lane + 32 * v;
      qr[g][v] = d < hd ? ld(q + b * qs0 + (h0 + g) * qs1 + d) * scale : 0.f;
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
        kf[u][v] = d < hd ? ld(kc + base[u] + d) : 0.f;
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
        vf[u][v] = d < hd ? ld(vc + base[u] + d) : 0.f;
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
    if (splits == 1) {
      const float inv = L > 0.f ? 1.f / L : 0.f;
      for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) o += sm_acc[w][g][d] * f[w];
        out[b * os0 + h * os1 + d] = from_f<T>(o * inv);
      }
    } else {
      float* wp = ws + ((int64_t(b) * nh + h) * splits + part) * (2 + hd);
      if (threadIdx.x == 0) {
        wp[0] = M;
        wp[1] = L;
      }
      for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) o += sm_acc[w][g][d] * f[w];
        wp[2 + d] = o;
      }
    }
  }
}

// Merge the partitions of one (head, sequence) that its context covers: one thread per output element.
template <class T>
__global__ void paged_decode_reduce_kernel(T* __restrict__ out, int64_t os0, int64_t os1,
                                           const float* __restrict__ ws, const int32_t* __restrict__ ctx_lens,
                                           int nh, int hd, int splits, int part_tokens) {
  const int h = blockIdx.x, b = blockIdx.y;
  const float* wp = ws + (int64_t(b) * nh + h) * splits * (2 + hd);
  const int parts = min(splits, (ctx_lens[b] + part_tokens - 1) / part_tokens);
  float M = -INFINITY;
  for (int p = 0; p < parts; ++p)
    if (wp[p * (2 + hd) + 1] > 0.f) M = fmaxf(M, wp[p * (2 + hd)]);
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float L = 0.f, o = 0.f;
    for (int p = 0; p < parts; ++p) {
      const float* w = wp + p * (2 + hd);
      if (w[1] > 0.f) {
        const float f = expf(w[0] - M);
        L += w[1] * f;
        o += w[2 + d] * f;
      }
    }
    out[b * os0 + h * os1 + d] = from_f<T>(L > 0.f ? o / L : 0.f);
  }
}

int sm_count(int device) {
  static int cached[64] = {0};
  if (device < 0 || device >= 64) return 132;
  if (cached[device] == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) n = 100;
    cached[device] = n;
  }
  return cached[device];
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
// size (rounded up to a warp step, at most 4096 of them) over the whole capacity. `base`: blocks per partition.
Plan plan(int64_t base, int64_t max_tokens, int64_t part_tokens, int device) {
  const int64_t step = kWarps * kTokensPerWarpStep;
  if (part_tokens > 0) {
    int64_t part = std::max<int64_t>({(part_tokens + step - 1) / step * step, (max_tokens + 4095) / 4096, step});
    part = (part + step - 1) / step * step;
    return Plan{int((max_tokens + part - 1) / part), int(part)};
  }
  const int64_t target = 2 * int64_t(sm_count(device));
  int64_t splits = base >= target ? 1 : (target + base - 1) / base;
  const int64_t max_splits = (max_tokens + kMinPartition - 1) / kMinPartition;
  splits = std::max<int64_t>(1, std::min<int64_t>({splits, max_splits, 1024}));
  int64_t part = (max_tokens + splits - 1) / splits;
  part = (part + step - 1) / step * step;
  if (part <= 0) part = step;
  splits = (max_tokens + part - 1) / part;
  if (splits < 1) splits = 1;
  return Plan{int(splits), int(part)};
}

template <class T>
void launch(int vpl, dim3 grid, dim3 rgrid, int rthreads, cudaStream_t st, const Plan& p, uintptr_t out,
            int64_t os0, int64_t os1, float* ws, uintptr_t q, int64_t qs0, int64_t qs1, uintptr_t k_cache,
            uintptr_t v_cache, uintptr_t block_tables, int64_t bts, uintptr_t context_lens, int64_t nh, int64_t nkv,
            int64_t hd, int64_t bs, float scale) {
  T* o = reinterpret_cast<T*>(out);
  const T* qp = reinterpret_cast<const T*>(q);
  const T* kp = reinterpret_cast<const T*>(k_cache);
  const T* vp = reinterpret_cast<const T*>(v_cache);
  const int32_t* btp = reinterpret_cast<const int32_t*>(block_tables);
  const int32_t* clp = reinterpret_cast<const int32_t*>(context_lens);
  auto run = [&](auto kernel) {
    kernel<<<grid, kWarps * 32, 0, st>>>(o, os0, os1, ws, qp, qs0, qs1, kp, vp, btp, bts, clp, int(nh), int(nkv),
                                         int(hd), int(bs), scale, p.part_tokens);
  };
  const int G = group_for(nh, nkv, hd);
  auto pick = [&](auto vpl_c) {
    constexpr int V = decltype(vpl_c)::value;
    if constexpr (8 * V <= 32)
      if (G == 8) return run(paged_decode_kernel<T, V, 8>);
    if constexpr (4 * V <= 32)
      if (G == 4) return run(paged_decode_kernel<T, V, 4>);
    if (G == 2) return run(paged_decode_kernel<T, V, 2>);
    run(paged_decode_kernel<T, V, 1>);
  };
  if (vpl <= 2) pick(std::integral_constant<int, 2>{});
  else if (vpl <= 4) pick(std::integral_constant<int, 4>{});
  else pick(std::integral_constant<int, 8>{});
  if (p.splits > 1)
    paged_decode_reduce_kernel<T><<<rgrid, rthreads, 0, st>>>(o, os0, os1, ws, clp, int(nh), int(hd), p.splits,
                                                               p.part_tokens);
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
                            int64_t part_tokens, int device, uintptr_t stream) {
  if (B <= 0 || nh <= 0) return;
  if (hd > kMaxHeadDim) throw std::invalid_argument("paged_decode_attention (CUDA): head_size must be <= 256");
  if (nkv <= 0 || nh % nkv) throw std::invalid_argument("paged_decode_attention: num_heads % num_kv_heads != 0");
  if (B > 65535 || nh > 0x7fffffff) throw std::invalid_argument("paged_decode_attention (CUDA): too many sequences");
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
  KESTREL_CUDA_DTYPE_SWITCH(dt, launch<T>(vpl, grid, rgrid, rthreads, st, p, out, os0, os1, ws, q, qs0, qs1, k_cache,
                                          v_cache, block_tables, bts, context_lens, nh, nkv, hd, bs, float(scale)));
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
