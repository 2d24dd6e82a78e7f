// Interface between the CPU dispatcher (dispatch.cpp: validation, threading) and the per-ISA linear
// (GEMM / GEMV) translation units gemm_{scalar,avx2,avx512,avx512bf16}.cpp.
//
//   out[m, n] = dtype(sum_k x[m, k] * w[n, k] + bias[n])      fp32 accumulation, one rounding at the end
//
// A kernel computes the output columns [n0, n1) for all M rows, serially; the dispatcher splits N across
// threads in chunks aligned to `n_align(M)`. Each output element is reduced in one order whatever n0, n1, M and
// the row's place in the call, within a regime; the regime depends on M (below) unless `gemv_any_m`. Two regimes
// inside each kernel:
//  - M <= gemv_max_m ("decode"): a memory-bound GEMV. Each weight row is streamed from memory once for
//    all M rows of x (x stays in L1), several weight rows at a time, dot products along K in the vector
//    lanes, a horizontal reduction at the end.
//  - larger M ("prefill"): a register-blocked GEMM. Panels of NR vectors' worth of weight rows are packed
//    (transposed to [k][n], per thread, per call: one pass over W, reused by all M rows) and an
//    MR x (NR * lanes) micro-kernel broadcasts x elements against them.
// Weights are either of the activation dtype or int8 with a scale per group of 32 along K (LinearParams);
// int8 weights are widened to fp32 and scaled in registers (GEMV) or while packing (GEMM), so they halve
// the bytes a decode step streams against bfloat16.
#pragma once

#include <cstdint>

namespace kestrel::cpu {

struct LinearParams {
  int dtype;            // of x, w, bias and out (types.h codes)
  const void* x;        // [M, K], rows x_stride elements apart, last dim contiguous
  int64_t x_stride;
  const void* w;        // [N, K] contiguous
  const void* bias;     // [N] or nullptr
  void* out;            // [M, N], rows out_stride elements apart, last dim contiguous
  int64_t out_stride;
  int64_t M, N, K;
  // int8 weights (weight-only quantization): w is int8 [N, K] and w_scales fp32 [N, K / kQ8Group], one scale
  // per group of kQ8Group consecutive weights of a row (w = q * scale); nullptr for weights of `dtype`.
  const float* w_scales = nullptr;
  // Batch-invariant mode (types.h kBatchInvariant): the GEMV regime whatever M (the dispatcher passes row blocks
  // of kInvariantRows), so that a row's result never depends on M.
  bool gemv_any_m = false;
};

// Rows per call of the kernels in batch-invariant mode: x's block (fp32, <= 64 x K) stays in L2 while each weight
// block streams once per 64 rows.
constexpr int64_t kInvariantRows = 64;

constexpr int64_t kQ8Group = 32;

struct LinearTable {
  const char* name;
  void (*linear)(const LinearParams& p, int64_t n0, int64_t n1);
  // Column-chunk alignment the dispatcher should use when splitting N for this M (a packed panel's width
  // for the GEMM regime, a weight-row block for the GEMV regime).
  int64_t (*n_align)(const LinearParams& p);
  int64_t gemv_max_m;  // M at or below this runs the GEMV regime
};

const LinearTable* linear_table_scalar();
const LinearTable* linear_table_avx2();
const LinearTable* linear_table_avx512();
const LinearTable* linear_table_avx512bf16();  // AVX-512 + AVX512_BF16 (vdpbf16ps for bfloat16 weights)

// The table linear() uses now (dispatch.cpp): the GGUF kernels run their prefill panels through it (gguf.h).
const LinearTable& active_linear_table();

}  // namespace kestrel::cpu
