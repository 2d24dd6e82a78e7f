// The linear (GEMM / GEMV) kernels compiled for the "scalar" level (flags set per file in CMakeLists.txt,
// the same as kernels_scalar.cpp's).
#define KESTREL_ISA_NS scalar
#include "vec_scalar.h"
#include "gemm_impl.h"

namespace kestrel::cpu {

const LinearTable* linear_table_scalar() {
  static const LinearTable t = {"scalar", scalar::linear_k, scalar::n_align_k, scalar::gemm::GEMV_MAX_M};
  return &t;
}

}  // namespace kestrel::cpu
