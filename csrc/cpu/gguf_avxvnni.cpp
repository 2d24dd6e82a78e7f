// The GGUF integer GEMV kernels compiled for the "avxvnni" level (flags set per file in CMakeLists.txt; gguf_impl.h).
#define KESTREL_GGUF_NS gguf_avxvnni
#define KESTREL_GGUF_LEVEL 2
#include "gguf_impl.h"

namespace kestrel::cpu {

const GGUFTable* gguf_table_avxvnni() {
  static const GGUFTable t = {"avxvnni", gguf_avxvnni::quantize_x_k, gguf_avxvnni::gemv_k, gguf_avxvnni::dequantize_k};
  return &t;
}

}  // namespace kestrel::cpu
