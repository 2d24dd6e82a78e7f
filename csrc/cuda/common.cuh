// Helpers shared by the CUDA kernels: fp32 load/store of float / bf16 / fp16, reductions, launch checks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "../dtype_codes.h"

namespace kestrel::cuda {

// Programmatic dependent launch (PDL, sm_90+). A kernel launched as a programmatic dependent of the one before it
// on the stream (launch() below; the one-row Triton GEMV of the decode CUDA graphs: engine/ops/skinny_gemm.py,
// launch_pdl) may be launched as soon as every block of that one has called allow_dependent_launch(): its blocks
// are resident and waiting when the producer finishes, instead of being launched after. It must wait
// (wait_for_producer: the producer's completion and its memory) before it touches any memory the producer reads or
// writes; the GEMV requests its weights before waiting, every kernel of this directory waits at entry.
// Both are no-ops without PDL, and before sm_90.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_producer() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// The entry of every kernel that launch() starts: the next kernel may launch, this one waits for the last.
__device__ __forceinline__ void dependent_entry() {
  allow_dependent_launch();
  wait_for_producer();
}

// Whether launch() makes its kernels programmatic dependents on `device`: compute capability 9.0+ (read once per
// device). PDL was faster at every batch measured (docs/benchmarks/gpu_decode_2026-12-06.md: batch-1 TPOT 4.46 ms
// with every kernel PDL against 4.55 ms plain launches); the plain-launch switch (KESTREL_PDL) was deleted (issue 46).
inline bool pdl_launches(int device) {
  static int major[64] = {0};
  if (device < 0 || device >= 64) return false;
  if (major[device] == 0) {
    int m = 0;
    if (cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess || m <= 0) m = -1;
    major[device] = m;
  }
  return major[device] >= 9;
}

// kernel<<<grid, block, 0, st>>>(args...), as a programmatic dependent of the stream's last kernel where
// pdl_launches(device); the kernel starts with dependent_entry().
template <class... Params, class... Args>
void launch(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t st, int device,
            Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  if (pdl_launches(device)) {
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": CUDA error: " + cudaGetErrorString(e));
}

__device__ __forceinline__ float ld(const float* p) { return *p; }
__device__ __forceinline__ float ld(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float ld(const __half* p) { return __half2float(*p); }

template <class T>
__device__ __forceinline__ T from_f(float f);
template <>
__device__ __forceinline__ float from_f<float>(float f) {
  return f;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float f) {
  return __float2bfloat16_rn(f);
}
template <>
__device__ __forceinline__ __half from_f<__half>(float f) {
  return __float2half_rn(f);
}

// Round to storage type T and back.
template <class T>
__device__ __forceinline__ float round_to(float f);
template <>
__device__ __forceinline__ float round_to<float>(float f) {
  return f;
}
template <>
__device__ __forceinline__ float round_to<__nv_bfloat16>(float f) {
  return __bfloat162float(__float2bfloat16_rn(f));
}
template <>
__device__ __forceinline__ float round_to<__half>(float f) {
  return __half2float(__float2half_rn(f));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// A reduction over the block (blockDim.x a multiple of 32, <= 1024) by Op's warp reduction, Op::identity() for the
// missing warps; every thread gets the result.
template <class Op>
__device__ __forceinline__ float block_reduce(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
  v = Op::warp(v);
  if (lane == 0) partial[wid] = v;
  __syncthreads();
  if (wid == 0) {
    float r = lane < int(blockDim.x >> 5) ? partial[lane] : Op::identity();
    r = Op::warp(r);
    if (lane == 0) total = r;
  }
  __syncthreads();
  return total;
}
struct SumOp {
  __device__ static float warp(float v) { return warp_sum(v); }
  __device__ static float identity() { return 0.f; }
};
struct MaxOp {
  __device__ static float warp(float v) { return warp_max(v); }
  __device__ static float identity() { return -INFINITY; }
};
__device__ __forceinline__ float block_sum(float v) { return block_reduce<SumOp>(v); }
__device__ __forceinline__ float block_max(float v) { return block_reduce<MaxOp>(v); }

// 16 bytes of T (8 bf16 / fp16, 4 fp32): one vector load or store.
template <class T>
struct alignas(16) Pack {
  static constexpr int N = 16 / sizeof(T);
  T v[N];
};

// Whether the 16-byte kernels apply: aligned base pointers, row strides and width multiples of the vector.
inline bool vec_ok(int dt, int64_t width, std::initializer_list<uintptr_t> ptrs,
                   std::initializer_list<int64_t> strides) {
  const int64_t v = dt == kFloat32 ? 4 : 8;
  if (width % v) return false;
  for (uintptr_t p : ptrs)
    if (p % 16) return false;
  for (int64_t s : strides)
    if (s % v) return false;
  return true;
}

inline void check_launch(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": CUDA error: " + cudaGetErrorString(e));
}

// The SM count of `device`, read once (100 when the query fails, 132 for an index past the cache).
inline int sm_count(int device) {
  static int cached[64] = {0};
  if (device < 0 || device >= 64) return 132;
  if (cached[device] == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) n = 100;
    cached[device] = n;
  }
  return cached[device];
}

// Make `device` current for this runtime (our static cudart keeps its own notion of the device).
inline void use_device(int device) {
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess || cur != device) {
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) throw std::runtime_error(std::string("cudaSetDevice: ") + cudaGetErrorString(e));
  }
}

#define KESTREL_CUDA_DTYPE_SWITCH(dt, ...)                           \
  switch (dt) {                                                      \
    case kestrel::kFloat32: { using T = float; __VA_ARGS__; break; }  \
    case kestrel::kBFloat16: { using T = __nv_bfloat16; __VA_ARGS__; break; } \
    case kestrel::kFloat16: { using T = __half; __VA_ARGS__; break; } \
    default: throw std::invalid_argument("dtype code must be 0, 1 or 2"); \
  }

}  // namespace kestrel::cuda
