// Entry points of the GGUF quantized linear kernels (gguf_dispatch.cpp; formats and regimes in gguf.h), bound in
// bindings.cpp. Pointers arrive as integers, sizes in elements (row_bytes in bytes), the dtype code as in types.h
// with kBatchInvariant allowed; invalid arguments throw std::invalid_argument.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kestrel::cpu {

// out[M, N] (rows os apart) = x[M, K] (rows xs apart) @ W^T + bias, W: N rows of row_bytes GGUF bytes of `qtype`.
void gguf_linear(int dt_flags, uintptr_t out, int64_t os, uintptr_t x, int64_t xs, uintptr_t w, int64_t row_bytes,
                 int qtype, uintptr_t bias, int64_t M, int64_t N, int64_t K);
bool gguf_has_kernel(int qtype);           // ggml type id
std::string gguf_isa();                    // level in use: scalar, avx2, avxvnni or avx512vnni
std::vector<std::string> gguf_isas();      // levels this build and CPU have
void gguf_force_isa(const std::string& name);  // one of gguf_isas(), or "auto" (also KESTREL_GGUF_ISA at import)

}  // namespace kestrel::cpu
