"""The Python face of Kestrel's native kernels (engine._C).

Every function takes torch tensors on CPU or CUDA, checks device, dtype, shape and strides with cheap
attribute reads (this is the decode hot path: ~10 calls per layer), and passes raw pointers, sizes,
strides, a dtype code and (CUDA) the current stream to engine._C. Misuse raises ValueError.

dtypes: float32, bfloat16, float16; arithmetic is fp32 inside the kernels. The rounding points are those
of the pure-torch references in ``engine.ops.reference`` (which documents them).

If engine._C cannot be imported (a source tree that was never built), the functions fall back to the
references (``linear`` to torch's F.linear, which has the same semantics and is much faster than the
fp32 reference); that is logged as a warning and ``native_available()`` returns False.

Configuration: ``configure(kernel_config)`` applies an engine.kernel_config.KernelConfig (resolved from
``device_facts(device)``) once at engine start: the kernels read no environment variable.

CPU: the dispatcher picks AVX-512, AVX2 or scalar kernels at import (``cpu_isa()``); KernelConfig.cpu_isa
forces a level ("avx512bf16": AVX-512 plus the bf16 dot product, used by ``linear``; ``linear_isa()``).
CUDA tensors need a build with the CUDA toolkit (``engine._C.has_cuda``); ``linear`` hands them to torch.
``set_batch_invariant(True)`` (--deterministic) makes the CPU ``linear`` and ``paged_decode_attention`` compute
each row the same way whatever else is in the call.

Modules: ``native`` (loading engine._C, and the dispatch and validation every op shares), ``norm`` (rms_norm,
fused_add_rms_norm, silu_and_mul), ``rotary`` (rotary_embedding; rotary_and_cache: rope and the cache write, one
CUDA kernel), ``attention`` (token_positions_and_slots, reshape_and_cache, paged_decode_attention), ``gemm``
(linear, linear_silu_and_mul), ``int8`` (Int8Weight), ``quant_linear`` (the product with GPU quantized weights, the forms of
engine/weight_quant.py; launchers ``quant_linear_triton``, kernels ``quant_linear_kernel``; ``int_mma``: the tensor-core
kernels of csrc/cuda/int_gemm.cu for integer weights in the "mma" layout), ``gguf_quant``
(GGUFWeight: GGUF Q4_0 / Q4_1 / Q5_0 / Q8_0 / K-quant blocks kept quantized, gguf_linear, gguf_embedding),
``reference`` (the pure-torch references; their timings: ``python -m benchmarks.ops_bench``), ``varlen_attention`` (the
paged varlen attention of steps with a prefill: a Triton kernel, ``varlen_attention_kernel``), ``skinny_gemm`` (the
one-row Triton GEMV inside the decode CUDA graphs, reached through ``gemm.linear``). This file only re-exports their public names.
"""

from engine.ops import reference
from engine.ops.attention import paged_decode_attention, reshape_and_cache, token_positions_and_slots
from engine.ops.gemm import linear, linear_into, linear_silu_and_mul
from engine.ops.gguf_quant import GGUFSegments, GGUFWeight, gguf_embedding, gguf_isa, gguf_isas, gguf_linear
from engine.ops.int8 import Int8Weight
from engine.ops.native import (
    available_isas,
    batch_invariant,
    configure,
    cpu_isa,
    cuda_available,
    device_facts,
    linear_isa,
    native_available,
    set_batch_invariant,
    set_num_threads,
)
from engine.ops.norm import fused_add_rms_norm, rms_norm, silu_and_mul
from engine.ops.rotary import rotary_and_cache, rotary_embedding
from engine.ops.varlen_attention import SHORT_QUERY as VARLEN_SHORT_QUERY
from engine.ops.varlen_attention import KernelConfig as VarlenKernelConfig
from engine.ops.varlen_attention import VarlenPlan, chunk_self_attention, varlen_paged_attention
from engine.ops.varlen_attention import available as varlen_attention_available
from engine.ops.varlen_attention import config_for as varlen_config

__all__ = [
    "rms_norm",
    "fused_add_rms_norm",
    "rotary_embedding",
    "rotary_and_cache",
    "silu_and_mul",
    "linear",
    "linear_silu_and_mul",
    "Int8Weight",
    "GGUFWeight",
    "GGUFSegments",
    "gguf_linear",
    "gguf_embedding",
    "gguf_isa",
    "gguf_isas",
    "reshape_and_cache",
    "token_positions_and_slots",
    "paged_decode_attention",
    "varlen_paged_attention",
    "chunk_self_attention",
    "varlen_attention_available",
    "varlen_config",
    "VarlenKernelConfig",
    "VARLEN_SHORT_QUERY",
    "VarlenPlan",
    "native_available",
    "configure",
    "device_facts",
    "cuda_available",
    "cpu_isa",
    "available_isas",
    "linear_isa",
    "linear_into",
    "set_num_threads",
    "set_batch_invariant",
    "batch_invariant",
    "reference",
]
