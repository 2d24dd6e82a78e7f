// CUDA entry points of engine._C (compiled only when CMake finds a CUDA compiler; KESTREL_WITH_CUDA).
// Same conventions as cpu/ops.h: raw device pointers as integers, sizes/strides in elements, dtype code
// (0 float32, 1 bfloat16, 2 float16), plus the device index and the cudaStream_t as an integer.
// Launch failures throw std::runtime_error. Nothing here synchronises or allocates, so every launch
// can be captured in a CUDA graph.
#pragma once

#include <cstdint>
#include <string>

namespace kestrel::cuda {

std::string runtime_info();  // "CUDA runtime X.Y, driver X.Y, N device(s)" or the error
void set_int_mma_warps(int warps);  // 0: by the SM count (KernelConfig.int_mma_warps; engine.ops.configure)

void rms_norm(int dtype, uintptr_t out, int64_t out_stride, uintptr_t x, int64_t x_stride, uintptr_t weight,
              int64_t T, int64_t H, double eps, int device, uintptr_t stream);
void fused_add_rms_norm(int dtype, uintptr_t x, int64_t x_stride, uintptr_t residual, int64_t r_stride,
                        uintptr_t weight, int64_t T, int64_t H, double eps, int device, uintptr_t stream);
void silu_and_mul(int dtype, uintptr_t out, int64_t out_stride, uintptr_t x, int64_t x_stride, int64_t T, int64_t I,
                  int device, uintptr_t stream);
void rotary_embedding(int dtype, uintptr_t positions, uintptr_t q, int64_t q_stride, uintptr_t k, int64_t k_stride,
                      int64_t T, int64_t num_heads, int64_t num_kv_heads, int64_t head_size, uintptr_t cos_sin_cache,
                      int64_t rot_dim, bool is_neox, int device, uintptr_t stream);
void reshape_and_cache(int dtype, uintptr_t key, int64_t k_s0, int64_t k_s1, uintptr_t value, int64_t v_s0,
                       int64_t v_s1, uintptr_t k_cache, uintptr_t v_cache, uintptr_t slot_mapping, int64_t T,
                       int64_t num_kv_heads, int64_t head_size, int cache_dtype, uintptr_t k_scale,
                       uintptr_t v_scale, int device, uintptr_t stream);
// rotary_embedding on q and k, then reshape_and_cache of k and v (rows of T tokens, nkv heads of head_size with
// strides k_stride / v_stride per token), as one kernel where the vectorised path applies.
// cache_dtype: the inputs' dtype code, or 3 = fp8 e4m3 (fp8_cache.cuh), storing x / *k_scale (keys) and
// x / *v_scale (values, float32 scalars in device memory) saturated to +-448; the scales are 0 for other caches.
void rotary_and_cache(int dtype, uintptr_t positions, uintptr_t q, int64_t q_stride, uintptr_t k, int64_t k_stride,
                      uintptr_t v, int64_t v_stride, uintptr_t k_cache, uintptr_t v_cache, uintptr_t slot_mapping,
                      int64_t T, int64_t num_heads, int64_t num_kv_heads, int64_t head_size, uintptr_t cos_sin_cache,
                      int64_t rot_dim, bool is_neox, int cache_dtype, uintptr_t k_scale, uintptr_t v_scale,
                      int device, uintptr_t stream);
// As kestrel::cpu::token_positions_and_slots (cpu/ops.h), without its checks; max_query_len bounds the grid.
void token_positions_and_slots(uintptr_t query_start, uintptr_t context_lens, uintptr_t block_tables,
                               int64_t bt_stride, int64_t S, int64_t max_query_len, int64_t block_size,
                               uintptr_t positions, uintptr_t slots, int device, uintptr_t stream);
// Floats of fp32 workspace paged_decode_attention needs for these sizes (0: none; it then writes `out`
// directly). max_tokens = block table capacity (max_blocks_per_seq * block_size); part_tokens as below.
int64_t paged_decode_attention_workspace(int64_t B, int64_t num_heads, int64_t num_kv_heads, int64_t head_size,
                                         int64_t max_tokens, int64_t part_tokens, int device);
// cache_dtype: the dtype's code, or 3 = fp8 e4m3 caches read as value x *k_scale / *v_scale (float32 in device
// memory).
// part_tokens: 0 = partitions sized to fill the GPU at the table's capacity (eager steps, where the capacity is
// the step's longest context); > 0 = partitions of that many tokens over the whole capacity (the partitions past
// a sequence's context exit at once); < 0 = -splits: each sequence's context cut on the device into that many
// partitions of >= 32 tokens (CUDA graphs, whose table has the width of the longest possible context).
void paged_decode_attention(int dtype, uintptr_t out, int64_t out_s0, int64_t out_s1, uintptr_t q, int64_t q_s0,
                            int64_t q_s1, uintptr_t k_cache, uintptr_t v_cache, uintptr_t block_tables,
                            int64_t bt_stride, int64_t max_blocks_per_seq, uintptr_t context_lens, int64_t B,
                            int64_t num_heads, int64_t num_kv_heads, int64_t head_size, int64_t block_size,
                            double scale, uintptr_t workspace, int64_t workspace_floats, int64_t part_tokens,
                            int cache_dtype, uintptr_t k_scale, uintptr_t v_scale, int device, uintptr_t stream);

// Integer weights in the "mma" layout (csrc/cuda/int_gemm.cu; engine/weight_quant.py IntCodes.pack): out[M, N] =
// x[M, K] @ W^T (+ bias, null for none) for M = 1..64 (1..16 for groups of 16 / 32) on the tensor cores, x bfloat16 / float16 (dtype 1 / 2) with
// 16-byte aligned rows; scales [N, G] of scale_dtype (0 fp32, 1 bf16, 2 fp16), zeros uint8 [N, G]; K and the group
// multiples of 16. int_mma_dequantize writes W [N, K] (dtype 0 / 1 / 2) for the GEMM of a prefill.
void int_mma_linear(int dtype, uintptr_t out, int64_t out_stride, uintptr_t x, int64_t x_stride, uintptr_t q,
                    uintptr_t scales, int scale_dtype, int64_t s_stride, uintptr_t zeros, int64_t z_stride,
                    uintptr_t bias, int64_t M, int64_t N, int64_t K, int64_t bits, int64_t group, int device,
                    uintptr_t stream, int64_t tiles_per_block, int64_t k_groups);  // 0, 0: the measured choice
void int_mma_dequantize(int dtype, uintptr_t out, int64_t out_stride, uintptr_t q, uintptr_t scales,
                        int scale_dtype, int64_t s_stride, uintptr_t zeros, int64_t z_stride, int64_t N, int64_t K,
                        int64_t bits, int64_t group, int device, uintptr_t stream);

}  // namespace kestrel::cuda
