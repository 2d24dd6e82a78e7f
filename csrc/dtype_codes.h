// The dtype codes engine._C takes, defined once for every part of the native module (csrc/cpu, csrc/cuda,
// csrc/comm). engine/dtype_codes.py is the Python side; tests/unit/test_dtype_codes.py parses this file and checks
// that the two agree.
#pragma once

namespace kestrel {

// The element type of a tensor argument.
enum DType : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// A KV cache's element type where it may differ from the model's: --kv-cache-dtype fp8 (e4m3, with a float32
// scale per cache: csrc/cuda/fp8_cache.cuh); otherwise the model's dtype code.
constexpr int kCacheFp8E4M3 = 3;

// Option bits a caller may OR into the dtype code of the CPU linear and paged_decode_attention calls (csrc/cpu/ops.h);
// the other entry points take the plain code. kBatchInvariant: each output row is computed the same way whatever the
// other rows of the call (their number, their place, their context lengths) and the thread count, so a request gets
// the same bits alone or in any batch (engine/ops/native.py set_batch_invariant, --deterministic):
//  - linear: the GEMV kernels (reduction along K in the vector lanes, one reduction tree) for every M, in row
//    blocks, never the GEMM kernels (whose sequential-K order rounds differently);
//  - paged_decode_attention: context partitions of a fixed length (kInvariantPartTokens), not ones sized by the
//    batch and the thread count.
constexpr int kDTypeMask = 0xff;
constexpr int kBatchInvariant = 1 << 8;

}  // namespace kestrel
