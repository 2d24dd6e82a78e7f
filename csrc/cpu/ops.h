// CPU entry points of engine._C (implemented in dispatch.cpp): argument validation, ISA dispatch and
// threading around the per-ISA kernels. Pointers arrive as integers (torch's data_ptr()), sizes and
// strides in elements, dtype codes as in types.h (linear and paged_decode_attention also take the option bit
// kBatchInvariant OR-ed into theirs). Invalid arguments throw std::invalid_argument (pybind11 turns that into
// ValueError).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kestrel::cpu {

std::string isa_name();
void force_isa(const std::string& name);  // "auto", "scalar", "avx2", "avx512" or "avx512bf16"
std::vector<std::string> available_isas();
std::string linear_isa();                // level of the linear kernels: the above, or "avx512bf16"
void set_num_threads(int n);
int get_num_threads();
bool has_openmp();

void rms_norm(int dtype, uintptr_t out, int64_t out_stride, uintptr_t x, int64_t x_stride, uintptr_t weight,
              int64_t T, int64_t H, double eps);
void fused_add_rms_norm(int dtype, uintptr_t x, int64_t x_stride, uintptr_t residual, int64_t r_stride,
                        uintptr_t weight, int64_t T, int64_t H, double eps);
void rotary_embedding(int dtype, uintptr_t positions, uintptr_t q, int64_t q_stride, uintptr_t k, int64_t k_stride,
                      int64_t T, int64_t num_heads, int64_t num_kv_heads, int64_t head_size, uintptr_t cos_sin_cache,
                      int64_t max_position, int64_t rot_dim, bool is_neox);
void silu_and_mul(int dtype, uintptr_t out, int64_t out_stride, uintptr_t x, int64_t x_stride, int64_t T, int64_t I);
void reshape_and_cache(int dtype, uintptr_t key, int64_t k_s0, int64_t k_s1, uintptr_t value, int64_t v_s0,
                       int64_t v_s1, uintptr_t k_cache, uintptr_t v_cache, uintptr_t slot_mapping, int64_t T,
                       int64_t num_kv_heads, int64_t head_size, int64_t num_slots);
// Positions and KV-cache slots of a step's tokens, from its sequences (engine/layers/attention.py's layout):
// token t of sequence s (query_start[s] <= t < query_start[s + 1]) sits at position
// context_lens[s] - query_len(s) + (t - query_start[s]) and goes to slot
// block_tables[s, pos / block_size] * block_size + pos % block_size. positions and slots: int64 [T];
// query_start [S + 1], context_lens [S] and block_tables [S, width] (row stride bt_stride): int32.
void token_positions_and_slots(uintptr_t query_start, uintptr_t context_lens, uintptr_t block_tables,
                               int64_t bt_stride, int64_t width, int64_t S, int64_t T, int64_t block_size,
                               uintptr_t positions, uintptr_t slots);
void linear(int dtype, uintptr_t out, int64_t out_stride, uintptr_t x, int64_t x_stride, uintptr_t weight,
            uintptr_t bias, int64_t M, int64_t N, int64_t K, uintptr_t w_scales = 0);
void paged_decode_attention(int dtype, uintptr_t out, int64_t out_s0, int64_t out_s1, uintptr_t q, int64_t q_s0,
                            int64_t q_s1, uintptr_t k_cache, uintptr_t v_cache, uintptr_t block_tables,
                            int64_t bt_stride, int64_t max_blocks_per_seq, uintptr_t context_lens, int64_t B,
                            int64_t num_heads, int64_t num_kv_heads, int64_t head_size, int64_t block_size,
                            int64_t num_blocks, double scale);

}  // namespace kestrel::cpu
