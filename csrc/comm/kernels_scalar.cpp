// Portable one-lane comm kernels (any CPU).
#include <cmath>

#include "comm_kernels.h"
#include "comm_types.h"

namespace kestrel::comm {
namespace scalar {

struct V {
  static constexpr int W = 1;
  using R = float;
  static R set1(float x) { return x; }
  template <class T>
  static R load(const T* p) { return kc_to_f32(*p); }
  template <class T>
  static void store(T* p, R v) { kc_store(p, v); }
  static R add(R a, R b) { return a + b; }
  static R sub(R a, R b) { return a - b; }
  static R mul(R a, R b) { return a * b; }
  static R butterfly(R v, int) { return v; }  // one lane: every stage is across "registers"
  static R max(R a, R b) { return a > b ? a : b; }
  static R abs(R a) { return std::fabs(a); }
  static float hmax(R a) { return a; }
  static R load_i8(const int8_t* p) { return float(*p); }
  static void store_i8(int8_t* p, R v) {
    float r = std::nearbyint(v);  // default rounding mode: half to even
    *p = int8_t(r > 127.f ? 127.f : (r < -128.f ? -128.f : r));
  }
};

#include "kernels_impl.h"

}  // namespace scalar

const Kernels* kernels_scalar() {
  static const Kernels k{"scalar", scalar::reduce_k, scalar::quantize_k, scalar::dequant_sum_requant_k,
                         scalar::dequantize_k};
  return &k;
}

}  // namespace kestrel::comm
