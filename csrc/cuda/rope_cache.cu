// Rotary embedding (in place) and KV-cache write on CUDA.
#include "common.cuh"
#include "ops.h"

namespace kestrel::cuda {
namespace {

// One block per token; threads over (head, rotated pair).
template <class T>
__global__ void rotary_kernel(const int64_t* __restrict__ positions, T* __restrict__ q, int64_t qs,
                              T* __restrict__ k, int64_t ks, int nh, int nkv, int hd, int rot,
                              const float* __restrict__ cache, bool neox) {
  const int64_t t = blockIdx.x;
  const int half = rot / 2;
  const float* c = cache + positions[t] * rot;
  const float* s = c + half;
  const int pairs = (nh + nkv) * half;
  for (int j = threadIdx.x; j < pairs; j += blockDim.x) {
    const int h = j / half, i = j % half;
    T* x = h < nh ? q + t * qs + int64_t(h) * hd : k + t * ks + int64_t(h - nh) * hd;
    const int i1 = neox ? i : 2 * i;
    const int i2 = neox ? i + half : 2 * i + 1;
    const float a = ld(x + i1), b = ld(x + i2);
    const float cv = c[i], sv = s[i];
    x[i1] = from_f<T>(a * cv - b * sv);
    x[i2] = from_f<T>(b * cv + a * sv);
  }
}

template <class T>
__global__ void reshape_and_cache_kernel(const T* __restrict__ key, int64_t ks0, int64_t ks1,
                                         const T* __restrict__ value, int64_t vs0, int64_t vs1, T* __restrict__ kc,
                                         T* __restrict__ vc, const int64_t* __restrict__ slots, int nkv, int hd) {
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  const int n = nkv * hd;
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    const int h = e / hd, d = e % hd;
    kc[slot * n + e] = key[t * ks0 + h * ks1 + d];
    vc[slot * n + e] = value[t * vs0 + h * vs1 + d];
  }
}

}  // namespace

void rotary_embedding(int dt, uintptr_t positions, uintptr_t q, int64_t qs, uintptr_t k, int64_t ks, int64_t T_,
                      int64_t nh, int64_t nkv, int64_t hd, uintptr_t cache, int64_t rot, bool neox, int device,
                      uintptr_t stream) {
  if (T_ <= 0) return;
  if (T_ > 0x7fffffff) throw std::invalid_argument("rotary_embedding: too many tokens for one launch");
  use_device(device);
  auto st = reinterpret_cast<cudaStream_t>(stream);
  const int64_t pairs = (nh + nkv) * (rot / 2);
  const int threads = pairs >= 256 ? 256 : int((pairs + 31) / 32 * 32);
  KESTREL_CUDA_DTYPE_SWITCH(dt, rotary_kernel<T><<<unsigned(T_), threads, 0, st>>>(
                                    reinterpret_cast<const int64_t*>(positions), reinterpret_cast<T*>(q), qs,
                                    reinterpret_cast<T*>(k), ks, int(nh), int(nkv), int(hd), int(rot),
                                    reinterpret_cast<const float*>(cache), neox));
  check_launch("rotary_embedding");
}

void reshape_and_cache(int dt, uintptr_t key, int64_t ks0, int64_t ks1, uintptr_t value, int64_t vs0, int64_t vs1,
                       uintptr_t k_cache, uintptr_t v_cache, uintptr_t slot_mapping, int64_t T_, int64_t nkv,
                       int64_t hd, int device, uintptr_t stream) {
  if (T_ <= 0) return;
  if (T_ > 0x7fffffff) throw std::invalid_argument("reshape_and_cache: too many tokens for one launch");
  use_device(device);
  auto st = reinterpret_cast<cudaStream_t>(stream);
  const int64_t n = nkv * hd;
  const int threads = n >= 512 ? 512 : int((n + 31) / 32 * 32);
  KESTREL_CUDA_DTYPE_SWITCH(dt, reshape_and_cache_kernel<T><<<unsigned(T_), threads, 0, st>>>(
                                    reinterpret_cast<const T*>(key), ks0, ks1, reinterpret_cast<const T*>(value),
                                    vs0, vs1, reinterpret_cast<T*>(k_cache), reinterpret_cast<T*>(v_cache),
                                    reinterpret_cast<const int64_t*>(slot_mapping), int(nkv), int(hd)));
  check_launch("reshape_and_cache");
}

}  // namespace kestrel::cuda
