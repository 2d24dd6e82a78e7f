"""The dtype codes engine._C takes, defined once on the Python side (csrc/dtype_codes.h is the C++ side;
tests/unit/test_dtype_codes.py parses that header and checks the two agree). Torch-free: the codes by torch dtype
name; engine/ops/native.py and engine/parallel/comm/kernels.py build their torch-keyed maps from ``BY_NAME``."""

from __future__ import annotations

FLOAT32 = 0  # kFloat32
BFLOAT16 = 1  # kBFloat16
FLOAT16 = 2  # kFloat16
CACHE_FP8_E4M3 = 3  # kCacheFp8E4M3: a KV cache of fp8 e4m3 values (--kv-cache-dtype fp8)
DTYPE_MASK = 0xFF  # kDTypeMask
BATCH_INVARIANT = 1 << 8  # kBatchInvariant: option bit of the CPU linear and paged_decode_attention calls

# torch dtype name -> code, the model dtypes every kernel takes
BY_NAME = {"float32": FLOAT32, "bfloat16": BFLOAT16, "float16": FLOAT16}
# ... and the KV caches' element types
CACHE_BY_NAME = {**BY_NAME, "float8_e4m3fn": CACHE_FP8_E4M3}


def torch_map(torch_module, names: dict[str, int] = BY_NAME) -> dict:
    """{torch.float32: 0, ...} for the torch module given (the caller imports torch; this module does not)."""
    return {getattr(torch_module, name): code for name, code in names.items()}
