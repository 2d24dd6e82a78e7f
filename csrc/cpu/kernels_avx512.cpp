// The CPU kernels compiled for the "avx512" level (flags set per file in CMakeLists.txt).
#define KESTREL_ISA_NS avx512
#include "vec_avx512.h"
#include "kernels_impl.h"

namespace kestrel::cpu {

const KernelTable* table_avx512() {
  static const KernelTable t = {"avx512",
                                avx512::rms_norm_k,
                                avx512::fused_add_rms_norm_k,
                                avx512::rotary_k,
                                avx512::silu_and_mul_k,
                                avx512::attn_items_k,
                                avx512::attn_reduce_k};
  return &t;
}

}  // namespace kestrel::cpu
