// The GGUF integer GEMV kernels compiled for the "avx512vnni" level (flags set per file in CMakeLists.txt; gguf_impl.h).
#define KESTREL_GGUF_NS gguf_avx512vnni
#define KESTREL_GGUF_LEVEL 3
#include "gguf_impl.h"

namespace kestrel::cpu {

const GGUFTable* gguf_table_avx512vnni() {
  static const GGUFTable t = {"avx512vnni", gguf_avx512vnni::quantize_x_k, gguf_avx512vnni::gemv_k, gguf_avx512vnni::dequantize_k};
  return &t;
}

}  // namespace kestrel::cpu
