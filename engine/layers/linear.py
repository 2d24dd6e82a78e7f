"""Linear layers, sharded for tensor parallelism. Each reads only its own slice of the checkpoint."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch

from engine import ops
from engine.ops import int_mma
from engine.ops.gguf_quant import GGUFSegments, fuse_rows
from engine.parallel.context import TPContext
from engine.weight_quant import Fp8Weight, IntCodes, IntWeight, concat_rows, quantize_int

log = logging.getLogger(__name__)

# What ``LinearBase.quantize`` makes of a float weight for the GPU kernels (--quantization int8 | int4 | fp8)
INT4_GROUP = 128  # or the largest of 64 / 32 dividing K where 128 does not (SmolLM2's K = 576)


def _param(shape, dtype, device=None) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


# While a model is built for a quantized load on a GPU (ModelRunner: --quantization int8 | int4 | fp8, or a GPTQ / AWQ
# / FP8 checkpoint), linear layers create their float weights on the meta device (no memory); each one materializes,
# loads and quantizes its own weight as it loads (or takes the checkpoint's quantized one), so the float model never
# exists whole on the GPU: peak memory is the quantized model plus one layer's float weight.
_QUANTIZED_LOAD: list[str | None] = []


@contextlib.contextmanager
def quantized_load(mode: str | None) -> Iterator[None]:
    """Within: new linear layers defer their float weights (above); ``mode`` (int8 / int4 / fp8; None: only a
    checkpoint's own quantized weights) is applied to each as it loads."""
    _QUANTIZED_LOAD.append(mode)
    try:
        yield
    finally:
        _QUANTIZED_LOAD.pop()


def load_gguf_blocks(weights, slices: list[tuple[str, int, int, int]], param: torch.nn.Parameter
                     ) -> ops.GGUFWeight | GGUFSegments | None:
    """The weight as GGUF blocks when ``param`` lives on the CPU and the source has every slice (name, dim, start,
    stop) in a type with a kernel (``GGUFWeights.quantized_slice``); row slices are stacked in order
    (``fuse_rows``: parts of different types become segments). ``param``'s float storage is then dropped. None:
    the caller loads float weights as usual."""
    get = getattr(weights, "quantized_slice", None)
    if get is None or param.device.type != "cpu":
        return None
    parts = []
    for name, dim, start, stop in slices:
        got = get(name, dim, start, stop, ops.GGUFWeight.KERNEL_TYPES)
        if got is None:
            return None
        q = ops.GGUFWeight.from_blocks(*got)
        if parts and q.k != parts[0].k:
            return None
        parts.append(q)
    w = fuse_rows(parts)
    if tuple(w.shape) != tuple(param.shape):
        raise ValueError(f"{slices[0][0]}: GGUF blocks of shape {tuple(w.shape)} do not fit {tuple(param.shape)}")
    param.data = torch.empty(0, dtype=param.dtype, device=param.device)
    return w


def load_checkpoint_quant(weights, slices: list[tuple[str, int, int, int]], param: torch.nn.Parameter,
                          device: torch.device) -> IntWeight | Fp8Weight | None:
    """The weight as a GPTQ / AWQ / FP8 checkpoint stores it, packed for the GPU kernels, when ``param`` lives on a
    GPU (``device``: the layer's, param may still be on the meta device) and the source has the slices quantized
    (``QuantizedWeights.quantized``: engine/loader/quantized.py); row slices are stacked in order. ``param``'s
    float storage is then dropped. None (the caller loads float weights, which that source dequantizes): another
    device, fp8 on a GPU without fp8 support (compute capability < 8.9), or a slice that cannot be packed (an
    act-order slice with groups of unequal size, a slice cutting groups: logged)."""
    get = getattr(weights, "quantized", None)
    if get is None or device.type != "cuda":
        return None
    try:
        parts = [get(*s) for s in slices]
        if any(p is None for p in parts):
            return None
        w = concat_rows(parts)
        if isinstance(w, Fp8Weight) and torch.cuda.get_device_capability(device) < (8, 9):
            log.info("%s: fp8 weights are dequantized to %s (this GPU has no fp8 support)", slices[0][0], param.dtype)
            return None
        if isinstance(w, IntCodes):
            layout = _int_layout(w, device)
            if layout is None:
                raise ValueError("the GPU integer kernels (csrc/cuda/int_gemm.cu) take K and the group in multiples "
                                 "of 16" if int_mma.available() else "engine._C was built without them")
            packed = w.pack(w.scales.dtype, layout)
        else:
            packed = w
    except ValueError as e:
        log.info("%s: loaded dequantized to %s (%s)", slices[0][0], param.dtype, e)
        return None
    if tuple(packed.shape) != tuple(param.shape):
        raise ValueError(f"{slices[0][0]}: quantized weight of shape {tuple(packed.shape)} does not fit "
                         f"{tuple(param.shape)}")
    packed = packed.to(device)
    param.data = torch.empty(0, dtype=param.dtype, device=param.device)
    return packed


def quantize_for_gpu(w: torch.Tensor, mode: str) -> IntWeight | Fp8Weight | None:
    """--quantization on a GPU: int8 (symmetric, one scale per output channel), int4 (asymmetric, groups of
    INT4_GROUP, or 64 / 32 where K needs), fp8 (e4m3, one scale per output channel). None where K does not allow
    (an integer weight on a GPU: where the tensor-core kernels cannot take it, logged: the layer stays float)."""
    k = w.shape[1]
    if mode == "fp8":
        return Fp8Weight.quantize(w, "channel")
    if mode == "int8":
        c = quantize_int(w, 8, None, symmetric=True)
        return _pack_for(c, w.device, mode)
    if mode == "int4":
        group = next((g for g in (INT4_GROUP, 64, 32) if k % g == 0), None)
        if group is None:
            return None
        c = quantize_int(w, 4, group, symmetric=False)
        return _pack_for(c, w.device, mode)
    raise ValueError(f"unknown quantization {mode!r}")


def _int_layout(c: IntCodes, device: torch.device) -> str | None:
    """The packed layout of integer codes bound for ``device``: on a GPU the tensor-core kernels' ("mma"), None
    where they cannot take the shape (or engine._C has no CUDA kernels): the GPU has no other integer path, the
    weight stays float. Elsewhere (the CPU, which dequantizes per call) the plain "chunk" form."""
    if torch.device(device).type != "cuda":
        return "chunk"
    return int_mma.layout_for(c.codes.shape[1], c.group)


def _pack_for(c: IntCodes, device: torch.device, mode: str) -> IntWeight | None:
    layout = _int_layout(c, device)
    if layout is None:
        n, k = c.codes.shape
        log.info("--quantization %s: a [%d, %d] weight (groups of %d) stays float: the GPU integer kernels take K and "
                 "the group in multiples of 16", mode, n, k, c.group)
        return None
    return c.pack(layout=layout)


class LinearBase(torch.nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype):
        super().__init__()
        self.home = torch.get_default_device()  # where the weight lives once loaded
        self.quantize_on_load = _QUANTIZED_LOAD[-1] if _QUANTIZED_LOAD else None
        self.weight = _param((out_features, in_features), dtype, "meta" if _QUANTIZED_LOAD else None)
        self.bias = _param((out_features,), dtype) if bias else None

    # Quantized weights, then the float weight is dropped: ops.Int8Weight (CPU, quantize_int8), or for the GPU
    # kernels (engine/ops/quant_linear.py) an IntWeight (GPTQ / AWQ checkpoints, --quantization int8 | int4) or an
    # Fp8Weight (FP8 checkpoints, --quantization fp8).
    quant: ops.Int8Weight | IntWeight | Fp8Weight | None = None
    # GGUF blocks kept as the file stores them (CPU, a type with a kernel: engine/ops/gguf_quant.py); then the
    # float weight is dropped. A fused weight whose parts differ in type (a Q4_K_M file's q/k Q4_K, v Q6_K) holds
    # one GGUFWeight per run of one type (GGUFSegments), each computed on by its own native call.
    gguf: ops.GGUFWeight | GGUFSegments | None = None

    @property
    def matmul_weight(self) -> torch.Tensor | ops.Int8Weight | IntWeight | Fp8Weight | ops.GGUFWeight | GGUFSegments:
        if self.gguf is not None:
            return self.gguf
        return self.weight if self.quant is None else self.quant

    def quantize_int8(self) -> bool:
        """Replace the weight by int8 groups of 32 (where K allows); True when done. GGUF blocks stay as they are."""
        if self.gguf is not None:
            return False
        if self.quant is not None or not ops.Int8Weight.supports(self.weight):
            return isinstance(self.quant, ops.Int8Weight)
        self.quant = ops.Int8Weight.quantize(self.weight.data)
        self._drop_float()
        return True

    def quantize(self, mode: str) -> bool:
        """--quantization int8 | int4 | fp8 on a GPU (``quantize_for_gpu``); True when done. A checkpoint's own
        quantized weights stay as they are."""
        if self.quant is not None or self.gguf is not None:
            return False
        q = quantize_for_gpu(self.weight.data, mode)
        if q is None:
            return False
        self.quant = q
        self._drop_float()
        return True

    def _drop_float(self) -> None:
        self.weight.data = torch.empty(0, dtype=self.weight.dtype, device=self.weight.device)

    def _materialize(self) -> None:
        """The float weight's memory, for a layer built under quantized_load (its weight on the meta device)."""
        if self.weight.is_meta:  # (a new Parameter: .data cannot move a tensor off the meta device)
            self.weight = _param(self.weight.shape, self.weight.dtype, self.home)

    def _loaded(self) -> None:
        """After a load: quantize_on_load applied (quantized_load), unless the checkpoint's own weights came."""
        if self.quantize_on_load and self.quant is None and self.gguf is None:
            self.quantize(self.quantize_on_load)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # engine.ops.linear: native GEMV / GEMM on CPU (torch's F.linear is pathological there at decode
        # sizes), F.linear on CUDA; GGUF blocks (one type, or segments of several) on gguf_linear.
        return ops.linear(x, self.matmul_weight, self.bias)

    def _load_quantized(self, weights, slices: list[tuple[str, int, int, int]]) -> bool:
        """``load_gguf_blocks`` or ``load_checkpoint_quant`` into this layer; False: the caller loads float weights
        as usual."""
        self.gguf = load_gguf_blocks(weights, slices, self.weight)
        if self.gguf is None:
            self.quant = load_checkpoint_quant(weights, slices, self.weight, self.home)
        if self.gguf is None and self.quant is None:
            self._materialize()
            return False
        return True

    def _copy_bias_rows(self, parts: list[tuple[str, torch.Tensor]]) -> None:
        row = 0
        for name, b in parts:
            self.bias.data[row:row + b.shape[0]].copy_(b)
            row += b.shape[0]

    def _copy_rows(self, parts: list[tuple[str, torch.Tensor, torch.Tensor | None]]) -> None:
        """Fill the weight (and bias) from row blocks stacked in order."""
        row = 0
        for name, w, b in parts:
            if w.shape[1] != self.weight.shape[1] or row + w.shape[0] > self.weight.shape[0]:
                raise ValueError(f"{name}: shape {tuple(w.shape)} does not fit {tuple(self.weight.shape)}")
            self.weight.data[row:row + w.shape[0]].copy_(w)
            if self.bias is not None:
                if b is None:
                    raise KeyError(f"{name}: bias missing")
                self.bias.data[row:row + w.shape[0]].copy_(b)
            row += w.shape[0]
        if row != self.weight.shape[0]:
            raise ValueError(f"expected {self.weight.shape[0]} rows, got {row}")


class QKVParallelLinear(LinearBase):
    """Fused q/k/v projection; heads split across ranks, KV heads replicated when fewer than ranks."""

    def __init__(self, hidden: int, head_dim: int, n_heads: int, n_kv_heads: int, bias: bool,
                 dtype: torch.dtype, tp: TPContext):
        self.tp = tp
        self.head_dim = head_dim
        q0, q1 = tp.split(n_heads, "number of attention heads")
        self.q_rows = (q0 * head_dim, q1 * head_dim)
        if n_kv_heads >= tp.size:
            k0, k1 = tp.split(n_kv_heads, "number of KV heads")
        else:
            if tp.size % n_kv_heads:
                raise ValueError(f"TP size {tp.size} must be a multiple of the {n_kv_heads} KV heads")
            k0 = tp.rank * n_kv_heads // tp.size
            k1 = k0 + 1
        self.kv_rows = (k0 * head_dim, k1 * head_dim)
        self.num_heads = q1 - q0
        self.num_kv_heads = k1 - k0
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim
        super().__init__(hidden, out, bias, dtype)

    def load(self, weights, prefix: str) -> None:
        spans = (("q_proj", self.q_rows), ("k_proj", self.kv_rows), ("v_proj", self.kv_rows))
        if self._load_quantized(weights, [(f"{prefix}.{n}.weight", 0, r0, r1) for n, (r0, r1) in spans]):
            if self.bias is not None:
                self._copy_bias_rows([(n, weights.get_slice(f"{prefix}.{n}.bias", 0, r0, r1))
                                      for n, (r0, r1) in spans])
            return
        parts = []
        for name, (r0, r1) in spans:
            w = weights.get_slice(f"{prefix}.{name}.weight", 0, r0, r1)
            b = weights.get_slice(f"{prefix}.{name}.bias", 0, r0, r1) if self.bias is not None else None
            parts.append((f"{prefix}.{name}", w, b))
        self._copy_rows(parts)
        self._loaded()


class MergedColumnParallelLinear(LinearBase):
    """Several column-parallel projections of the same input fused into one GEMM (gate + up)."""

    def __init__(self, in_features: int, out_each: int, names: list[str], dtype, tp: TPContext):
        self.tp = tp
        self.names = names
        self.rows = tp.split(out_each, "intermediate size")
        super().__init__(in_features, (self.rows[1] - self.rows[0]) * len(names), False, dtype)

    def load(self, weights, prefix: str) -> None:
        if self._load_quantized(weights, [(f"{prefix}.{n}.weight", 0, *self.rows) for n in self.names]):
            return
        self._copy_rows([(f"{prefix}.{n}", weights.get_slice(f"{prefix}.{n}.weight", 0, *self.rows), None)
                         for n in self.names])
        self._loaded()


class RowParallelLinear(LinearBase):
    """Input dimension split across ranks; the partial outputs are summed by an all-reduce."""

    def __init__(self, in_features: int, out_features: int, dtype, tp: TPContext, what: str):
        self.tp = tp
        self.cols = tp.split(in_features, what)
        super().__init__(self.cols[1] - self.cols[0], out_features, False, dtype)

    def load(self, weights, name: str) -> None:
        if self._load_quantized(weights, [(f"{name}.weight", 1, *self.cols)]):
            return
        w = weights.get_slice(f"{name}.weight", 1, *self.cols)
        if tuple(w.shape) != tuple(self.weight.shape):
            raise ValueError(f"{name}.weight: shape {tuple(w.shape)} does not fit {tuple(self.weight.shape)}")
        self.weight.data.copy_(w)
        self._loaded()

    def forward(self, x: torch.Tensor, reduce: bool = True, residual: torch.Tensor | None = None
                ) -> torch.Tensor | None:
        """This rank's partial product, summed over the ranks unless ``reduce`` is False (then the caller
        reduces it: micro-batch overlap issues the all-reduce itself, asynchronously). With ``residual`` and one
        rank, the product may be added into it by the GEMM itself (ops.linear_into): then None is returned."""
        if residual is not None and reduce and self.tp.size == 1 and ops.linear_into(x, self.matmul_weight, residual):
            return None
        partial = ops.linear(x, self.matmul_weight)
        return self.tp.all_reduce(partial) if reduce else partial
