// Rotary embedding (in place), KV-cache write, both fused, and the step's token positions and cache slots on CUDA.
// The cache-write kernels take the cache's element type C: the model's T, or fp8 e4m3 (fp8_t, with a scale per
// cache read from device memory: fp8_cache.cuh).
#include <type_traits>

#include "common.cuh"
#include "fp8_cache.cuh"
#include "ops.h"

namespace kestrel::cuda {
namespace {

// One block per token; threads over (head, rotated pair).
template <class T>
__global__ void rotary_kernel(const int64_t* __restrict__ positions, T* __restrict__ q, int64_t qs,
                              T* __restrict__ k, int64_t ks, int nh, int nkv, int hd, int rot,
                              const float* __restrict__ cache, bool neox) {
  dependent_entry();
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

// A pack of T into the cache at dst: as it is (C = T), or as e4m3 divided by `scale` (C = fp8_t).
template <class T, class C>
__device__ __forceinline__ void store_pack(C* dst, const Pack<T>& p, float scale) {
  if constexpr (std::is_same_v<C, T>) {
    *reinterpret_cast<Pack<T>*>(dst) = p;
  } else {
    static_assert(std::is_same_v<C, fp8_t>, "a cache holds the model's dtype or fp8 e4m3");
    *reinterpret_cast<Fp8Pack<Pack<T>::N>*>(dst) = pack_to_fp8(p, scale);
  }
}

// The cache scale of C: 1 for the model's dtype (unused), *scale for fp8.
template <class C>
__device__ __forceinline__ float cache_scale(const float* __restrict__ scale) {
  if constexpr (std::is_same_v<C, fp8_t>) return *scale;
  return 1.f;
}

// One 16-byte pack of a head rotated in place at element e0 (NeoX: with its partner pack rot_dim/2 further;
// GPT-J: pairs inside the pack); with `dst`, the rotated packs are also stored there at the same offsets.
template <class T, class C = T>
__device__ __forceinline__ void rotate_pack(T* x, C* dst, int e0, int half, const float* c, const float* s,
                                            bool neox, float dst_scale = 1.f) {
  constexpr int V = Pack<T>::N;
  if (neox) {
    auto* p1 = reinterpret_cast<Pack<T>*>(x + e0);
    auto* p2 = reinterpret_cast<Pack<T>*>(x + e0 + half);
    const Pack<T> a = *p1, b = *p2;
    Pack<T> oa, ob;
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const float fa = ld(&a.v[v]), fb = ld(&b.v[v]), cv = c[e0 + v], sv = s[e0 + v];
      oa.v[v] = from_f<T>(fa * cv - fb * sv);
      ob.v[v] = from_f<T>(fb * cv + fa * sv);
    }
    *p1 = oa;
    *p2 = ob;
    if (dst) {
      store_pack(dst + e0, oa, dst_scale);
      store_pack(dst + e0 + half, ob, dst_scale);
    }
  } else {
    auto* p = reinterpret_cast<Pack<T>*>(x + e0);
    const Pack<T> a = *p;
    Pack<T> o;
#pragma unroll
    for (int u = 0; u < V / 2; ++u) {
      const int i = e0 / 2 + u;
      const float fa = ld(&a.v[2 * u]), fb = ld(&a.v[2 * u + 1]), cv = c[i], sv = s[i];
      o.v[2 * u] = from_f<T>(fa * cv - fb * sv);
      o.v[2 * u + 1] = from_f<T>(fb * cv + fa * sv);
    }
    *p = o;
    if (dst) store_pack(dst + e0, o, dst_scale);
  }
}

// 16-byte version: each thread rotates one pack of V elements of one head. NeoX pairs (i, i + rot/2): a pack from
// each half; GPT-J pairs (2i, 2i + 1): V/2 pairs inside one pack. Used when rot, the head size and the row strides
// are multiples of 2V and the bases 16-byte aligned (the scalar kernel moves 2 bytes per access: a third of the copy
// bandwidth on long prefill steps, measured on an H200).
template <class T>
__global__ void rotary_vec_kernel(const int64_t* __restrict__ positions, T* __restrict__ q, int64_t qs,
                                  T* __restrict__ k, int64_t ks, int nh, int nkv, int hd, int rot,
                                  const float* __restrict__ cache, bool neox) {
  dependent_entry();
  constexpr int V = Pack<T>::N;
  const int64_t t = blockIdx.x;
  const int half = rot / 2;
  const float* c = cache + positions[t] * rot;
  const float* s = c + half;
  const int per_head = neox ? half / V : rot / V;
  const int n = (nh + nkv) * per_head;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const int h = j / per_head, e0 = (j % per_head) * V;
    T* x = h < nh ? q + t * qs + int64_t(h) * hd : k + t * ks + int64_t(h - nh) * hd;
    rotate_pack(x, static_cast<T*>(nullptr), e0, half, c, s, neox);
  }
}

template <class T, class C>
__global__ void reshape_and_cache_kernel(const T* __restrict__ key, int64_t ks0, int64_t ks1,
                                         const T* __restrict__ value, int64_t vs0, int64_t vs1, C* __restrict__ kc,
                                         C* __restrict__ vc, const int64_t* __restrict__ slots, int nkv, int hd,
                                         const float* __restrict__ k_scale, const float* __restrict__ v_scale) {
  dependent_entry();
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  const int n = nkv * hd;
  const float ksc = cache_scale<C>(k_scale), vsc = cache_scale<C>(v_scale);
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    const int h = e / hd, d = e % hd;
    if constexpr (std::is_same_v<C, T>) {
      kc[slot * n + e] = key[t * ks0 + h * ks1 + d];
      vc[slot * n + e] = value[t * vs0 + h * vs1 + d];
    } else {
      kc[slot * n + e] = to_fp8(ld(key + t * ks0 + h * ks1 + d) / ksc);
      vc[slot * n + e] = to_fp8(ld(value + t * vs0 + h * vs1 + d) / vsc);
    }
  }
}

// 16-byte version: one pack of a key and of a value per thread (head size and strides multiples of the vector).
template <class T, class C>
__global__ void reshape_and_cache_vec_kernel(const T* __restrict__ key, int64_t ks0, int64_t ks1,
                                             const T* __restrict__ value, int64_t vs0, int64_t vs1,
                                             C* __restrict__ kc, C* __restrict__ vc,
                                             const int64_t* __restrict__ slots, int nkv, int hd,
                                             const float* __restrict__ k_scale, const float* __restrict__ v_scale) {
  dependent_entry();
  constexpr int V = Pack<T>::N;
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  if (slot < 0) return;
  const int per_head = hd / V;
  const int n = nkv * per_head;
  const float ksc = cache_scale<C>(k_scale), vsc = cache_scale<C>(v_scale);
  C* kd = kc + slot * nkv * hd;
  C* vd = vc + slot * nkv * hd;
  for (int e = threadIdx.x; e < n; e += blockDim.x) {
    const int h = e / per_head, d = (e % per_head) * V;
    store_pack(kd + int64_t(e) * V, *reinterpret_cast<const Pack<T>*>(key + t * ks0 + h * ks1 + d), ksc);
    store_pack(vd + int64_t(e) * V, *reinterpret_cast<const Pack<T>*>(value + t * vs0 + h * vs1 + d), vsc);
  }
}

// Rotary embedding of q and k (in place) and the cache write of k and v in one kernel (decode steps run one layer's
// rope and cache write as one launch instead of two). One block per token; the 16-byte packs of rotary_vec_kernel;
// each rotated pack of k also goes to the cache, then v (and k's dims past rot_dim) are copied there. A negative
// slot rotates and writes nothing to the cache.
template <class T, class C>
__global__ void rotary_and_cache_vec_kernel(const int64_t* __restrict__ positions, T* __restrict__ q, int64_t qs,
                                            T* __restrict__ k, int64_t ks, const T* __restrict__ v, int64_t vs,
                                            C* __restrict__ kc, C* __restrict__ vc,
                                            const int64_t* __restrict__ slots, int nh, int nkv, int hd, int rot,
                                            const float* __restrict__ cache, bool neox,
                                            const float* __restrict__ k_scale, const float* __restrict__ v_scale) {
  dependent_entry();
  constexpr int V = Pack<T>::N;
  const int64_t t = blockIdx.x;
  const int64_t slot = slots[t];
  const int half = rot / 2;
  const float* c = cache + positions[t] * rot;
  const float* s = c + half;
  const float ksc = cache_scale<C>(k_scale);
  C* kd = kc + slot * nkv * hd;  // used only when slot >= 0
  const int per_head = neox ? half / V : rot / V;
  const int n = (nh + nkv) * per_head;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const int h = j / per_head, e0 = (j % per_head) * V;
    const bool is_k = h >= nh;
    T* x = is_k ? k + t * ks + int64_t(h - nh) * hd : q + t * qs + int64_t(h) * hd;
    C* dst = is_k && slot >= 0 ? kd + int64_t(h - nh) * hd : nullptr;
    rotate_pack(x, dst, e0, half, c, s, neox, ksc);
  }
  if (slot < 0) return;
  const float vsc = cache_scale<C>(v_scale);
  const int per_v = hd / V, tail = (hd - rot) / V;  // v's packs; k's packs past rot_dim
  for (int j = threadIdx.x; j < nkv * (per_v + tail); j += blockDim.x) {
    if (j < nkv * per_v) {
      const int h = j / per_v, d = (j % per_v) * V;
      store_pack(vc + slot * nkv * hd + int64_t(h) * hd + d,
                 *reinterpret_cast<const Pack<T>*>(v + t * vs + int64_t(h) * hd + d), vsc);
    } else {
      const int i = j - nkv * per_v, h = i / tail, d = rot + (i % tail) * V;
      store_pack(kd + int64_t(h) * hd + d, *reinterpret_cast<const Pack<T>*>(k + t * ks + int64_t(h) * hd + d), ksc);
    }
  }
}

// Grid (sequences, chunks of the longest query): thread i of chunk c handles the sequence's query token
// c * blockDim + i and the ones a grid's width of chunks further.
__global__ void token_positions_and_slots_kernel(const int32_t* __restrict__ query_start,
                                                 const int32_t* __restrict__ context_lens,
                                                 const int32_t* __restrict__ block_tables, int64_t bt_stride, int bs,
                                                 int64_t* __restrict__ positions, int64_t* __restrict__ slots) {
  dependent_entry();
  const int64_t s = blockIdx.x;
  const int q0 = query_start[s], n = query_start[s + 1] - q0;
  const int first = context_lens[s] - n;
  const int32_t* row = block_tables + s * bt_stride;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < n; i += gridDim.y * blockDim.x) {
    const int p = first + i;
    positions[q0 + i] = p;
    slots[q0 + i] = int64_t(row[p / bs]) * bs + p % bs;
  }
}

}  // namespace

void token_positions_and_slots(uintptr_t query_start, uintptr_t context_lens, uintptr_t block_tables,
                               int64_t bt_stride, int64_t S, int64_t max_query_len, int64_t bs, uintptr_t positions,
                               uintptr_t slots, int device, uintptr_t stream) {
  if (S <= 0 || max_query_len <= 0) return;
  if (S > 0x7fffffff) throw std::invalid_argument("token_positions_and_slots: too many sequences for one launch");
  use_device(device);
  const int threads = max_query_len >= 256 ? 256 : int((max_query_len + 31) / 32 * 32);
  const unsigned chunks = unsigned(std::min<int64_t>((max_query_len + threads - 1) / threads, 64));
  launch("token_positions_and_slots", token_positions_and_slots_kernel, dim3(unsigned(S), chunks), dim3(threads),
         reinterpret_cast<cudaStream_t>(stream), device, reinterpret_cast<const int32_t*>(query_start),
         reinterpret_cast<const int32_t*>(context_lens), reinterpret_cast<const int32_t*>(block_tables), bt_stride,
         int(bs), reinterpret_cast<int64_t*>(positions), reinterpret_cast<int64_t*>(slots));
}

void rotary_embedding(int dt, uintptr_t positions, uintptr_t q, int64_t qs, uintptr_t k, int64_t ks, int64_t T_,
                      int64_t nh, int64_t nkv, int64_t hd, uintptr_t cache, int64_t rot, bool neox, int device,
                      uintptr_t stream) {
  if (T_ <= 0) return;
  if (T_ > 0x7fffffff) throw std::invalid_argument("rotary_embedding: too many tokens for one launch");
  use_device(device);
  auto st = reinterpret_cast<cudaStream_t>(stream);
  const int64_t v = dt == kFloat32 ? 4 : 8;
  if (rot % (2 * v) == 0 && vec_ok(dt, hd, {q, k}, {qs, ks})) {
    const int64_t packs = (nh + nkv) * (rot / v) / (neox ? 2 : 1);
    const int threads = packs >= 256 ? 256 : int((packs + 31) / 32 * 32);
    KESTREL_CUDA_DTYPE_SWITCH(dt, launch("rotary", rotary_vec_kernel<T>, dim3(unsigned(T_)), dim3(threads), st, device,
                                         reinterpret_cast<const int64_t*>(positions), reinterpret_cast<T*>(q), qs,
                                         reinterpret_cast<T*>(k), ks, int(nh), int(nkv), int(hd), int(rot),
                                         reinterpret_cast<const float*>(cache), neox));
    return;
  }
  const int64_t pairs = (nh + nkv) * (rot / 2);
  const int threads = pairs >= 256 ? 256 : int((pairs + 31) / 32 * 32);
  KESTREL_CUDA_DTYPE_SWITCH(dt, launch("rotary", rotary_kernel<T>, dim3(unsigned(T_)), dim3(threads), st, device,
                                       reinterpret_cast<const int64_t*>(positions), reinterpret_cast<T*>(q), qs,
                                       reinterpret_cast<T*>(k), ks, int(nh), int(nkv), int(hd), int(rot),
                                       reinterpret_cast<const float*>(cache), neox));
}

namespace {

// reshape_and_cache's launch for input T and cache element C.
template <class T, class C>
void launch_cache_write(cudaStream_t st, int device, bool vec, int64_t T_, uintptr_t key, int64_t ks0, int64_t ks1,
                        uintptr_t value, int64_t vs0, int64_t vs1, uintptr_t k_cache, uintptr_t v_cache,
                        uintptr_t slot_mapping, int64_t nkv, int64_t hd, uintptr_t k_scale, uintptr_t v_scale) {
  if (vec) {
    const int64_t packs = nkv * hd / Pack<T>::N;
    const int threads = packs >= 256 ? 256 : int((packs + 31) / 32 * 32);
    launch("reshape_and_cache", reshape_and_cache_vec_kernel<T, C>, dim3(unsigned(T_)), dim3(threads), st, device,
           reinterpret_cast<const T*>(key), ks0, ks1, reinterpret_cast<const T*>(value), vs0, vs1,
           reinterpret_cast<C*>(k_cache), reinterpret_cast<C*>(v_cache),
           reinterpret_cast<const int64_t*>(slot_mapping), int(nkv), int(hd), reinterpret_cast<const float*>(k_scale),
           reinterpret_cast<const float*>(v_scale));
    return;
  }
  const int64_t n = nkv * hd;
  const int threads = n >= 512 ? 512 : int((n + 31) / 32 * 32);
  launch("reshape_and_cache", reshape_and_cache_kernel<T, C>, dim3(unsigned(T_)), dim3(threads), st, device,
         reinterpret_cast<const T*>(key), ks0, ks1, reinterpret_cast<const T*>(value), vs0, vs1,
         reinterpret_cast<C*>(k_cache), reinterpret_cast<C*>(v_cache), reinterpret_cast<const int64_t*>(slot_mapping),
         int(nkv), int(hd), reinterpret_cast<const float*>(k_scale), reinterpret_cast<const float*>(v_scale));
}

// The cache element type of cache dtype code `cdt` for inputs of code `dt`: the same, or fp8 e4m3 with its scales.
void check_cache_dtype(const char* op, int dt, int cdt, uintptr_t k_scale, uintptr_t v_scale) {
  if (cdt == kCacheFp8E4M3) {
    if (!k_scale || !v_scale) throw std::invalid_argument(std::string(op) + ": an fp8 cache needs k_scale and v_scale");
  } else if (cdt != dt) {
    throw std::invalid_argument(std::string(op) + ": the cache dtype must be the inputs' or fp8 e4m3 (code 3)");
  }
}

template <class T, class C>
void launch_rotary_cache(int threads, uintptr_t stream, int device, int64_t T_, uintptr_t positions, uintptr_t q,
                         int64_t qs, uintptr_t k, int64_t ks, uintptr_t v, int64_t vs, uintptr_t k_cache,
                         uintptr_t v_cache, uintptr_t slot_mapping, int64_t nh, int64_t nkv, int64_t hd,
                         uintptr_t cache, int64_t rot, bool neox, uintptr_t k_scale, uintptr_t v_scale) {
  launch("rotary_and_cache", rotary_and_cache_vec_kernel<T, C>, dim3(unsigned(T_)), dim3(threads),
         reinterpret_cast<cudaStream_t>(stream), device, reinterpret_cast<const int64_t*>(positions),
         reinterpret_cast<T*>(q), qs, reinterpret_cast<T*>(k), ks, reinterpret_cast<const T*>(v), vs,
         reinterpret_cast<C*>(k_cache), reinterpret_cast<C*>(v_cache), reinterpret_cast<const int64_t*>(slot_mapping),
         int(nh), int(nkv), int(hd), int(rot), reinterpret_cast<const float*>(cache), neox,
         reinterpret_cast<const float*>(k_scale), reinterpret_cast<const float*>(v_scale));
}

}  // namespace

void reshape_and_cache(int dt, uintptr_t key, int64_t ks0, int64_t ks1, uintptr_t value, int64_t vs0, int64_t vs1,
                       uintptr_t k_cache, uintptr_t v_cache, uintptr_t slot_mapping, int64_t T_, int64_t nkv,
                       int64_t hd, int cdt, uintptr_t k_scale, uintptr_t v_scale, int device, uintptr_t stream) {
  if (T_ <= 0) return;
  if (T_ > 0x7fffffff) throw std::invalid_argument("reshape_and_cache: too many tokens for one launch");
  check_cache_dtype("reshape_and_cache", dt, cdt, k_scale, v_scale);
  use_device(device);
  auto st = reinterpret_cast<cudaStream_t>(stream);
  const bool vec = vec_ok(dt, hd, {key, value, k_cache, v_cache}, {ks0, ks1, vs0, vs1});
  if (cdt == kCacheFp8E4M3) {
    KESTREL_CUDA_DTYPE_SWITCH(dt, (launch_cache_write<T, fp8_t>(st, device, vec, T_, key, ks0, ks1, value, vs0, vs1,
                                                                k_cache, v_cache, slot_mapping, nkv, hd, k_scale,
                                                                v_scale)));
  } else {
    KESTREL_CUDA_DTYPE_SWITCH(dt, (launch_cache_write<T, T>(st, device, vec, T_, key, ks0, ks1, value, vs0, vs1,
                                                            k_cache, v_cache, slot_mapping, nkv, hd, 0, 0)));
  }
}

void rotary_and_cache(int dt, uintptr_t positions, uintptr_t q, int64_t qs, uintptr_t k, int64_t ks, uintptr_t v,
                      int64_t vs, uintptr_t k_cache, uintptr_t v_cache, uintptr_t slot_mapping, int64_t T_,
                      int64_t nh, int64_t nkv, int64_t hd, uintptr_t cache, int64_t rot, bool neox, int cdt,
                      uintptr_t k_scale, uintptr_t v_scale, int device, uintptr_t stream) {
  if (T_ <= 0) return;
  check_cache_dtype("rotary_and_cache", dt, cdt, k_scale, v_scale);
  const int64_t vec = dt == kFloat32 ? 4 : 8;
  if (T_ > 0x7fffffff || rot % (2 * vec) || !vec_ok(dt, hd, {q, k, v, k_cache, v_cache}, {qs, ks, vs})) {
    rotary_embedding(dt, positions, q, qs, k, ks, T_, nh, nkv, hd, cache, rot, neox, device, stream);
    reshape_and_cache(dt, k, ks, hd, v, vs, hd, k_cache, v_cache, slot_mapping, T_, nkv, hd, cdt, k_scale, v_scale,
                      device, stream);
    return;
  }
  use_device(device);
  const int64_t packs = (nh + nkv) * (rot / vec) / (neox ? 2 : 1);
  const int threads = packs >= 256 ? 256 : int((packs + 31) / 32 * 32);
  if (cdt == kCacheFp8E4M3) {
    KESTREL_CUDA_DTYPE_SWITCH(dt, (launch_rotary_cache<T, fp8_t>(threads, stream, device, T_, positions, q, qs, k, ks,
                                                                 v, vs, k_cache, v_cache, slot_mapping, nh, nkv, hd,
                                                                 cache, rot, neox, k_scale, v_scale)));
  } else {
    KESTREL_CUDA_DTYPE_SWITCH(dt, (launch_rotary_cache<T, T>(threads, stream, device, T_, positions, q, qs, k, ks, v,
                                                             vs, k_cache, v_cache, slot_mapping, nh, nkv, hd, cache,
                                                             rot, neox, 0, 0)));
  }
}

}  // namespace kestrel::cuda
