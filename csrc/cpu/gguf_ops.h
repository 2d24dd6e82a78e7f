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
// out[t, :] = row ids[t] of W dequantized to dtype (t < count; ids int64, each in [0, N)): the token embedding's
// lookup on GGUF blocks (ggml's get_rows), the same values the prefill regime's panels hold.
void gguf_get_rows(int dtype, uintptr_t out, uintptr_t w, int64_t row_bytes, int qtype, uintptr_t ids, int64_t count,
                   int64_t N, int64_t K);
// out[N, K] = the whole weight dequantized to dtype, its rows split over the threads: the prefill regime on CPUs
// whose matrix units (AMX) make torch's GEMM faster than the panels (engine/ops/gguf_quant.py).
void gguf_dequantize(int dtype, uintptr_t out, uintptr_t w, int64_t row_bytes, int qtype, int64_t N, int64_t K);
bool gguf_has_kernel(int qtype);           // ggml type id
std::string gguf_isa();                    // level in use: scalar, avx2, avxvnni or avx512vnni
std::vector<std::string> gguf_isas();      // levels this build and CPU have
void gguf_force_isa(const std::string& name);  // one of gguf_isas(), or "auto" (engine.ops.configure: KernelConfig.gguf_isa)

}  // namespace kestrel::cpu
