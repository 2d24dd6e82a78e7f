// Interface between the CPU dispatcher (dispatch.cpp, which owns threading and argument validation)
// and the per-ISA kernel translation units (kernels_{scalar,avx2,avx512}.cpp, which are serial and
// work on a range of rows / work items given to them).
#pragma once

#include <cstdint>

namespace kestrel::cpu {

struct RotaryParams {
  int dtype;
  const int64_t* positions;
  void* q;
  int64_t q_stride;  // elements between tokens
  void* k;
  int64_t k_stride;
  int64_t num_heads, num_kv_heads, head_size, rot_dim;
  const float* cos_sin_cache;  // [max_pos, rot_dim]: cos in [0, rot_dim/2), sin in [rot_dim/2, rot_dim)
  bool is_neox;
};

// Decode attention works on pieces: up to kAttnMaxSlots (row, query head) slots of one span, a run of consecutive
// rows whose block tables agree over their contexts (a verify pass's k + 1 rows of one request; else a row of its
// own), so the span's rows share one pass over each kv head's cache. A span's slots are its rows x the nh / nkv
// query heads of a kv head, row-major; a one-row span is cut into pieces of kAttnGroup heads (as many work items as
// before spans), a longer one into pieces of kAttnMaxSlots. Work item = (piece, kv head, context partition).
constexpr int kAttnGroup = 4;      // slots scored together (the kernel's register block)
constexpr int kAttnMaxSlots = 16;  // slots of one piece (its fp32 query and accumulator rows stay on the stack)
constexpr int kAttnMaxHeadDim = 512;

struct AttnPiece {
  int64_t row0;       // the span's first row
  int64_t table_row;  // the span's last row: the longest context, whose block table the piece reads
  int64_t slot0;      // first slot of the piece (slot s: row row0 + s / G, head kvh * G + s % G)
  int64_t num_slots;  // <= kAttnMaxSlots
};

struct AttnParams {
  int dtype;
  void* out;
  int64_t out_s0, out_s1;  // [B, nh, hd], last dim contiguous
  const void* q;
  int64_t q_s0, q_s1;
  const void* k_cache;  // [num_blocks, block_size, nkv, hd] contiguous
  const void* v_cache;
  const int32_t* block_tables;
  int64_t bt_stride;
  const int32_t* context_lens;
  int64_t B, num_heads, num_kv_heads, head_size, block_size;
  float scale;
  const AttnPiece* pieces;  // the step's pieces (dispatch.cpp builds them)
  int64_t num_parts;        // context partitions (split-K); 1 = write `out` directly
  int64_t part_tokens;      // tokens per partition (multiple of block_size)
  float* ws;                // num_parts > 1: [B, nh, num_parts, 2 + hd] (max, sum, acc[hd])
};

struct KernelTable {
  const char* name;
  void (*rms_norm)(int dtype, void* out, int64_t out_stride, const void* x, int64_t x_stride, const void* w,
                   int64_t H, float eps, int64_t t0, int64_t t1);
  void (*fused_add_rms_norm)(int dtype, void* x, int64_t x_stride, void* residual, int64_t r_stride,
                             const void* w, int64_t H, float eps, int64_t t0, int64_t t1);
  void (*rotary)(const RotaryParams& p, int64_t t0, int64_t t1);
  void (*silu_and_mul)(int dtype, void* out, int64_t out_stride, const void* x, int64_t x_stride, int64_t I,
                       int64_t t0, int64_t t1);
  void (*attn_items)(const AttnParams& p, int64_t i0, int64_t i1);
  // Combine partitions: items are (b, h) pairs, b * nh + h.
  void (*attn_reduce)(const AttnParams& p, int64_t i0, int64_t i1);
};

const KernelTable* table_scalar();
const KernelTable* table_avx2();
const KernelTable* table_avx512();
const KernelTable* table_avx512bf16();  // only with KESTREL_HAVE_AVX512BF16

}  // namespace kestrel::cpu
