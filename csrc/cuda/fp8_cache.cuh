// fp8 (e4m3) KV caches (--kv-cache-dtype fp8): the cache-write kernels store fp32(x) / scale saturated to +-448 and
// rounded to nearest even; the decode kernel reads value x scale. One float32 scale per cache (a layer's keys, its
// values), read from device memory by the kernels, so that a CUDA graph replays with whatever it holds.
#pragma once

#include <cuda_fp8.h>

#include "common.cuh"

namespace kestrel::cuda {

// The cache dtype code of an fp8 e4m3 cache, kCacheFp8E4M3, is in ../dtype_codes.h (included by common.cuh).
using kestrel::kCacheFp8E4M3;

using fp8_t = __nv_fp8_storage_t;  // one e4m3 byte

__device__ __forceinline__ fp8_t to_fp8(float x) { return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3); }

__device__ __forceinline__ float fp8_to_f(fp8_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3)));
}

// Two e4m3 values (the low byte first) as floats: one conversion instruction on sm_89+.
__device__ __forceinline__ float2 fp8x2_to_f2(__nv_fp8x2_storage_t b) {
  return __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(b, __NV_E4M3)));
}

// N e4m3 values: the fp8 counterpart of a Pack<T> of N elements (8 bytes for bf16 / fp16, 4 for fp32).
template <int N>
struct alignas(N) Fp8Pack {
  fp8_t v[N];
};

// A pack of T stored as e4m3: element / scale, saturated.
template <class T>
__device__ __forceinline__ Fp8Pack<Pack<T>::N> pack_to_fp8(const Pack<T>& p, float scale) {
  Fp8Pack<Pack<T>::N> o;
#pragma unroll
  for (int e = 0; e < Pack<T>::N; ++e) o.v[e] = to_fp8(ld(&p.v[e]) / scale);
  return o;
}

// N e4m3 values as floats (N even).
template <int N>
__device__ __forceinline__ void fp8_pack_to_f(const Fp8Pack<N>& p, float (&out)[N]) {
#pragma unroll
  for (int e = 0; e < N; e += 2) {
    const float2 f = fp8x2_to_f2(__nv_fp8x2_storage_t(p.v[e]) | (__nv_fp8x2_storage_t(p.v[e + 1]) << 8));
    out[e] = f.x;
    out[e + 1] = f.y;
  }
}

}  // namespace kestrel::cuda
