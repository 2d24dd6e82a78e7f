// The CPU kernels compiled for the "avx2" level (flags set per file in CMakeLists.txt).
#define KESTREL_ISA_NS avx2
#include "vec_avx2.h"
#include "kernels_impl.h"

namespace kestrel::cpu {

const KernelTable* table_avx2() {
  static const KernelTable t = {"avx2",
                                avx2::rms_norm_k,
                                avx2::fused_add_rms_norm_k,
                                avx2::rotary_k,
                                avx2::silu_and_mul_k,
                                avx2::attn_items_k,
                                avx2::attn_reduce_k};
  return &t;
}

}  // namespace kestrel::cpu
