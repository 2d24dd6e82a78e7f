// CUDA kernels of the communication strategies: the zero-copy mapped-host-memory all-reduce for small
// messages and the fused int8 quantise / dequantise(+accumulate, +requantise) kernels. See cuda_comm.h.
//
// Arithmetic matches the CPU kernels and the torch references bit for bit (explicit __fmul_rn /
// __fadd_rn: no FMA contraction; round-half-even conversions), so every rank computes the same values
// whichever device summed a part.

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda/common.cuh"
#include "cuda_comm.h"

namespace kestrel::comm::cuda {

using kestrel::cuda::check_launch;
using kestrel::cuda::from_f;
using kestrel::cuda::ld;
using kestrel::cuda::use_device;

namespace {

constexpr int kGroup = 128;

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Volatile (cache-bypassing) loads of host memory written by another GPU.
__device__ __forceinline__ float ld_peer(const float* p) { return *reinterpret_cast<const volatile float*>(p); }
__device__ __forceinline__ float ld_peer(const __nv_bfloat16* p) {
  uint16_t b = *reinterpret_cast<const volatile uint16_t*>(p);
  return __uint_as_float(uint32_t(b) << 16);
}
__device__ __forceinline__ float ld_peer(const __half* p) {
  uint16_t b = *reinterpret_cast<const volatile uint16_t*>(p);
  return __half2float(__ushort_as_half(b));
}

template <class T>
__global__ void mapped_all_reduce_kernel(T* __restrict__ x, int64_t n, char* bufs, int64_t slot_bytes,
                                         uint32_t* flags, int max_blocks, int rank, int world, uint32_t seq,
                                         const uint32_t* abort, uint32_t* err, uint64_t timeout_ns) {
  const int64_t per = (n + gridDim.x - 1) / gridDim.x;
  const int64_t lo = per * blockIdx.x, hi = min(n, lo + per);
  const int64_t parity = seq & 1u;
  T* mine = reinterpret_cast<T*>(bufs + (parity * world + rank) * slot_bytes);
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) mine[i] = x[i];
  __threadfence_system();  // our part reaches host memory before the flag does
  __syncthreads();
  if (threadIdx.x == 0)
    *reinterpret_cast<volatile uint32_t*>(flags + rank * max_blocks + blockIdx.x) = seq;
  if (threadIdx.x < world && threadIdx.x != rank) {
    const volatile uint32_t* f = flags + threadIdx.x * max_blocks + blockIdx.x;
    const uint64_t t0 = global_ns();
    while (int32_t(*f - seq) < 0) {
      if (*reinterpret_cast<const volatile uint32_t*>(abort) != 0) {
        atomicExch(err, 1u);
        break;
      }
      if (global_ns() - t0 > timeout_ns) {
        atomicExch(err, 2u);
        break;
      }
    }
  }
  __syncthreads();
  __threadfence_system();
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < world; ++j) {
      const float v = j == rank ? ld(x + i)
                                : ld_peer(reinterpret_cast<const T*>(bufs + (parity * world + j) * slot_bytes) + i);
      acc = j == 0 ? v : __fadd_rn(acc, v);
    }
    x[i] = from_f<T>(acc);
  }
}

constexpr int kVecMaxWorld = 8;

// Vectorised version (16-byte loads and stores; x 16-byte aligned; world <= kVecMaxWorld): thread = one 16-byte vector, so a
// decode-sized message is read from the peers' host memory in one round trip per thread, all loads in
// flight together (the scalar kernel above issues its PCIe reads one after another). The last block also
// takes the n % (16 / sizeof(T)) tail elements.
template <class T>
__global__ void mapped_all_reduce_vec_kernel(T* __restrict__ x, int64_t n, char* bufs, int64_t slot_bytes,
                                             uint32_t* flags, int max_blocks, int rank, int world, uint32_t seq,
                                             const uint32_t* abort, uint32_t* err, uint64_t timeout_ns) {
  constexpr int VE = 16 / sizeof(T);
  const int64_t nvec = n / VE;
  const int64_t per = (nvec + gridDim.x - 1) / gridDim.x;
  const int64_t lo = per * blockIdx.x, hi = min(nvec, lo + per);
  const bool last = blockIdx.x == gridDim.x - 1;
  const int64_t parity = seq & 1u;
  char* mine_b = bufs + (parity * world + rank) * slot_bytes;
  uint4* mine = reinterpret_cast<uint4*>(mine_b);
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) mine[i] = xv[i];
  if (last)
    for (int64_t i = nvec * VE + threadIdx.x; i < n; i += blockDim.x) reinterpret_cast<T*>(mine_b)[i] = x[i];
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0)
    *reinterpret_cast<volatile uint32_t*>(flags + rank * max_blocks + blockIdx.x) = seq;
  if (threadIdx.x < world && threadIdx.x != rank) {
    const volatile uint32_t* f = flags + threadIdx.x * max_blocks + blockIdx.x;
    const uint64_t t0 = global_ns();
    while (int32_t(*f - seq) < 0) {
      if (*reinterpret_cast<const volatile uint32_t*>(abort) != 0) {
        atomicExch(err, 1u);
        break;
      }
      if (global_ns() - t0 > timeout_ns) {
        atomicExch(err, 2u);
        break;
      }
    }
  }
  __syncthreads();
  __threadfence_system();
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    uint4 v[kVecMaxWorld];  // all loads issued before the first use: one PCIe round trip
#pragma unroll
    for (int j = 0; j < kVecMaxWorld; ++j)
      if (j < world)
        v[j] = j == rank ? xv[i]
                         : __ldcv(reinterpret_cast<const uint4*>(bufs + (parity * world + j) * slot_bytes) + i);
    float acc[VE];
#pragma unroll
    for (int j = 0; j < kVecMaxWorld; ++j) {
      if (j >= world) break;
      const T* e = reinterpret_cast<const T*>(&v[j]);
#pragma unroll
      for (int k = 0; k < VE; ++k) acc[k] = j == 0 ? ld(e + k) : __fadd_rn(acc[k], ld(e + k));
    }
    uint4 o;
    T* oe = reinterpret_cast<T*>(&o);
#pragma unroll
    for (int k = 0; k < VE; ++k) oe[k] = from_f<T>(acc[k]);
    reinterpret_cast<uint4*>(x)[i] = o;
  }
  if (last)
    for (int64_t i = nvec * VE + threadIdx.x; i < n; i += blockDim.x) {
      float acc = 0.f;
      for (int j = 0; j < world; ++j) {
        const float v = j == rank ? ld(x + i)
                                  : ld_peer(reinterpret_cast<const T*>(bufs + (parity * world + j) * slot_bytes) + i);
        acc = j == 0 ? v : __fadd_rn(acc, v);
      }
      x[i] = from_f<T>(acc);
    }
}

__device__ __forceinline__ int8_t to_i8(float v) {
  int r = __float2int_rn(v);  // round half to even
  return int8_t(max(-128, min(127, r)));
}

// Unnormalised Walsh-Hadamard transform of one group held by a warp (lane l has elements 4l..4l+3), stages
// h = 1, 2 (in the thread), 4 .. 64 (lanes l ^ h/4): pairs (i, i + h) -> (a + b, a - b), the order of the
// CPU kernels and the torch reference (bit-identical; __fadd_rn / __fsub_rn: no contraction).
__device__ __forceinline__ void fwht_warp(float (&v)[4], int lane) {
  float t0 = __fadd_rn(v[0], v[1]), t1 = __fsub_rn(v[0], v[1]);
  float t2 = __fadd_rn(v[2], v[3]), t3 = __fsub_rn(v[2], v[3]);
  v[0] = __fadd_rn(t0, t2);
  v[2] = __fsub_rn(t0, t2);
  v[1] = __fadd_rn(t1, t3);
  v[3] = __fsub_rn(t1, t3);
#pragma unroll
  for (int m = 1; m < 32; m <<= 1) {
    const bool high = lane & m;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float other = __shfl_xor_sync(0xffffffffu, v[k], m);
      v[k] = high ? __fsub_rn(other, v[k]) : __fadd_rn(v[k], other);
    }
  }
}

// One warp per group of 128 elements, 4 per lane; acc holds this lane's 4 values (rotated).
__device__ __forceinline__ void quantize_group(const float (&acc)[4], int8_t* q, float* s, int lane) {
  float m = fmaxf(fmaxf(fabsf(acc[0]), fabsf(acc[1])), fmaxf(fabsf(acc[2]), fabsf(acc[3])));
  m = kestrel::cuda::warp_max(m);
  const float inv = m > 0.f ? __fdiv_rn(127.f, m) : 0.f;
  char4 out;
  out.x = to_i8(__fmul_rn(acc[0], inv));
  out.y = to_i8(__fmul_rn(acc[1], inv));
  out.z = to_i8(__fmul_rn(acc[2], inv));
  out.w = to_i8(__fmul_rn(acc[3], inv));
  *reinterpret_cast<char4*>(q + lane * 4) = out;
  if (lane == 0) *s = __fdiv_rn(m, 127.f);
}

__device__ __forceinline__ int64_t packet_bytes(int64_t c) { return c + c / kGroup * 4; }

template <class T>
__global__ void quantize_packets_kernel(const T* __restrict__ x, int64_t c, int world, char* out) {
  const int64_t g = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t gpp = c / kGroup;
  if (g >= gpp * world) return;
  const int64_t j = g / gpp, lg = g % gpp;
  const T* xg = x + g * kGroup + lane * 4;
  float acc[4] = {ld(xg), ld(xg + 1), ld(xg + 2), ld(xg + 3)};
  fwht_warp(acc, lane);
  char* pkt = out + j * packet_bytes(c);
  quantize_group(acc, reinterpret_cast<int8_t*>(pkt) + lg * kGroup, reinterpret_cast<float*>(pkt + c) + lg, lane);
}

__global__ void reduce_packets_kernel(const char* __restrict__ in, int64_t c, int world, char* out) {
  const int64_t g = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (g >= c / kGroup) return;
  float acc[4];
  for (int r = 0; r < world; ++r) {
    const char* pkt = in + r * packet_bytes(c);
    const char4 q = *reinterpret_cast<const char4*>(pkt + g * kGroup + lane * 4);
    const float s = reinterpret_cast<const float*>(pkt + c)[g];
    const float v[4] = {__fmul_rn(float(q.x), s), __fmul_rn(float(q.y), s), __fmul_rn(float(q.z), s),
                        __fmul_rn(float(q.w), s)};
    for (int k = 0; k < 4; ++k) acc[k] = r == 0 ? v[k] : __fadd_rn(acc[k], v[k]);
  }
  quantize_group(acc, reinterpret_cast<int8_t*>(out) + g * kGroup, reinterpret_cast<float*>(out + c) + g, lane);
}

template <class T>
__global__ void dequantize_packets_kernel(const char* __restrict__ in, int64_t c, int world, T* __restrict__ x) {
  const int64_t g = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t gpp = c / kGroup;
  if (g >= gpp * world) return;
  const int64_t j = g / gpp, lg = g % gpp;
  const char* pkt = in + j * packet_bytes(c);
  const char4 q = *reinterpret_cast<const char4*>(pkt + lg * kGroup + lane * 4);
  const float s = reinterpret_cast<const float*>(pkt + c)[lg];
  float v[4] = {__fmul_rn(float(q.x), s), __fmul_rn(float(q.y), s), __fmul_rn(float(q.z), s),
                __fmul_rn(float(q.w), s)};
  fwht_warp(v, lane);  // rotate back: H H = 128 I
  T* xo = x + g * kGroup + lane * 4;
#pragma unroll
  for (int k = 0; k < 4; ++k) xo[k] = from_f<T>(__fmul_rn(v[k], 1.0f / kGroup));
}

inline unsigned warp_blocks(int64_t groups) { return unsigned((groups * 32 + 255) / 256); }

void check_c(int64_t c, int world) {
  if (c <= 0 || c % kGroup) throw std::invalid_argument("int8 packets: c must be a positive multiple of 128");
  if (world < 1 || world > 64) throw std::invalid_argument("int8 packets: bad world size");
}

}  // namespace

uintptr_t host_register(uintptr_t ptr, int64_t bytes, int device) {
  use_device(device);
  void* p = reinterpret_cast<void*>(ptr);
  check(cudaHostRegister(p, size_t(bytes), cudaHostRegisterMapped | cudaHostRegisterPortable), "cudaHostRegister");
  void* dptr = nullptr;
  check(cudaHostGetDevicePointer(&dptr, p, 0), "cudaHostGetDevicePointer");
  return reinterpret_cast<uintptr_t>(dptr);
}

void host_unregister(uintptr_t ptr) { check(cudaHostUnregister(reinterpret_cast<void*>(ptr)), "cudaHostUnregister"); }

void mapped_all_reduce(int dtype, uintptr_t x, int64_t n, uintptr_t bufs, int64_t slot_bytes, uintptr_t flags,
                       int max_blocks, int rank, int world, uint32_t seq, uintptr_t abort, uintptr_t err,
                       double timeout_s, int blocks, int device, uintptr_t stream) {
  if (n <= 0) return;
  const int esz = dtype == kestrel::kFloat32 ? 4 : 2;
  if (n * esz > slot_bytes) throw std::invalid_argument("mapped_all_reduce: message larger than the slot");
  if (blocks < 1 || blocks > max_blocks) throw std::invalid_argument("mapped_all_reduce: bad block count");
  if (world > 64 || rank < 0 || rank >= world) throw std::invalid_argument("mapped_all_reduce: bad rank/world");
  use_device(device);
  auto s = reinterpret_cast<cudaStream_t>(stream);
  const uint64_t tmo = uint64_t(timeout_s * 1e9);
  if (x % 16 == 0 && world <= kVecMaxWorld) {
    KESTREL_CUDA_DTYPE_SWITCH(dtype, mapped_all_reduce_vec_kernel<T><<<blocks, 256, 0, s>>>(
        reinterpret_cast<T*>(x), n, reinterpret_cast<char*>(bufs), slot_bytes, reinterpret_cast<uint32_t*>(flags),
        max_blocks, rank, world, seq, reinterpret_cast<const uint32_t*>(abort), reinterpret_cast<uint32_t*>(err),
        tmo));
  } else {
    KESTREL_CUDA_DTYPE_SWITCH(dtype, mapped_all_reduce_kernel<T><<<blocks, 256, 0, s>>>(
        reinterpret_cast<T*>(x), n, reinterpret_cast<char*>(bufs), slot_bytes, reinterpret_cast<uint32_t*>(flags),
        max_blocks, rank, world, seq, reinterpret_cast<const uint32_t*>(abort), reinterpret_cast<uint32_t*>(err),
        tmo));
  }
  check_launch("mapped_all_reduce");
}

void int8_quantize_packets(int dtype, uintptr_t x, int64_t c, int world, uintptr_t out, int device,
                           uintptr_t stream) {
  check_c(c, world);
  use_device(device);
  auto s = reinterpret_cast<cudaStream_t>(stream);
  const unsigned nb = warp_blocks(c / kGroup * world);
  KESTREL_CUDA_DTYPE_SWITCH(dtype, quantize_packets_kernel<T><<<nb, 256, 0, s>>>(
      reinterpret_cast<const T*>(x), c, world, reinterpret_cast<char*>(out)));
  check_launch("int8_quantize_packets");
}

void int8_reduce_packets(uintptr_t in, int64_t c, int world, uintptr_t out, int device, uintptr_t stream) {
  check_c(c, world);
  use_device(device);
  reduce_packets_kernel<<<warp_blocks(c / kGroup), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const char*>(in), c, world, reinterpret_cast<char*>(out));
  check_launch("int8_reduce_packets");
}

void int8_dequantize_packets(int dtype, uintptr_t in, int64_t c, int world, uintptr_t x, int device,
                             uintptr_t stream) {
  check_c(c, world);
  use_device(device);
  auto s = reinterpret_cast<cudaStream_t>(stream);
  const unsigned nb = warp_blocks(c / kGroup * world);
  KESTREL_CUDA_DTYPE_SWITCH(dtype, dequantize_packets_kernel<T><<<nb, 256, 0, s>>>(
      reinterpret_cast<const char*>(in), c, world, reinterpret_cast<T*>(x)));
  check_launch("int8_dequantize_packets");
}

}  // namespace kestrel::comm::cuda
