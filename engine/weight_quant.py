"""Quantized linear weights for the GPU (and, dequantized, anywhere): integer codes with a scale and a zero point per
group of K positions (GPTQ, AWQ, ``--quantization int8 | int4``), and float8 e4m3 weights with a per-tensor,
per-channel or 128 x 128 block scale (FP8 checkpoints, ``--quantization fp8``).

Three forms, one meaning:
- ``IntCodes``: what a checkpoint reader (engine/loader/quantized.py) or the at-load quantizer produces, unpacked
  on the CPU: ``codes`` uint8 [N, K], ``scales`` [N, G], ``zeros`` uint8 [N, G] (the code of 0.0), and GPTQ's
  act-order ``g_idx`` [K] (the group of each K position) or None (position k is in group k // group). The weight is
  ``(codes[n, k] - zeros[n, g]) * scales[n, g]`` with g the group of k. Sliced by rows or columns for tensor
  parallelism, then packed.
- ``IntWeight``: packed for the kernels (``IntCodes.pack``): per chunk of CHUNK (128) K positions, 16 int32 words
  per plane of nibbles (4 bits: the code; 8 bits: its high nibble, then its low), nibble i of word j holding
  position 16 i + j of the chunk; K padded to whole chunks with code
  0. Act-order weights are stored with their K positions sorted by group (``perm``: x is gathered as x[:, perm]
  before the product), so every group is a contiguous run of ``group`` positions. That is the "chunk" layout: the
  CPU's form (dequantized per call; the Triton GPU kernels that read it lost to the tensor-core ones and were
  deleted, issue 46); the "mma" layout (``pack(layout="mma")``, for the CUDA kernels of csrc/cuda/int_gemm.cu, where
  engine._C has them: K and the group multiples of 16) puts the codes in the tensor cores' operand order instead:
  rows in tiles of 16, K in quads of 64 (both padded with code 0), per (tile, quad) 32 lanes x 4 words per plane,
  lane 4 g + t's word j holding rows g and g + 8 at positions 64 quad + 16 t + 4 j + 0..3 (``_MMA_SLOTS``: which
  nibble holds which). Both layouts have the same scales / zeros [N, G] and the same ``codes()`` / ``dequantize()``.
- ``Fp8Weight``: e4m3 values [N, K] and float32 scales: [] (per tensor), [N] (per output channel) or
  [ceil(N / 128), ceil(K / 128)] (blocks of 128 x 128, as DeepSeek / Qwen FP8 releases store them).

``engine.ops.linear`` takes either where it takes a weight tensor (engine/ops/quant_linear.py ``quant_linear``).
The forms live here, in the foundation, because the checkpoint readers (engine/loader/quantized.py) build them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from engine.constants import FP8_BLOCK

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
CHUNK = 128  # K positions per chunk of packed integer codes ("chunk" layout)
MMA_ROWS, MMA_QUAD = 16, 64  # the "mma" layout's row tile and K quad
# "mma" layout: nibble s of a word holds the value at (row offset h, position offset e) of its 2 x 4 block, stored
# as h * 4 + e: s = h + 4 (e & 1) + 2 (e >> 1), so that one mask per shift pairs nibbles s and s + 4 into the two
# halves of one MMA register (csrc/cuda/int_gemm.cu).
_MMA_SLOTS = (0, 4, 2, 6, 1, 5, 3, 7)


def mma_packable(k: int, group: int) -> bool:
    """Whether integer codes of K positions in groups of ``group`` fit the "mma" layout's kernels."""
    return k % 16 == 0 and group % 16 == 0


def _group_index(k: int, group: int, g_idx: torch.Tensor | None, device) -> torch.Tensor:
    return torch.arange(k, device=device) // group if g_idx is None else g_idx.long().to(device)


@dataclass(frozen=True)
class IntCodes:
    codes: torch.Tensor       # uint8 [N, K], each < 2**bits
    scales: torch.Tensor      # float [N, G]
    zeros: torch.Tensor       # uint8 [N, G]: the code of 0.0 (2**(bits-1) for symmetric formats)
    bits: int                 # 4 or 8
    group: int                # K positions per group (K itself: one scale per output channel)
    g_idx: torch.Tensor | None = None  # int [K]: each position's group (GPTQ act-order); None: k // group

    def __post_init__(self):
        n, k = self.codes.shape
        if self.bits not in (4, 8):
            raise ValueError(f"integer weights of {self.bits} bits: only 4 and 8 are supported")
        if self.scales.dim() != 2 or self.scales.shape[0] != n or self.zeros.shape != self.scales.shape:
            raise ValueError(f"scales {tuple(self.scales.shape)} / zeros {tuple(self.zeros.shape)} do not fit codes "
                             f"{tuple(self.codes.shape)}")
        if self.g_idx is None and (self.group <= 0 or -(-k // self.group) != self.scales.shape[1]):
            raise ValueError(f"{self.scales.shape[1]} groups do not fit K = {k} in groups of {self.group}")
        if self.g_idx is not None and self.g_idx.shape != (k,):
            raise ValueError(f"g_idx of shape {tuple(self.g_idx.shape)} does not fit K = {k}")

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        g = _group_index(self.codes.shape[1], self.group, self.g_idx, self.codes.device)
        s = self.scales.float()[:, g]
        z = self.zeros.float()[:, g]
        return ((self.codes.float() - z) * s).to(dtype)

    def rows(self, start: int, stop: int) -> IntCodes:
        return replace(self, codes=self.codes[start:stop], scales=self.scales[start:stop],
                       zeros=self.zeros[start:stop])

    def cols(self, start: int, stop: int) -> IntCodes:
        """K positions [start, stop): without act-order the slice must start and end on group edges."""
        if self.g_idx is not None:
            return replace(self, codes=self.codes[:, start:stop], g_idx=self.g_idx[start:stop])
        k = self.codes.shape[1]
        if self.group >= k:  # one group per output channel: any slice keeps it
            return replace(self, codes=self.codes[:, start:stop], group=stop - start)
        if start % self.group or (stop % self.group and stop != k):
            raise ValueError(f"columns [{start}:{stop}] cut groups of {self.group}")
        g0, g1 = start // self.group, -(-stop // self.group)
        return replace(self, codes=self.codes[:, start:stop], scales=self.scales[:, g0:g1],
                       zeros=self.zeros[:, g0:g1])

    def pack(self, scale_dtype: torch.dtype = torch.float16, layout: str = "chunk") -> IntWeight:
        """The kernels' form in ``layout`` ("chunk" or "mma": the module doc). Act-order: positions sorted by group;
        every group used must then have the same number of positions (true of a whole GPTQ weight; a column slice
        of one may not: ValueError)."""
        if layout not in ("chunk", "mma"):
            raise ValueError(f"unknown integer weight layout {layout!r}")
        n, k = self.codes.shape
        codes, scales, zeros, group, perm = self.codes, self.scales, self.zeros, self.group, None
        g = None if self.g_idx is None else self.g_idx.long().to(codes.device)
        if g is not None and not torch.equal(g, torch.arange(k, device=g.device) // group):  # act-order in effect
            perm = torch.argsort(g, stable=True)
            used, counts = torch.unique_consecutive(g[perm], return_counts=True)
            if not bool((counts == counts[0]).all()):
                raise ValueError("act-order groups of unequal size in this slice; load it dequantized")
            group = int(counts[0])
            codes, scales, zeros = codes[:, perm], scales[:, used], zeros[:, used]
        if k % group:
            raise ValueError(f"K = {k} is not a multiple of the group size {group}")
        if k % 8:
            raise ValueError(f"integer weights need K a multiple of 8, got {k}")
        common = dict(scales=scales.to(scale_dtype).contiguous(), zeros=zeros.to(torch.uint8).contiguous(),
                      bits=self.bits, group=group, k=k, perm=None if perm is None else perm.to(torch.int64).contiguous())
        if layout == "mma":
            if not mma_packable(k, group):
                raise ValueError(f"the mma layout needs K and the group multiples of 16, got K = {k}, group {group}")
            return IntWeight(q=_pack_mma(codes, self.bits), layout="mma", **common)
        padded = torch.zeros(n, -(-k // CHUNK) * CHUNK, dtype=torch.int32, device=codes.device)
        padded[:, :k] = codes
        planes = [padded] if self.bits == 4 else [padded >> 4, padded & 0xF]
        words = []
        for plane in planes:  # [n, chunks, 8 (nibble i), 16 (word j)] -> [n, chunks, 16]
            nib = plane.reshape(n, -1, 8, 16)
            w = torch.zeros(n, nib.shape[1], 16, dtype=torch.int32, device=codes.device)
            for i in range(8):
                w |= nib[:, :, i, :] << (4 * i)
            words.append(w)
        q = torch.stack(words, dim=2).reshape(n, -1)  # per chunk: plane 0's 16 words, then plane 1's
        return IntWeight(q=q.contiguous(), **common)


def _mma_blocks(n: int, k: int) -> tuple[int, int]:
    return -(-n // MMA_ROWS), -(-k // MMA_QUAD)


def _pack_mma(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 codes [N, K] -> int32 [N / 16, K / 64 * 32 * 4 * planes] in the "mma" layout (padded with 0)."""
    n, k = codes.shape
    tiles, quads = _mma_blocks(n, k)
    c = torch.zeros(tiles * MMA_ROWS, quads * MMA_QUAD, dtype=torch.int32, device=codes.device)
    c[:n, :k] = codes
    # n = 16 tile + 8 h + g, k = 64 quad + 16 t + 4 j + e -> [tile, quad, g, t, j, h, e]
    c = c.reshape(tiles, 2, 8, quads, 4, 4, 4).permute(0, 3, 2, 4, 5, 1, 6).reshape(tiles, quads, 32, 4, 8)
    c = c[..., list(_MMA_SLOTS)]  # [..., slot s]
    planes = [c] if bits == 4 else [c >> 4, c & 0xF]
    words = []
    for plane in planes:
        w = torch.zeros(plane.shape[:-1], dtype=torch.int32, device=codes.device)
        for s in range(8):
            w |= plane[..., s] << (4 * s)
        words.append(w)
    q = torch.stack(words, dim=-1)  # [tile, quad, lane, j, plane]
    return q.reshape(tiles, -1).contiguous()


def _unpack_mma(q: torch.Tensor, n: int, k: int, bits: int) -> torch.Tensor:
    """The inverse of _pack_mma: uint8 codes [N, K]."""
    tiles, quads = _mma_blocks(n, k)
    planes = bits // 4
    words = q.reshape(tiles, quads, 32, 4, planes)
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=q.device)
    nib = (words.unsqueeze(-1) >> shifts) & 0xF  # [tile, quad, lane, j, plane, slot]
    c = nib[..., 0, :] if planes == 1 else nib[..., 0, :] * 16 + nib[..., 1, :]
    inverse = [0] * 8
    for s, v in enumerate(_MMA_SLOTS):
        inverse[v] = s
    c = c[..., inverse]  # [tile, quad, lane, j, h * 4 + e]
    c = c.reshape(tiles, quads, 8, 4, 4, 2, 4).permute(0, 5, 2, 1, 3, 4, 6)  # [tile, h, g, quad, t, j, e]
    return c.reshape(tiles * MMA_ROWS, quads * MMA_QUAD)[:n, :k].to(torch.uint8)


@dataclass(frozen=True)
class IntWeight:
    q: torch.Tensor          # int32: "chunk" [N, chunks * 16 * bits // 4]; "mma" [N / 16, K / 64 * 128 * bits // 4]
    scales: torch.Tensor     # float16 / bfloat16 / float32 [N, K // group]
    zeros: torch.Tensor      # uint8 [N, K // group]
    bits: int
    group: int
    k: int
    perm: torch.Tensor | None = None  # int64 [K]: the kernels take x[:, perm]
    layout: str = "chunk"    # "chunk" (the CPU's) or "mma" (the GPU's: csrc/cuda/int_gemm.cu): the module doc

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.scales.shape[0], self.k))

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.scales, self.zeros))

    def to(self, device) -> IntWeight:
        return replace(self, q=self.q.to(device), scales=self.scales.to(device), zeros=self.zeros.to(device),
                       perm=None if self.perm is None else self.perm.to(device))

    @property
    def planes(self) -> int:
        return self.bits // 4

    def codes(self) -> torch.Tensor:
        """uint8 [N, K] in the stored (sorted) order."""
        n = self.scales.shape[0]
        if self.layout == "mma":
            return _unpack_mma(self.q, n, self.k, self.bits)
        shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=self.q.device)
        words = self.q.reshape(n, -1, self.planes, 16)  # [n, chunks, plane, word j]
        nib = (words.unsqueeze(-2) >> shifts[:, None]) & 0xF  # [n, chunks, plane, nibble i, word j]
        c = nib[:, :, 0] if self.planes == 1 else nib[:, :, 0] * 16 + nib[:, :, 1]
        return c.reshape(n, -1)[:, :self.k].to(torch.uint8)

    def as_layout(self, layout: str) -> IntWeight:
        """The same weight packed in ``layout`` (the stored order of K and its ``perm`` kept)."""
        if layout == self.layout:
            return self
        codes = IntCodes(self.codes(), self.scales, self.zeros, self.bits, self.group)
        return replace(codes.pack(self.scales.dtype, layout), perm=self.perm)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[N, K] in the checkpoint's order (torch ops: the reference of the kernels)."""
        w = IntCodes(self.codes(), self.scales, self.zeros, self.bits, self.group).dequantize()
        if self.perm is not None:
            w = torch.empty_like(w).index_copy_(1, self.perm, w)
        return w.to(dtype)


def quantize_int(w: torch.Tensor, bits: int, group: int | None, symmetric: bool) -> IntCodes:
    """Round to nearest, per group of ``group`` K positions (None: per output channel). Symmetric: scale absmax /
    (2**(bits-1) - 1), zero code 2**(bits-1); asymmetric: the group's [min, max] (widened to hold 0) onto
    [0, 2**bits - 1]. Scales are rounded to float16 first, so the codes fit the stored scale. (A per-group search
    of a clipped range with the least squared weight error, as llama.cpp and AWQ do, made SmolLM2's int4
    perplexity worse, +42% against +36%: its outliers matter more than the steps.)"""
    n, k = w.shape
    group = k if group is None else group
    if k % group:
        raise ValueError(f"K = {k} is not a multiple of the group size {group}")
    g = w.detach().float().reshape(n, k // group, group)
    top = 2 ** bits - 1
    if symmetric:
        half = 2 ** (bits - 1)
        scales = (g.abs().amax(-1) / (half - 1)).half().float()
        zeros = torch.full_like(scales, half)
    else:
        lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)
        scales = ((hi - lo) / top).half().float()
        zeros = torch.where(scales > 0, torch.round(-lo / scales), torch.zeros_like(scales)).clamp(0, top)
    codes = _round(g, scales, zeros, bits)
    return IntCodes(codes.reshape(n, k).to(torch.uint8), scales.half(), zeros.to(torch.uint8), bits, group)


def _round(g: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int) -> torch.Tensor:
    """The codes of groups g [n, G, group] at these scales / zero codes [n, G] (a zero scale: every code at the
    zero point)."""
    inv = torch.where(scales > 0, 1.0 / scales, torch.zeros_like(scales)).unsqueeze(-1)
    codes = (torch.round(g * inv) + zeros.unsqueeze(-1)).clamp_(0, 2 ** bits - 1)
    return torch.where(scales.unsqueeze(-1) > 0, codes, zeros.unsqueeze(-1))


@dataclass(frozen=True)
class Fp8Weight:
    w: torch.Tensor       # float8_e4m3fn [N, K]
    scale: torch.Tensor   # float32: [] per tensor, [N] per channel, [ceil(N/128), ceil(K/128)] per block

    def __post_init__(self):
        n, k = self.w.shape
        ok = {(): True, (n,): True, (-(-n // FP8_BLOCK), -(-k // FP8_BLOCK)): True}
        if tuple(self.scale.shape) not in ok:
            raise ValueError(f"fp8 scale of shape {tuple(self.scale.shape)} fits neither a tensor, its {n} rows "
                             f"nor its {FP8_BLOCK} x {FP8_BLOCK} blocks")

    @property
    def kind(self) -> str:
        return {0: "tensor", 1: "channel", 2: "block"}[self.scale.dim()]

    @property
    def shape(self) -> torch.Size:
        return self.w.shape

    @property
    def device(self) -> torch.device:
        return self.w.device

    @property
    def nbytes(self) -> int:
        return self.w.numel() + 4 * self.scale.numel()

    def to(self, device) -> Fp8Weight:
        return Fp8Weight(self.w.to(device), self.scale.to(device))

    def row_scales(self) -> torch.Tensor:
        """float32 [N]: the scale of each output channel (per tensor: repeated). Not for block scales."""
        if self.kind == "block":
            raise ValueError("block-scaled fp8 weights have no scale per channel")
        return self.scale.float().expand(self.w.shape[0]).contiguous() if self.kind == "tensor" else self.scale

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        w = self.w.float()
        if self.kind == "block":
            n, k = w.shape
            s = self.scale.float().repeat_interleave(FP8_BLOCK, 0)[:n].repeat_interleave(FP8_BLOCK, 1)[:, :k]
        elif self.kind == "channel":
            s = self.scale.float()[:, None]
        else:
            s = self.scale.float()
        return (w * s).to(dtype)

    def rows(self, start: int, stop: int) -> Fp8Weight:
        if self.kind == "tensor":
            return Fp8Weight(self.w[start:stop], self.scale)
        if self.kind == "channel":
            return Fp8Weight(self.w[start:stop], self.scale[start:stop])
        _check_block_edges(start, stop, self.w.shape[0], "rows")
        return Fp8Weight(self.w[start:stop], self.scale[start // FP8_BLOCK:-(-stop // FP8_BLOCK)])

    def cols(self, start: int, stop: int) -> Fp8Weight:
        if self.kind != "block":
            return Fp8Weight(self.w[:, start:stop], self.scale)
        _check_block_edges(start, stop, self.w.shape[1], "columns")
        return Fp8Weight(self.w[:, start:stop], self.scale[:, start // FP8_BLOCK:-(-stop // FP8_BLOCK)])

    @classmethod
    def quantize(cls, w: torch.Tensor, per: str = "channel") -> Fp8Weight:
        """absmax / 448 per output channel (or per tensor), rounded to e4m3 (torch's cast: to nearest, even)."""
        wf = w.detach().float()
        amax = wf.abs().amax(dim=1) if per == "channel" else wf.abs().amax()
        scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        q = (wf / (scale[:, None] if per == "channel" else scale)).clamp_(-FP8_MAX, FP8_MAX).to(FP8)
        return cls(q.contiguous(), scale.float())


def _check_block_edges(start: int, stop: int, size: int, what: str) -> None:
    if start % FP8_BLOCK or (stop % FP8_BLOCK and stop != size):
        raise ValueError(f"{what} [{start}:{stop}] cut the fp8 weight's {FP8_BLOCK} x {FP8_BLOCK} scale blocks")


def concat_rows(parts: list[IntCodes | Fp8Weight]) -> IntCodes | Fp8Weight:
    """Row blocks stacked in order (q/k/v into one qkv weight, gate/up): one format, group and K for all."""
    first = parts[0]
    if len(parts) == 1:
        return first
    if isinstance(first, Fp8Weight):
        if any(not isinstance(p, Fp8Weight) or p.kind != first.kind for p in parts):
            raise ValueError("fused fp8 parts with different scale kinds")
        w = torch.cat([p.w for p in parts])
        if first.kind == "channel":
            return Fp8Weight(w, torch.cat([p.scale for p in parts]))
        if first.kind == "block":
            if any(p.w.shape[0] % FP8_BLOCK for p in parts[:-1]):
                raise ValueError("fused fp8 parts whose rows cut the scale blocks")
            return Fp8Weight(w, torch.cat([p.scale for p in parts]))
        # per tensor, different scales: per channel with each part's scale repeated (no precision lost)
        return Fp8Weight(w, torch.cat([p.scale.float().expand(p.w.shape[0]) for p in parts]))
    if any(not isinstance(p, IntCodes) or (p.bits, p.group, p.codes.shape[1]) != (first.bits, first.group,
                                                                                    first.codes.shape[1])
           for p in parts):
        raise ValueError("fused integer parts with different bits, groups or K")
    if first.g_idx is not None and any(p.g_idx is None or not torch.equal(p.g_idx, first.g_idx) for p in parts):
        raise ValueError("fused act-order parts with different g_idx")
    return replace(first, codes=torch.cat([p.codes for p in parts]), scales=torch.cat([p.scales for p in parts]),
                   zeros=torch.cat([p.zeros for p in parts]))


QuantWeight = IntWeight | Fp8Weight
