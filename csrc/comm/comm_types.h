// Storage tags and scalar fp32 <-> bf16 / fp16 conversions for csrc/comm.
//
// Everything here has internal linkage (static), on purpose: each ISA translation unit is compiled with its
// own -m flags, and a function with external linkage could be merged across them by the linker (one copy
// wins), which could run AVX-512 code on a CPU without it. Same algorithms as csrc/cpu/types.h.
#pragma once

#include <cstdint>
#include <cstring>

#include "../dtype_codes.h"

namespace kestrel::comm {

// The dtype codes, defined once in ../dtype_codes.h; the short names this directory uses.
constexpr int kF32 = kestrel::kFloat32, kBF16 = kestrel::kBFloat16, kF16 = kestrel::kFloat16;

struct BF16 {
  uint16_t bits;
};
struct F16 {
  uint16_t bits;
};

static inline int dtype_size(int dtype) { return dtype == kF32 ? 4 : 2; }

static inline uint32_t kc_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
static inline float kc_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

static inline float kc_to_f32(float x) { return x; }
static inline float kc_to_f32(BF16 x) { return kc_float(uint32_t(x.bits) << 16); }
static inline float kc_to_f32(F16 x) {  // exact (M. Dukhan's FP16 conversion; needs fp-contract=off)
  const uint32_t w = uint32_t(x.bits) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const uint32_t exp_offset = 0xE0u << 23;
  const float normalized = kc_float((two_w >> 4) + exp_offset) * 0x1.0p-112f;
  const float denormalized = kc_float((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t denorm_cutoff = 1u << 27;
  return kc_float(sign | (two_w < denorm_cutoff ? kc_bits(denormalized) : kc_bits(normalized)));
}

static inline void kc_store(float* p, float f) { *p = f; }
static inline void kc_store(BF16* p, float f) {  // round to nearest even; NaN stays a quiet NaN
  uint32_t u = kc_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    p->bits = uint16_t((u >> 16) | 0x40u);
    return;
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  p->bits = uint16_t(u >> 16);
}
static inline void kc_store(F16* p, float f) {  // round to nearest even, overflow to inf
  const uint32_t w = kc_bits(f);
  float base = (kc_float(w & 0x7fffffffu) * 0x1.0p+112f) * 0x1.0p-110f;
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = kc_float((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = kc_bits(base);
  const uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
  p->bits = uint16_t((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

}  // namespace kestrel::comm
