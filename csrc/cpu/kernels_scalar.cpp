// The CPU kernels compiled for the "scalar" level (flags set per file in CMakeLists.txt).
#define KESTREL_ISA_NS scalar
#include "vec_scalar.h"
#include "kernels_impl.h"

namespace kestrel::cpu {

const KernelTable* table_scalar() {
  static const KernelTable t = {"scalar",
                                scalar::rms_norm_k,
                                scalar::fused_add_rms_norm_k,
                                scalar::rotary_k,
                                scalar::silu_and_mul_k,
                                scalar::attn_items_k,
                                scalar::attn_reduce_k};
  return &t;
}

}  // namespace kestrel::cpu
