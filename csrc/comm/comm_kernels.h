// Interface between the host all-reduce (hostar.cpp: synchronisation, chunking, threads) and the per-ISA
// reduction / int8 kernels (kernels_{scalar,avx2,avx512}.cpp, serial, each compiled with its own -m flags).
//
// dtype codes as everywhere in engine._C: 0 float32, 1 bfloat16, 2 float16. Arithmetic is fp32.
// Every kernel is bitwise reproducible by the torch references in engine/parallel/comm/reference.py:
// fp32 sums in source order (no FMA contraction), round-to-nearest-even conversions.
#pragma once

#include <cstdint>

namespace kestrel::comm {

// Int8 all-reduce group: absmax scale per kGroup consecutive elements of the flattened message.
constexpr int64_t kGroup = 128;

struct Kernels {
  const char* name;
  // out[i] = T(sum_k f32(src[k][i])) for i < n, k = 0..nsrc-1 in order; out may alias one of the srcs.
  void (*reduce)(int dtype, void* out, const void* const* src, int nsrc, int64_t n);
  // Whole groups only (n % kGroup == 0). Each group is rotated first: v = H x (unnormalised Walsh-Hadamard
  // transform of the 128 values, which spreads an outlier channel over the group), then
  // s[g] = absmax(v)/127, q = round_half_even(v * (127/absmax(v))).
  void (*quantize)(int dtype, const void* x, int64_t n, int8_t* q, float* s);
  // acc = sum_k q_k * s_k in fp32 (k in order), then requantized into (oq, os) - all in the rotated domain
  // (H is linear); oq/os may alias q_0/s_0's storage of the same groups (a group is read before written).
  void (*dequant_sum_requant)(const int8_t* const* q, const float* const* s, int nsrc, int64_t n, int8_t* oq,
                              float* os);
  // out = T(H (q * s) / 128): dequantise and rotate back; whole groups.
  void (*dequantize)(int dtype, const int8_t* q, const float* s, int64_t n, void* out);
};

const Kernels* kernels_scalar();
const Kernels* kernels_avx2();
const Kernels* kernels_avx512();

}  // namespace kestrel::comm
