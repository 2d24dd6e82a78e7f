// Portable one-lane "vector" used by the scalar kernel variant (the generic kernels in kernels_impl.h
// are written against this interface; see vec_avx2.h / vec_avx512.h for the SIMD versions).
#pragma once

#include <cmath>

#include "types.h"

namespace kestrel::cpu::scalar {

struct Vec {
  static constexpr int W = 1;
  using R = float;
  static R zero() { return 0.f; }
  static R set1(float x) { return x; }
  template <class T>
  static R load(const T* p) { return to_f32(*p); }
  template <class T>
  static void store(T* p, R v) { *p = from_f32<T>(v); }
  static R add(R a, R b) { return a + b; }
  static R sub(R a, R b) { return a - b; }
  static R mul(R a, R b) { return a * b; }
  static R div(R a, R b) { return a / b; }
  static R max(R a, R b) { return a > b ? a : b; }
  static R fma(R a, R b, R c) { return a * b + c; }   // a*b + c
  static R fnma(R a, R b, R c) { return c - a * b; }  // c - a*b
  static float hsum(R a) { return a; }
  static float hmax(R a) { return a; }
  static R exp(R x) { return std::exp(x); }
  template <class T>
  static R round(R v) { return round_to<T>(v); }
  static R swap_pairs(R v) { return v; }  // unused: one lane holds no pair (kernels check W >= 2)
  static R transpose_sum(const R* v) { return v[0]; }
};

}  // namespace kestrel::cpu::scalar
