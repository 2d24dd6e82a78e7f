// The GGUF integer GEMV kernels compiled for the "scalar" level (flags set per file in CMakeLists.txt; gguf_impl.h).
#define KESTREL_GGUF_NS gguf_scalar
#define KESTREL_GGUF_LEVEL 0
#include "gguf_impl.h"

namespace kestrel::cpu {

const GGUFTable* gguf_table_scalar() {
  static const GGUFTable t = {"scalar", gguf_scalar::quantize_x_k, gguf_scalar::gemv_k, gguf_scalar::dequantize_k};
  return &t;
}

}  // namespace kestrel::cpu
