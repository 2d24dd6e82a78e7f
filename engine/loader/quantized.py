"""Pre-quantized Hugging Face checkpoints: GPTQ, AWQ and FP8 (``quant_method: "fp8"`` and llm-compressor's
``"compressed-tensors"``), read into Kestrel's canonical forms (engine/weight_quant.py: IntCodes, Fp8Weight).

``QuantizedWeights`` wraps the directory's SafetensorsWeights and presents Hugging Face float names: each quantized
linear ``<p>`` shows as ``<p>.weight`` of shape (N, K) (its qweight / qzeros / scales / g_idx, or weight_scale /
weight_scale_inv / input_scale, hidden). ``get`` / ``get_slice`` return it dequantized to ``compute_dtype`` (the CPU
path): computed in float32, where (code - zero) * scale is exact for float16 / bfloat16 scales, and rounded once to
that dtype; it is the checkpoint's torch_dtype until the model runner sets the engine's (a float32 engine then holds
exactly the weights' values, not their float16 rounding). ``quantized`` returns the canonical form of a slice, for
the GPU kernels. Tensors are read
only when asked, and only the slice asked for (the small scales of FP8 excepted). Which quantization_configs
load (``QuantScheme``, ``parse_scheme``'s rules) is engine/quant_scheme.py's, torch-free for the app.

The formats (N output rows, K input columns, G groups of ``group`` K positions):
- GPTQ (AutoGPTQ / GPTQModel): ``qweight`` int32 [K * bits / 32, N] packed along K (position k = (32 / bits) * row
  + i in bits bits*i.. of qweight[row, n]), ``qzeros`` int32 [G, N * bits / 32] packed along N the same way,
  ``scales`` fp16 [G, N], ``g_idx`` int32 [K] (each position's group; act-order when it is not k // group).
  checkpoint_format "gptq" (v1) stores each zero minus one; "gptq_v2" stores it as it is.
- AWQ (AutoAWQ GEMM): ``qweight`` int32 [K, N / 8] packed along N with nibble i of word j holding column
  8j + AWQ_ORDER[i] (WQLinear_GEMM.from_linear's order_map), ``qzeros`` int32 [G, N / 8] the same, ``scales`` [G, N].
- FP8: ``weight`` float8_e4m3fn [N, K] and a float32 scale that multiplies (w = fp8 * scale, whatever its name):
  ``weight_scale_inv`` [ceil(N/128), ceil(K/128)] (DeepSeek-V3 / Qwen blocks), ``weight_scale`` [] / [1] per tensor,
  [N, 1] per channel (compressed-tensors) or the block grid. Static ``input_scale`` tensors are ignored.
Integer weights are (code - zero) * scale. Layers without quantized tensors (lm_head, usually) stay float.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from engine import quant_scheme
from engine.errors import CheckpointError
from engine.loader.safetensors import SafetensorsWeights
from engine.loader.weights import WeightSource
from engine.quant_scheme import QuantScheme
from engine.weight_quant import FP8, FP8_BLOCK, Fp8Weight, IntCodes

log = logging.getLogger(__name__)

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds output column 8j + AWQ_ORDER[i]
INT_TENSORS = ("qweight", "qzeros", "scales", "g_idx")
FP8_TENSORS = ("weight_scale", "weight_scale_inv", "input_scale")
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def parse_scheme(qc: dict, path: Path | str) -> QuantScheme:
    """The scheme of a quantization_config (engine/quant_scheme.py's rules; ``path``: config.json, for the
    messages); CheckpointError naming the field when Kestrel cannot read it."""
    try:
        return quant_scheme.parse_scheme(qc)
    except quant_scheme.SchemeError as e:
        raise CheckpointError(path, str(e)) from e


@dataclass(frozen=True)
class _IntLayout:
    prefix: str
    n: int
    k: int
    groups: int              # G
    group: int               # K positions per group (K: per output channel)
    g_idx: torch.Tensor | None  # act-order only


@dataclass(frozen=True)
class _Fp8Layout:
    prefix: str
    n: int
    k: int
    scale_name: str
    scale_shape: tuple[int, ...]  # the canonical one (Fp8Weight's)


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _unpack(words: torch.Tensor, bits: int, dim: int, order: tuple[int, ...] | None) -> torch.Tensor:
    """uint8 codes of int32 words packed along ``dim`` (value i of a word in bits bits*i..; ``order``: value i
    is the word's order[i]-th position, else its i-th), that dim 32 / bits times longer."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    v = (words.unsqueeze(-1) >> shifts) & (2 ** bits - 1)  # [R, C, 32 / bits]
    if order is not None:
        v = v[..., [order.index(c) for c in range(len(order))]]
    r, c, per = v.shape
    v = v.permute(0, 2, 1).reshape(r * per, c) if dim == 0 else v.reshape(r, c * per)
    return v.to(torch.uint8)


class QuantizedWeights(WeightSource):
    """A pre-quantized checkpoint's tensors under Hugging Face float names (see the module doc)."""

    def __init__(self, inner: SafetensorsWeights, scheme: QuantScheme, dtype: str | torch.dtype | None = None):
        self.inner, self.scheme, self.path = inner, scheme, inner.path
        default = _DTYPES[scheme.default_dtype_name]
        # what get / get_slice dequantize into: the checkpoint's dtype here, the engine's once the runner sets it
        self.compute_dtype = dtype if isinstance(dtype, torch.dtype) else _DTYPES.get(dtype, default)
        self._is_int = scheme.method != "fp8"
        names = inner.names()
        if self._is_int:
            self._linears = {n.removesuffix(".qweight") for n in names if n.endswith(".qweight")}
        else:
            self._linears = {n.rsplit(".", 1)[0] for n in names if n.rsplit(".", 1)[-1] in scheme.scale_names}
        if not self._linears:
            wanted = "qweight" if self._is_int else " / ".join(scheme.scale_names)
            raise CheckpointError(self.path, f"config.json's quant_method {scheme.method} describes {scheme.name} "
                                  f"weights, but no tensor is quantized (no *.{wanted} tensors)")
        hidden = {f"{p}.{t}" for p in self._linears for t in (INT_TENSORS if self._is_int else FP8_TENSORS)}
        self._names = [n.removesuffix(".qweight") + ".weight" if n.endswith(".qweight") else n
                       for n in names if n not in hidden or n.endswith(".qweight")]
        self._name_set = set(self._names)
        self._layouts: dict[str, _IntLayout | _Fp8Layout] = {}
        self._told = False
        if any(n.endswith(".input_scale") for n in names):
            log.info("%s: the checkpoint's static input_scale tensors are ignored; activations are quantized "
                     "dynamically instead", self.path)

    # -- WeightSource
    def names(self) -> list[str]:
        return list(self._names)

    def __contains__(self, name: str) -> bool:
        return name in self._name_set

    def shape(self, name: str) -> tuple[int, ...]:
        p = self._prefix(name)
        if p is None:
            if name in self.inner and self.inner.dtype(name) == FP8:
                raise self._err(name, f"is float8 without a scale ({' / '.join(self.scheme.scale_names)})")
            return self.inner.shape(name)
        layout = self._layout(p)
        return (layout.n, layout.k)

    def dtype(self, name: str) -> torch.dtype:
        return self.compute_dtype if self._prefix(name) is not None else self.inner.dtype(name)

    def get(self, name: str) -> torch.Tensor:
        if self._prefix(name) is None:
            return self.inner.get(name)
        return self.get_slice(name, 0, 0, self.shape(name)[0])

    def get_slice(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
        if self._prefix(name) is None:
            return self.inner.get_slice(name, dim, start, stop)
        self._check_slice(name, dim, start, stop)
        self._tell_dequantized()
        try:
            return self.quantized(name, dim, start, stop).dequantize(self.compute_dtype)
        except ValueError:  # the slice cuts groups / blocks: the whole weight, then the slice
            n = self.shape(name)[0]
            return self.quantized(name, 0, 0, n).dequantize(self.compute_dtype).narrow(dim, start, stop - start)

    def close(self) -> None:
        self.inner.close()

    # -- the canonical forms
    def quantized(self, name: str, dim: int, start: int, stop: int) -> IntCodes | Fp8Weight | None:
        """``<p>.weight``'s slice [start, stop) along ``dim`` (0: output rows, 1: K columns) in its canonical
        form; None for a tensor that is not quantized. ValueError for a slice that cuts the scales' groups
        or blocks (an act-order or per-channel weight may be cut anywhere)."""
        p = self._prefix(name)
        if p is None:
            return None
        self._check_slice(name, dim, start, stop)
        dim %= 2
        layout = self._layout(p)
        return self._int_codes(layout, dim, start, stop) if self._is_int else self._fp8(layout, dim, start, stop)

    def _int_codes(self, lay: _IntLayout, dim: int, start: int, stop: int) -> IntCodes:
        """Every stored tensor has N on dim 1 ([K or G, N] unpacked): rows slice dim 1, columns slice K / G."""
        group, g_idx, g0, g1 = lay.group, lay.g_idx, 0, lay.groups
        if dim == 1 and g_idx is not None:
            g_idx = g_idx[start:stop]
        elif dim == 1 and lay.group >= lay.k:  # per channel: any K range keeps the row's one scale
            group = stop - start
        elif dim == 1:
            if start % group or (stop % group and stop != lay.k):
                raise ValueError(f"columns [{start}:{stop}] cut groups of {group}")
            g0, g1 = start // group, -(-stop // group)
        k_part, g_part = ((1, start, stop), (1, start, stop)) if dim == 0 else ((0, start, stop), (0, g0, g1))
        gptq, bits, p = self.scheme.method == "gptq", self.scheme.bits, lay.prefix
        order = None if gptq else AWQ_ORDER
        codes = self._codes(f"{p}.qweight", 0 if gptq else 1, order, k_part)
        zeros = self._codes(f"{p}.qzeros", 1, order, g_part).to(torch.int16) + self.scheme.zero_offset
        if zeros.numel() and int(zeros.max()) > 255:
            raise self._err(f"{p}.qzeros", f"holds a zero point of {int(zeros.max())}, beyond {bits} bits")
        scales = self._part(f"{p}.scales", *g_part)
        return IntCodes(codes.t().contiguous(), scales.t().contiguous(), zeros.t().to(torch.uint8).contiguous(),
                        bits, group, g_idx)

    def _codes(self, name: str, packed_dim: int, order, part: tuple[int, int, int]) -> torch.Tensor:
        """The unpacked codes of ``name`` over ``part`` = (dim, start, stop) in unpacked positions, reading
        only the words that hold them."""
        per = 32 // self.scheme.bits
        dim, start, stop = part
        if dim != packed_dim:
            return _unpack(self._part(name, dim, start, stop), self.scheme.bits, packed_dim, order)
        w0, w1 = start // per, -(-stop // per)
        codes = _unpack(self._part(name, dim, w0, w1), self.scheme.bits, packed_dim, order)
        return codes.narrow(dim, start - w0 * per, stop - start)

    def _fp8(self, lay: _Fp8Layout, dim: int, start: int, stop: int) -> Fp8Weight:
        """The scale is read whole (at most ceil(N/128) x ceil(K/128) or N floats) and sliced by Fp8Weight's own
        rows / cols on a weight without data, so the slice rules are exactly its own."""
        scale = self.inner.get(lay.scale_name).float().reshape(lay.scale_shape)
        shell = Fp8Weight(torch.empty((lay.n, lay.k), dtype=FP8, device="meta"), scale)
        shell = shell.rows(start, stop) if dim == 0 else shell.cols(start, stop)
        return Fp8Weight(self._part(f"{lay.prefix}.weight", dim, start, stop), shell.scale)

    # -- layouts: shapes and dtypes checked on first use (validate_weights reaches them through shape)
    def _prefix(self, name: str) -> str | None:
        p = name.removesuffix(".weight")
        return p if p != name and p in self._linears else None

    def _layout(self, p: str) -> _IntLayout | _Fp8Layout:
        if p not in self._layouts:
            self._layouts[p] = self._int_layout(p) if self._is_int else self._fp8_layout(p)
        return self._layouts[p]

    def _int_layout(self, p: str) -> _IntLayout:
        s, per = self.scheme, 32 // self.scheme.bits
        qw, qz, sc, gi = (f"{p}.{t}" for t in INT_TENSORS)
        gptq = s.method == "gptq"
        qshape = self._expect(qw, None, (torch.int32,), "int32 [K * bits / 32, N]" if gptq else "int32 [K, N / 8]")
        k, n = (qshape[0] * per, qshape[1]) if gptq else (qshape[0], qshape[1] * per)
        group = k if s.group == -1 else s.group
        groups = -(-k // group)
        fits = f"for {qw} (N = {n}, K = {k}{'' if s.group == -1 else f', groups of {group}'})"
        self._expect(sc, (groups, n), (torch.float16, torch.bfloat16, torch.float32), f"[{groups}, {n}] {fits}")
        self._expect(qz, (groups, -(-n // per)), (torch.int32,), f"int32 [{groups}, {-(-n // per)}] {fits}")
        g_idx = None
        if gptq and gi in self.inner:
            g_idx = self.inner.get(gi)
            if g_idx.shape != (k,) or g_idx.is_floating_point():
                raise self._err(gi, f"is {_dt(g_idx.dtype)} {list(g_idx.shape)}; expected int32 [{k}] {fits}")
            if k and not 0 <= int(g_idx.min()) <= int(g_idx.max()) < groups:
                lo, hi = int(g_idx.min()), int(g_idx.max())
                raise self._err(gi, f"holds groups {lo}..{hi} but there are {groups} {fits}")
            g_idx = None if torch.equal(g_idx.long(), torch.arange(k) // group) else g_idx.to(torch.int32)
        elif gptq and s.act_order:
            raise self._err(qw, f"has no {gi} tensor, which desc_act (act-order) needs")
        return _IntLayout(p, n, k, groups, group, g_idx)

    def _fp8_layout(self, p: str) -> _Fp8Layout:
        w = f"{p}.weight"
        if w not in self.inner:
            raise self._missing(w)
        n, k = self._expect(w, None, (FP8,), "float8_e4m3fn [N, K]")
        scale_name = next(f"{p}.{t}" for t in self.scheme.scale_names if f"{p}.{t}" in self.inner)
        kind = self.scheme.fp8_scale
        canonical = {"tensor": (), "channel": (n,), "block": (-(-n // FP8_BLOCK), -(-k // FP8_BLOCK))}[kind]
        stored = tuple(self.inner.shape(scale_name))
        accepted = {"tensor": [(), (1,)], "channel": [(n,), (n, 1)], "block": [canonical]}[kind]
        if stored not in accepted or not self.inner.dtype(scale_name).is_floating_point:
            dtype = _dt(self.inner.dtype(scale_name))
            raise self._err(scale_name, f"is {dtype} {list(stored)}; a per-{kind} scale of "
                            f"{w} [{n}, {k}] is float32 {' or '.join(str(list(a)) for a in accepted)}")
        return _Fp8Layout(p, n, k, scale_name, canonical)

    def _expect(self, name: str, shape, dtypes, what: str) -> tuple[int, ...]:
        if name not in self.inner:
            raise CheckpointError(self.path, f"has no tensor named {name!r} ({what}); the {self.scheme.name} "
                                  "checkpoint is incomplete")
        got, dtype = tuple(self.inner.shape(name)), self.inner.dtype(name)
        if len(got) != 2 or (shape is not None and got != shape) or dtype not in dtypes:
            raise self._err(name, f"is {_dt(dtype)} {list(got)}; expected {what}")
        return got

    # -- helpers
    def _part(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
        if (start, stop) == (0, self.inner.shape(name)[dim]):
            return self.inner.get(name)
        return self.inner.get_slice(name, dim, start, stop)

    def _err(self, name: str, problem: str) -> CheckpointError:
        return CheckpointError(self.inner.file_of(name), f"tensor {name!r} {problem}")

    def _tell_dequantized(self) -> None:
        if not self._told:
            self._told = True
            log.info("%s weights are dequantized to %s (this device has no kernels for them; memory as an "
                     "unquantized model)", self.scheme.name, _dt(self.compute_dtype))
