// The mixture-of-experts routed step on GGUF experts (moe.cpp; engine/layers/moe_native.py), bound in bindings.cpp.
#pragma once

#include <cstdint>

namespace kestrel::cpu {

// out[T, H] (rows H apart) = sum over j < k of weights[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t)), e = ids[t, j];
// x [T, H] rows xs apart; w13 / w2: int64 arrays of E addresses of each expert's gate_up [2I, H] / down [H, I] GGUF
// rows (planar, engine/ops/gguf_quant.py) of one type each. route 0: ids (int64 [T, k]) and weights (float32
// [T, k]) are given; 1 / 2: computed here from logits [T, E] (x's dtype): float32 softmax, the k largest (ties:
// the lower expert), 2 renormalises them; written into ids / weights.
void moe_experts(int dt_flags, uintptr_t out, uintptr_t x, int64_t xs, int64_t T, int64_t H, int64_t I, int64_t k,
                 uintptr_t logits, int64_t E, int route, uintptr_t ids, uintptr_t weights, uintptr_t w13,
                 int64_t row_bytes13, int qtype13, uintptr_t w2, int64_t row_bytes2, int qtype2);

}  // namespace kestrel::cpu
