// Linear layers on GGUF quantized weights (llama.cpp's block formats), kept in memory at the file's size:
//
//   out[m, n] = dtype(sum_k x[m, k] * W[n, k] + bias[n])      W in GGUF blocks of 32 weights along K
//
// Block formats in the file (ggml type ids; bytes per block):
//   Q4_0 (2, 18 per 32):   f16 d, 16 bytes of nibbles                    w = (nibble - 8) * d
//   Q4_1 (3, 20 per 32):   f16 d, f16 m, 16 bytes of nibbles             w = nibble * d + m
//   Q5_0 (6, 22 per 32):   f16 d, u32 qh (bit j: weight j's 5th bit), 16 bytes of nibbles
//                                                                        w = ((nibble | bit << 4) - 16) * d
//   Q8_0 (8, 34 per 32):   f16 d, 32 x int8                              w = q * d
// (byte j of the nibbles holds weight j in its low half and weight j + 16 in its high half), and the K-quants,
// super-blocks of 256 weights in 8 sub-blocks of 32 (Q6_K: 16 scale groups of 16):
//   Q4_K (12, 144 per 256): f16 d, f16 dmin, 12 bytes of 6-bit scales sc[8] and mins mn[8] (kscales in
//                          gguf_impl.h), 128 bytes of nibbles: bytes [32c, 32c + 32) hold sub-block 2c in their
//                          low halves and 2c + 1 in their high halves      w = d sc[t] * nibble - dmin mn[t]
//   Q5_K (13, 176 per 256): f16 d, f16 dmin, 12 bytes of scales / mins, 32 bytes qh (bit t of byte l: the 5th bit
//                          of weight l of sub-block t), 128 bytes of nibbles as Q4_K's
//                                                                        w = d sc[t] * (nibble | bit << 4) - dmin mn[t]
//   Q6_K (14, 210 per 256): 128 bytes ql, 64 bytes qh, 16 x int8 scales, f16 d. Per half h of 128 weights: ql
//                          bytes [64h, 64h + 32) give sub-blocks 4h (low nibbles) and 4h + 2 (high), bytes
//                          [64h + 32, 64h + 64) sub-blocks 4h + 1 and 4h + 3; qh byte 32h + l holds bits 4-5 of
//                          weight l of sub-block 4h + s in its bits 2s, 2s + 1
//                                                                        w = d sc[g] * ((ql | qh << 4) - 32)
//                          (g = the weight's group of 16 in the super-block).
// In memory each row of a type with blocks of 32 is repacked at load (engine/ops/gguf_quant.py to_planar) into a
// planar order of the same bytes:
//   [quants of block 0, 1, ..., nb-1][f16 d of block 0 .. nb-1][Q4_1: f16 m of block 0 .. nb-1]
// (Q5_0's quants: its 4 qh bytes, then its 16 nibble bytes, as in the file).
// Why: with the scales inline, each block costs a scalar f16 load + conversion + multiply + broadcast per x row (and
// Q4_1 a second for m), which made the GEMV compute-bound at ~2x the integer work; planar, 8 scales convert in one
// vcvtph2ps and multiply d_x in one vmulps, the offsets become vector FMAs, and the per-block work is the integer dot,
// its conversion and one FMA. Memory stays the file's tensor bytes, and rows stay byte rows (row slices for tensor
// parallelism and the fused q/k/v, gate/up concatenations are byte concatenations).
// K-quant rows stay in the file's layout: a super-block's header (d, dmin, packed scales) already serves 8
// sub-blocks, which is the group of 8 the planar layout makes for the types above (8 scales in one vector).
//
// Two regimes (gguf_dispatch.cpp):
//  - decode, M <= kGGUFGemvMaxM (or any M in batch-invariant mode): x is quantized per block of 32 to int8 with
//    a float scale d = absmax / 127 and the block's sum of quants s (llama.cpp's Q8_0 / Q8_1 activations, for
//    every weight type: a K-quant sub-block of 32 meets one x block, so its integer sum is exact and its scale
//    d sc[t] multiplies that sum once), and each weight block meets each x block in an integer dot product
//    (vpdpbusd on AVX512-VNNI / AVX-VNNI, vpmaddubsw + vpmaddwd on AVX2, plain ints on scalar), scaled by d_w * d_x into fp32 accumulators. Q4_0's -8
//    offset and Q4_1's m enter through s: sum_k (q_w - 8) q_x = dot - 8 s, sum_k m d_x q_x = m d_x s (Q5_0: - 16 s;
//    Q4_K / Q5_K: - dmin mn[t] d_x s per sub-block). Q6_K's two int8 scales of a sub-block enter the integer sum
//    (sc[g] per group of 16: vpmaddwd by the scales instead of by ones), then d d_x multiplies it.
//  - prefill (larger M): x is quantized the same way and written back as q * d in its dtype, and panels of weight
//    rows are dequantized into that dtype and run through the float GEMM micro-kernels of the active linear table
//    (gemm.h), which are compute-bound there anyway. Same products as the decode regime (float32: equal up to
//    summation order), so a decode batched with a prefill chunk computes what it computes alone.
// A kernel of the table computes the output columns [n0, n1) for all M rows, serially; the dispatcher splits N.
#pragma once

#include <cstdint>

namespace kestrel::cpu {

enum GGUFType : int {
  kGGUF_Q4_0 = 2, kGGUF_Q4_1 = 3, kGGUF_Q5_0 = 6, kGGUF_Q8_0 = 8, kGGUF_Q4_K = 12, kGGUF_Q5_K = 13, kGGUF_Q6_K = 14
};
constexpr int64_t kGGUFBlock = 32;   // x is quantized per block of 32 for every type
constexpr int64_t kGGUFSuper = 256;  // weights per K-quant super-block

constexpr bool gguf_is_kquant(int qtype) {
  return qtype == kGGUF_Q4_K || qtype == kGGUF_Q5_K || qtype == kGGUF_Q6_K;
}

// Weights per block of a type (K must be a multiple of it): 32, or 256 for the K-quants.
inline int64_t gguf_block_elems(int qtype) { return gguf_is_kquant(qtype) ? kGGUFSuper : kGGUFBlock; }

// Bytes per block (of gguf_block_elems weights), or 0 for a type without a kernel.
inline int64_t gguf_type_size(int qtype) {
  switch (qtype) {
    case kGGUF_Q4_0: return 18;
    case kGGUF_Q4_1: return 20;
    case kGGUF_Q5_0: return 22;
    case kGGUF_Q8_0: return 34;
    case kGGUF_Q4_K: return 144;
    case kGGUF_Q5_K: return 176;
    case kGGUF_Q6_K: return 210;
    default: return 0;
  }
}

// M at or below this runs the integer GEMV regime (measured on the dev machine, SmolLM2 shapes: the integer
// kernel's cost grows with M while the dequantize + GEMM path's is nearly flat up to ~16 rows).
constexpr int64_t kGGUFGemvMaxM = 8;

struct GGUFParams {
  int dtype;             // of x, bias and out (types.h codes)
  int qtype;             // GGUFType
  const uint8_t* w;      // [N, row_bytes]: N rows of K / gguf_block_elems blocks
  int64_t row_bytes;
  const void* bias;      // [N] or nullptr
  void* out;             // [M, N], rows out_stride elements apart
  int64_t out_stride;
  int64_t M, N, K;
  // x quantized per block (quantize_x): int8 [M, K], d and s float [M, K / 32]
  const int8_t* xq;
  const float* xd;
  const float* xs;
};

struct GGUFTable {
  const char* name;
  // Quantize rows [m0, m1) of x (dtype, rows x_stride elements apart) into xq / xd / xs (rows K and K / 32 apart).
  void (*quantize_x)(int dtype, const void* x, int64_t x_stride, int64_t K, int64_t m0, int64_t m1, int8_t* xq,
                     float* xd, float* xs);
  void (*gemv)(const GGUFParams& p, int64_t n0, int64_t n1);
  // Rows [n0, n1) of a weight dequantized into `out` ([n1 - n0, K] row-major, of `dtype`): the prefill regime's
  // panels for the float GEMM kernels.
  void (*dequantize)(int qtype, int dtype, const uint8_t* w, int64_t row_bytes, int64_t K, int64_t n0, int64_t n1,
                     void* out);
};

const GGUFTable* gguf_table_scalar();
const GGUFTable* gguf_table_avx2();
const GGUFTable* gguf_table_avxvnni();
const GGUFTable* gguf_table_avx512vnni();

}  // namespace kestrel::cpu
