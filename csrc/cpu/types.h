// Storage types and scalar fp32 <-> bf16/fp16 conversions shared by every CPU translation unit.
//
// Everything here has internal linkage (static inline) on purpose: each ISA translation unit is
// compiled with its own -m flags, and an inline function with external linkage would be merged by
// the linker across them (one copy wins), which could run AVX-512 code on a CPU without it.
#pragma once

#include <cstdint>
#include <cstring>

#include "../dtype_codes.h"

namespace kestrel {

// The dtype codes (kFloat32, kBFloat16, kFloat16) and the option bits (kBatchInvariant): ../dtype_codes.h.

struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

static inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
static inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

static inline float to_f32(float x) { return x; }
static inline float to_f32(int8_t x) { return float(x); }
static inline float to_f32(bf16_t x) { return f32_from_bits(uint32_t(x.bits) << 16); }

// IEEE half -> float, exact (handles subnormals, inf, nan). Branch-light version of the well-known
// FP16 library conversion (M. Dukhan); requires fp-contract=off (set by CMake for these sources).
static inline float to_f32(f16_t x) {
  const uint32_t w = uint32_t(x.bits) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const uint32_t exp_offset = 0xE0u << 23;
  const float exp_scale = 0x1.0p-112f;
  const float normalized = f32_from_bits((two_w >> 4) + exp_offset) * exp_scale;
  const uint32_t magic_mask = 126u << 23;
  const float magic_bias = 0.5f;
  const float denormalized = f32_from_bits((two_w >> 17) | magic_mask) - magic_bias;
  const uint32_t denorm_cutoff = 1u << 27;
  const uint32_t result = sign | (two_w < denorm_cutoff ? f32_bits(denormalized) : f32_bits(normalized));
  return f32_from_bits(result);
}

template <class T>
static inline T from_f32(float f);

template <>
inline float from_f32<float>(float f) {
  return f;
}

// float -> bfloat16, round to nearest even; NaN stays a (quiet) NaN.
template <>
inline bf16_t from_f32<bf16_t>(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{uint16_t((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16_t{uint16_t(u >> 16)};
}

// float -> IEEE half, round to nearest even, overflow to inf, NaN to NaN.
template <>
inline f16_t from_f32<f16_t>(float f) {
  const float scale_to_inf = 0x1.0p+112f;
  const float scale_to_zero = 0x1.0p-110f;
  const uint32_t w = f32_bits(f);
  float base = (f32_from_bits(w & 0x7fffffffu) * scale_to_inf) * scale_to_zero;
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = f32_bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return f16_t{uint16_t((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign))};
}

// Round a float to storage type T and back (what storing in T and reloading gives).
template <class T>
static inline float round_to(float f) {
  return to_f32(from_f32<T>(f));
}

}  // namespace kestrel
