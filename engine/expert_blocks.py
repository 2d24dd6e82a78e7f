"""Tensor parallelism over a GGUF file's expert blocks, defined once for the engine and the app (torch-free).

Where the native CPU kernels keep a GGUF file's experts as their blocks (--quantization gguf, or auto on the CPU),
each tensor-parallel rank holds its slice of every expert's down projection as whole blocks: the ranks' column
slices must start and end on block boundaries (a K-quant's block is 256 columns wide, so Qwen3-30B-A3B's 768-wide
experts in Q4_K split over 3 ranks, not 2). The engine refuses other sizes before its worker processes start
(engine/runner/load_checks.py) and again while a rank loads its experts (engine/layers/moe_gguf.py); the app's Load
panel offers only the sizes that split (app/fit.py). With --quantization none the experts are dequantized at load:
every size that divides the width works."""

from __future__ import annotations

from collections.abc import Iterable

# (columns, bytes) of one block of each GGUF type the native CPU kernels keep as blocks (ggml's block sizes; the
# engine's GGUF_KERNEL_TYPES, engine/config.py; tests/unit/test_expert_blocks.py holds them to the gguf package's)
KEPT_BLOCKS = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q8_0": (32, 34),
               "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}
MAX_TP_SIZE = 16  # the sizes a refusal lists go up to this
EXPERT_DOWN_SUFFIX = "ffn_down_exps.weight"  # llama.cpp's 3-D routed-expert down projections (one per MoE layer)


def kept_block(type_names: Iterable[str]) -> tuple[str, int] | None:
    """The widest block among the experts' down-projection types that stay blocks: (type name, columns); None when
    none of them does (float or other types are dequantized at load and split anywhere)."""
    kept = [(KEPT_BLOCKS[t][0], t) for t in set(type_names) if t in KEPT_BLOCKS]
    if not kept:
        return None
    columns, name = max(kept)
    return name, columns


def splits_on_blocks(width: int, size: int, block: int) -> bool:
    """Whether ``size`` ranks' equal slices of ``width`` columns are whole numbers of ``block``-column blocks (one
    rank always is: its slice is the whole tensor)."""
    return size == 1 or (width % size == 0 and width // size % block == 0)


def sizes_on_blocks(width: int, block: int, limit: int = MAX_TP_SIZE) -> list[int]:
    """The tensor-parallel sizes from 1 to ``limit`` whose slices of ``width`` are whole blocks."""
    return [t for t in range(1, limit + 1) if splits_on_blocks(width, t, block)]


def refusal(where: str, type_name: str, block: int, width: int, size: int, growth: float, dtype: str) -> str:
    """The plain error for ``size`` ranks that would split ``type_name``'s blocks: the sizes that split on block
    boundaries and --quantization none (the experts dequantized at load: ``growth`` times their size in the file,
    in ``dtype``)."""
    fits = ", ".join(map(str, sizes_on_blocks(width, block)))
    return (f"{where}: the experts' {type_name} blocks ({block} columns each) cannot be split over "
            f"tensor_parallel_size={size}: each rank's {width // size} of the experts' {width} columns is not a whole "
            f"number of blocks. Load with a tensor-parallel size that splits them on block boundaries ({fits}), or "
            f"with --quantization none to dequantize the experts at load (about {growth:.1f}x their size in the "
            f"file, in {dtype})")


def refusal_growth(type_name: str, dtype_bytes: int) -> float:
    """How many times its size in the file an expert of ``type_name`` takes dequantized to ``dtype_bytes`` a value."""
    block, type_size = KEPT_BLOCKS[type_name]
    return dtype_bytes * block / type_size
