// The CPU kernels compiled for the "avx512bf16" level: the "avx512" kernels, with the decode attention's scores
// of bfloat16 caches by vdpbf16ps (flags set per file in CMakeLists.txt).
#define KESTREL_ISA_NS avx512bf16
#include "vec_avx512.h"
#include "kernels_impl.h"

namespace kestrel::cpu {

const KernelTable* table_avx512bf16() {
  static const KernelTable t = {"avx512bf16",
                                avx512bf16::rms_norm_k,
                                avx512bf16::fused_add_rms_norm_k,
                                avx512bf16::rotary_k,
                                avx512bf16::silu_and_mul_k,
                                avx512bf16::attn_items_k,
                                avx512bf16::attn_reduce_k};
  return &t;
}

}  // namespace kestrel::cpu
