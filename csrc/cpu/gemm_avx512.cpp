// The linear (GEMM / GEMV) kernels compiled for the "avx512" level (flags set per file in CMakeLists.txt,
// the same as kernels_avx512.cpp's).
#define KESTREL_ISA_NS avx512
#include "vec_avx512.h"
#include "gemm_pack_avx512.h"
#define KESTREL_GEMM_TRANSPOSE16 1
#include "gemm_impl.h"

namespace kestrel::cpu {

const LinearTable* linear_table_avx512() {
  static const LinearTable t = {"avx512", avx512::linear_k, avx512::n_align_k, avx512::gemm::GEMV_MAX_M};
  return &t;
}

}  // namespace kestrel::cpu
