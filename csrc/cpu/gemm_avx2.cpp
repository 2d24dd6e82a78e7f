// The linear (GEMM / GEMV) kernels compiled for the "avx2" level (flags set per file in CMakeLists.txt,
// the same as kernels_avx2.cpp's).
#define KESTREL_ISA_NS avx2
#include "vec_avx2.h"
#include "gemm_impl.h"

namespace kestrel::cpu {

const LinearTable* linear_table_avx2() {
  static const LinearTable t = {"avx2", avx2::linear_k, avx2::n_align_k, avx2::gemm::GEMV_MAX_M};
  return &t;
}

}  // namespace kestrel::cpu
