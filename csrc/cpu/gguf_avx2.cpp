// The GGUF integer GEMV kernels compiled for the "avx2" level (flags set per file in CMakeLists.txt; gguf_impl.h).
#define KESTREL_GGUF_NS gguf_avx2
#define KESTREL_GGUF_LEVEL 1
#include "gguf_impl.h"

namespace kestrel::cpu {

const GGUFTable* gguf_table_avx2() {
  static const GGUFTable t = {"avx2", gguf_avx2::quantize_x_k, gguf_avx2::gemv_k, gguf_avx2::dequantize_k};
  return &t;
}

}  // namespace kestrel::cpu
