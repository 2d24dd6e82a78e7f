"""Attention over the paged KV cache, and the step's attention metadata.

A step's tokens are laid out decodes first (one query token each), then prefill chunks. Every sequence of the
step is a ``SeqSpan``: its query tokens attend to the sequence's cached prefix plus themselves with a
lower-right causal mask (chunked prefill and prefix-cache hits look the same here).

The cache write comes first, with the rotary embedding in one CUDA kernel (``RotaryEmbedding.with_cache``,
ops.rotary_and_cache) when the caller passes its rotary.

Backends: one per model, chosen at start-up by the runner (``select_backend``: KernelConfig.prefill_attention,
engine/kernel_config.py, on the model's device) and bound to every layer; its metadata builder
(``AttentionBackend.build``) decides each step's route once, from the step's shape, and every layer takes it.
``CudaAutoBackend`` (auto, CUDA with Triton) takes the routes below; ``TritonBackend`` (triton) the Triton kernel for
every step with a prefill (on the CPU in Triton's interpreter: tests); ``SdpaBackend`` (sdpa, the CPU, no Triton)
the CPU's routes on any device. The routes:
- CUDA, decodes only: the split-K paged decode kernel (csrc/cuda).
- CUDA, fresh prompts of one length (nothing cached, no decode; one prompt alone is the common case): SDPA's flash
  backend over them as a batch, on views of the step's own K/V (4-D inputs, ``enable_gqa``), which measured faster
  than the Triton kernel there (kestrel bench gpu, H200, 8B shape: 8,192-token TTFT 220 ms against 240; per layer
  0.95 against 1.25 ms at 1 x 8,192 and 0.44 against 0.75 ms at 64 x 512; torch's FlashAttention-2 varlen entry
  point was slower than both, its cuDNN varlen path 100x slower).
- CUDA, one chunk of more than 512 tokens over a cached prefix (chat turns, prefix-cache hits, chunked prefill):
  cuDNN (SDPA's private entry point, with the log-sum-exp) over the chunk's own keys, then the Triton kernel over
  the prefix in the paged cache, merging cuDNN's result in by log-sum-exp (``_chunk_over_prefix``; on the H200 6-8%
  faster than the one launch at 2,048-4,096-token chunks; a specialisation that does not compile falls back).
- CUDA, any other step with a prefill: one launch of the Triton varlen kernel (engine/ops/varlen_attention.py) for the
  step's prefill chunks, reading their prefixes from the paged cache through the block table (no gathered copy, GQA
  by indexing), and the paged decode kernel for its decodes (alone in a varlen query tile, a decode row wasted the
  tile: mixed steps of 1,024 x (512, 256) took ~1 s).
- CPU: the native paged decode kernel for decodes and SDPA (4-D, ``enable_gqa``) per prefill chunk (fresh prompts
  of one length as one batch); a chunk with a cached prefix gathers it from the cache first.

fp8 KV cache (--kv-cache-dtype fp8, GPU): the caches hold e4m3 values with a float32 scale per layer for keys and
for values (``k_scale`` / ``v_scale``, device tensors: nothing synchronises, CUDA graphs capture them), set by the
first step with a prefill after the caches are allocated, before its cache write: that step's largest |key| and
|value| of the layer over FP8_SCALE_TARGET (half e4m3's 448: room for later, larger values and for the rotation of
the keys after their measurement), on the device. Scales of 1.0 left small values in e4m3's subnormals: SmolLM2's
perplexity +1.50% against +0.41% with these (tests/engine/test_fp8_kv_perplexity.py). Every path
above reads it: the cache write and the decode kernel (csrc/cuda, an fp8 instance of each), the Triton kernel (fp8
tiles converted after their load; TMA off), the cuDNN chunk over a prefix (cuDNN on the chunk's own bf16 keys, the
Triton kernel over the fp8 prefix) and SDPA (fresh prompts on the step's own keys; a cached prefix gathered and
dequantized first).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F

from engine import ops
from engine.ops.transfer import to_device

if TYPE_CHECKING:
    from engine.layers.rotary import RotaryEmbedding

log = logging.getLogger(__name__)


class SeqSpan(NamedTuple):
    """One sequence of the step, host side (a named tuple: a busy step builds ~1,000, at half a frozen
    dataclass's cost each)."""

    query_start: int  # offset of its query tokens in the step's token layout
    query_len: int
    context_len: int  # tokens in the cache after this step's write (prefix + query)
    block_ids: tuple[int, ...]  # the blocks holding the first context_len tokens

    @property
    def end(self) -> int:
        return self.query_start + self.query_len


@dataclass
class AttentionMetadata:
    """What every attention layer of one step reads. Built once per step by ``build``."""

    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64
    num_decode_tokens: int  # the first seqs, one query token each
    seqs: list[SeqSpan]  # decodes, then prefill chunks
    block_tables: torch.Tensor | None  # [S, M] int32, row i = seqs[i].block_ids zero-padded
    seq_lens: torch.Tensor | None  # [S] int32, the context lengths
    query_start_loc: torch.Tensor | None  # [S + 1] int32, cumulative query lengths
    plans: dict = field(default_factory=dict)  # per-step kernel plans by head size, built by the first layer
    decode_block_tables: torch.Tensor | None = None  # [num_decode, M] view of block_tables
    decode_context_lens: torch.Tensor | None = None  # [num_decode] view of seq_lens
    fresh_len: int = 0  # every sequence a whole new prompt of this many tokens (no decode, no cached prefix); else 0
    decode_part_tokens: int = 0  # CUDA graphs: -(the decode kernel's partitions per context) (0: sized per step)
    route: str | None = None  # the kernels this step takes (AttentionBackend.route; None: the first layer decides)

    @classmethod
    def build(cls, seqs: list[SeqSpan], block_size: int, device: torch.device) -> AttentionMetadata:
        """Device tensors of one step from its sequences: one int32 transfer (block tables, context lengths,
        query starts), then every token's position and cache slot computed on the device from them
        (ops.token_positions_and_slots), not built as host lists."""
        if not seqs:
            raise ValueError("attention metadata: a step needs at least one sequence")
        meta = cls._describe(seqs, device)
        meta.positions, meta.slot_mapping = ops.token_positions_and_slots(
            meta.query_start_loc, meta.seq_lens, meta.block_tables, block_size, meta.seqs[-1].end,
            max(s.query_len for s in seqs))
        return meta

    @classmethod
    def _with_seqs(cls, positions: torch.Tensor, slot_mapping: torch.Tensor, seqs: list[SeqSpan]
                   ) -> AttentionMetadata:
        """The metadata of tokens whose positions and slots are already on the device."""
        T = positions.shape[0]
        if seqs and seqs[-1].end != T:
            raise ValueError("attention metadata: positions, slots and sequences disagree")
        meta = cls._describe(seqs, positions.device)
        meta.positions, meta.slot_mapping = positions, slot_mapping
        return meta

    @classmethod
    def _describe(cls, seqs: list[SeqSpan], device: torch.device) -> AttentionMetadata:
        """Everything but the positions and slots: the decode count, the packed int32 tensors, fresh_len."""
        num_decode = 0
        for s in seqs:
            if s.query_len != 1 or num_decode != s.query_start:
                break
            num_decode += 1
        empty = torch.empty(0, dtype=torch.long, device=device)
        meta = cls(positions=empty, slot_mapping=empty, num_decode_tokens=num_decode, seqs=list(seqs),
                   block_tables=None, seq_lens=None, query_start_loc=None)
        if seqs:
            S = len(seqs)
            width = max(1, max(len(s.block_ids) for s in seqs))
            ints: list[int] = []
            for s in seqs:
                ints.extend(s.block_ids)
                ints.extend([0] * (width - len(s.block_ids)))
            ints.extend(s.context_len for s in seqs)
            ints.extend(s.query_start for s in seqs)
            ints.append(seqs[-1].end)
            packed = to_device(ints, torch.int32, device)
            meta.block_tables = packed[:S * width].view(S, width)
            meta.seq_lens = packed[S * width:S * width + S]
            meta.query_start_loc = packed[S * width + S:]
            if num_decode:
                meta.decode_block_tables = meta.block_tables[:num_decode]
                meta.decode_context_lens = meta.seq_lens[:num_decode]
        if seqs and num_decode == 0 and all(s.context_len == s.query_len == seqs[0].query_len for s in seqs):
            meta.fresh_len = seqs[0].query_len
        return meta

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]

    @property
    def prefills(self) -> list[SeqSpan]:
        return self.seqs[self.num_decode_tokens:]

    def split(self, cut: int) -> tuple[AttentionMetadata, AttentionMetadata]:
        """The metadata of tokens [0, cut) and [cut, T), each in the engine's layout (micro-batch overlap).
        A prefill chunk that straddles the cut becomes two chunks: the second attends to the first's keys
        and values, which the first micro-batch wrote into the cache in the same layer just before."""
        T = self.num_tokens
        a: list[SeqSpan] = []
        b: list[SeqSpan] = []
        for s in self.seqs:
            q0, n, ctx = s.query_start, s.query_len, s.context_len
            if q0 + n <= cut:
                a.append(s)
            elif q0 >= cut:
                b.append(s._replace(query_start=q0 - cut))
            else:
                na = cut - q0
                a.append(s._replace(query_len=na, context_len=ctx - (n - na)))
                b.append(s._replace(query_start=0, query_len=n - na))
        # the device positions and slots are sliced, not read back (no host synchronisation)
        return (self._with_seqs(self.positions[:cut], self.slot_mapping[:cut], a),
                self._with_seqs(self.positions[cut:T], self.slot_mapping[cut:T], b))


class Attention(torch.nn.Module):
    cache_tensors = 2  # keys and values (engine/layers/mla.py's latent cache: 1)

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, layer_index: int):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim ** -0.5
        self.layer_index = layer_index
        self.k_cache: torch.Tensor | None = None  # [num_blocks, block_size, n_kv, head_dim], bound by the runner
        self.v_cache: torch.Tensor | None = None
        # fp8 caches: their float32 scales ([1], on the caches' device; the values stored are x / scale), bound by
        # the runner with the caches; None for caches in the model's dtype
        self.k_scale: torch.Tensor | None = None
        self.v_scale: torch.Tensor | None = None
        self.compute_dtype: torch.dtype | None = None  # q's dtype (the model's), where the caches' differs
        self.calibrate_scales = False  # fp8: the next step with a prefill sets k_scale / v_scale (runner sets it)
        self.tma_memo: dict = {}  # the caches' TMA descriptors for the prefill kernel (ops.tma_descriptors)
        self.backend: AttentionBackend | None = None  # the model's, bound by the runner at start-up

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata,
                rotary: RotaryEmbedding | None = None) -> torch.Tensor:
        """q [T, nh*hd], k and v [T, nkv*hd] (row-strided views are fine); returns [T, nh*hd]. With ``rotary``,
        q and k are rotated (in place) at the step's positions first, together with the cache write; then the
        model's backend computes the attention by the step's route."""
        T = q.shape[0]
        hd = self.head_dim
        ks, vs = self.k_scale, self.v_scale
        if self.calibrate_scales and meta.num_decode_tokens < T and not _capturing(q):
            self._calibrate_scales(k, v)
        if rotary is not None:
            rotary.with_cache(meta.positions, q, k, v, self.k_cache, self.v_cache, meta.slot_mapping, ks, vs)
        else:
            ops.reshape_and_cache(k.view(T, self.num_kv_heads, hd), v.view(T, self.num_kv_heads, hd),
                                  self.k_cache, self.v_cache, meta.slot_mapping, ks, vs)
        backend = self.backend
        if backend is None:  # a layer used alone (tests): its device's automatic choice, taken once
            backend = self.backend = select_backend("auto", q.device, hd)
        if meta.route is None:  # metadata built without a backend (a micro-batch half, the decode graphs, tests)
            meta.route = backend.route(meta)
        return backend.forward(self, q.view(T, self.num_heads, hd), k, v, meta)

    def _calibrate_scales(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """An fp8 cache's scales from this step's keys and values (before their write): amax / FP8_SCALE_TARGET,
        computed and stored on the device (no host synchronisation), once per allocation of the caches."""
        for x, scale in ((k, self.k_scale), (v, self.v_scale)):
            amax = x.abs().amax().float().reshape(1)
            scale.copy_(torch.clamp(amax / FP8_SCALE_TARGET, min=FP8_SCALE_MIN))
        self.calibrate_scales = False

    def _chunk_over_prefix(self, q3: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
                           ) -> torch.Tensor | None:
        """One long chunk over a cached prefix: cuDNN over the chunk's own keys (causal, with the log-sum-exp),
        then the Triton kernel over the prefix in the paged cache (no copy of it), merging that state in. None
        where cuDNN cannot run it or the kernel does not compile (the caller takes the one-launch kernel)."""
        T, hd = q3.shape[0], self.head_dim
        cfg, plan = _varlen_plan(meta, q3.device, hd)
        key = (q3.device, q3.dtype, self.k_cache.dtype, hd, cfg)
        compiled = _RESUME_COMPILES.get(key)
        if compiled is False:
            return None
        got = ops.chunk_self_attention(q3, k.view(T, self.num_kv_heads, hd), v.view(T, self.num_kv_heads, hd),
                                       self.scale)
        if got is None:
            return None
        out, lse = got
        try:
            ops.varlen_paged_attention(q3, self.k_cache, self.v_cache, meta.block_tables, meta.seq_lens,
                                       meta.query_start_loc, plan, self.scale, out=out, config=cfg, lse=lse,
                                       tma_memo=self.tma_memo, k_scale=self.k_scale, v_scale=self.v_scale)
        except Exception as e:  # the first launch compiles this specialisation: Triton 3.6's ptxas dies on some
            if compiled:
                raise
            _RESUME_COMPILES[key] = False
            log.warning("The merging attention kernel did not compile here (%s: %s); chunks over a cached prefix "
                        "take the one-launch Triton kernel.", type(e).__name__, str(e).splitlines()[0][:200])
            return None
        _RESUME_COMPILES[key] = True
        return out.reshape(T, self.num_heads * hd)

    def warm_up_kernels(self) -> list[str]:
        """Build now (compile, or read from Triton's disk cache) the Triton variants of the prefill attention this
        layer's steps take on CUDA: short tiles (steps with decodes or short chunks), long tiles, and the merge
        of a long chunk over a cached prefix. Each runs once on a one-token layout of the layer's own caches (their
        size and block size are compile-time constants of the kernel); every layer shares the variants, so start-up
        calls this on one. Without it the first such step of a serving run waited for a compile (1.25 s on the
        H200, kestrel bench gpu 2026-12-04). Returns the variants run; none off CUDA or without the kernel."""
        kc = self.k_cache
        if (kc is None or not kc.is_cuda or not ops.varlen_attention_available()
                or (self.backend is not None and not self.backend.uses_varlen)):
            return []
        return self._run_kernel_variants()

    def _run_kernel_variants(self) -> list[str]:
        """warm_up_kernels' launches (on the CPU under Triton's interpreter in tests)."""
        kc, vc = self.k_cache, self.v_cache
        ks, vs = self.k_scale, self.v_scale
        dev, hd, nh, nkv = kc.device, self.head_dim, self.num_heads, self.num_kv_heads
        dt = self.compute_dtype or kc.dtype
        # q as the step's q: a view of the fused qkv projection's rows
        q3 = torch.zeros(1, (nh + 2 * nkv) * hd, dtype=dt, device=dev)[:, :nh * hd].view(1, nh, hd)
        tables = torch.zeros(1, 1, dtype=torch.int32, device=dev)
        starts = torch.tensor([0, 1], dtype=torch.int32, device=dev)
        ran = []
        configs = {ops.varlen_config(dev, hd, short=True): "short tiles", ops.varlen_config(dev, hd): "long tiles"}
        for cfg, what in configs.items():
            plan = ops.VarlenPlan.build([1], [1], cfg.block_m, dev)
            ops.varlen_paged_attention(q3, kc, vc, tables, starts[1:], starts, plan, self.scale, config=cfg,
                                       tma_memo=self.tma_memo, k_scale=ks, v_scale=vs)
            ran.append(what)
        cfg = ops.varlen_config(dev, hd)
        key = (dev, dt, kc.dtype, hd, cfg)
        if hd in RESUME_HEAD_DIMS and key not in _RESUME_COMPILES:  # one token over a cached one
            plan = ops.VarlenPlan.build([1], [2], cfg.block_m, dev)
            out = torch.zeros(1, nh, hd, dtype=dt, device=dev)
            lse = torch.zeros(nh, 1, dtype=torch.float32, device=dev).t()  # head-major, as cuDNN lays it out
            try:
                ops.varlen_paged_attention(q3, kc, vc, tables, starts[1:] + 1, starts, plan, self.scale, out=out,
                                           config=cfg, lse=lse, tma_memo=self.tma_memo, k_scale=ks, v_scale=vs)
                _RESUME_COMPILES[key] = True
                ran.append("merge over a cached prefix")
            except Exception as e:  # as in _chunk_over_prefix: those chunks take the one-launch kernel
                _RESUME_COMPILES[key] = False
                log.warning("The merging attention kernel did not compile here (%s: %s); chunks over a cached "
                            "prefix take the one-launch Triton kernel.", type(e).__name__,
                            str(e).splitlines()[0][:200])
        return ran

    def _fresh_sdpa(self, q3: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int) -> torch.Tensor:
        """Causal attention of T / n fresh prompts of n tokens each, over the step's own keys and values: views
        [S, heads, n, hd] of the token-major tensors (no copy in, and the output is token-major again)."""
        T, hd = q3.shape[0], self.head_dim
        S = T // n
        qs = q3.view(S, n, self.num_heads, hd).transpose(1, 2)
        ks = k.view(S, n, self.num_kv_heads, hd).transpose(1, 2)
        vs = v.view(S, n, self.num_kv_heads, hd).transpose(1, 2)
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=self.scale,
                                           enable_gqa=self.num_kv_heads != self.num_heads)
        return o.transpose(1, 2).reshape(T, self.num_heads * hd)

    def _prefill_sdpa(self, qs: torch.Tensor, k, v, meta: AttentionMetadata, i: int, seg: SeqSpan) -> torch.Tensor:
        hd, s, n = self.head_dim, seg.query_start, seg.query_len
        if seg.context_len == n:  # nothing cached before this chunk: the fresh K/V directly
            ks = k[s:s + n].reshape(n, self.num_kv_heads, hd)
            vs = v[s:s + n].reshape(n, self.num_kv_heads, hd)
        else:  # gather the prefix from the paged cache
            blocks = meta.block_tables[i, :len(seg.block_ids)]
            ks = self.k_cache[blocks].flatten(0, 1)[: seg.context_len]
            vs = self.v_cache[blocks].flatten(0, 1)[: seg.context_len]
            if self.k_scale is not None:  # an fp8 cache: dequantized to q's dtype (value x scale)
                ks = (ks.float() * self.k_scale).to(qs.dtype)
                vs = (vs.float() * self.v_scale).to(qs.dtype)
        # 4-D inputs and enable_gqa: the shapes SDPA's fused backends take (3-D inputs run the math backend)
        qs, ks, vs = (t.transpose(0, 1).unsqueeze(0) for t in (qs, ks, vs))  # [1, heads, len, hd]
        gqa = self.num_kv_heads != self.num_heads
        if seg.context_len == n:
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=self.scale, enable_gqa=gqa)
        else:
            offset = seg.context_len - n
            qpos = torch.arange(n, device=qs.device).unsqueeze(1) + offset
            mask = torch.arange(seg.context_len, device=qs.device).unsqueeze(0) <= qpos
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=self.scale, enable_gqa=gqa)
        return o[0].transpose(0, 1)


# fp8 caches: a layer's scale maps the largest |key| (|value|) of its first prefill step to this (e4m3's largest finite
# value is 448); and the smallest scale (a layer whose first keys are all zero).
FP8_SCALE_TARGET = 224.0
FP8_SCALE_MIN = 1e-6


def _capturing(q: torch.Tensor) -> bool:
    return q.is_cuda and torch.cuda.is_current_stream_capturing()


# (device, q's dtype, the caches' dtype, head size, KernelConfig) -> whether the merging kernel compiled there (its
# first launch compiles it; a failure sends those chunks to the one-launch kernel for the process's life).
_RESUME_COMPILES: dict[tuple, bool] = {}

# Query tokens from which one chunk over a cached prefix takes cuDNN for its own keys (``_resumes``): past the
# short chunks, whose own keys are a small part of the work (an extra launch per layer is not worth it there).
RESUME_MIN_QUERY = ops.VARLEN_SHORT_QUERY + 1

# Head sizes the merging kernel runs at: on the H200 (Triton 3.6) its TMA specialisation compiled at 128 and made
# ptxas die with SIGSEGV at 64, where chunks keep the one launch.
RESUME_HEAD_DIMS = (128,)


def _varlen_plan(meta: AttentionMetadata, device: torch.device, head_dim: int
                 ) -> tuple[ops.VarlenKernelConfig, ops.VarlenPlan]:
    """The kernel configuration for this device and step (smaller tiles for short chunks) and the step's query
    tiles of its prefill chunks (the decodes take the decode kernel): built by the first layer, reused."""
    found = meta.plans.get(head_dim)
    if found is None:
        nd = meta.num_decode_tokens
        query_lens = [0] * nd + [s.query_len for s in meta.seqs[nd:]]  # no tiles for the decodes
        short = max(query_lens) <= ops.VARLEN_SHORT_QUERY
        cfg = ops.varlen_config(device, head_dim, short=short)
        plan = ops.VarlenPlan.build(query_lens, [s.context_len for s in meta.seqs], cfg.block_m, device)
        found = meta.plans[head_dim] = (cfg, plan)
    return found


# -- backends ------------------------------------------------------------------------------------------------------
# A step's route: the kernels its attention takes (AttentionBackend.route, decided once per step).
DECODE = "decode"  # the paged decode kernel on the decodes (every row of a decode-only step), SDPA per prefill chunk
FRESH = "fresh"  # fresh prompts of one length: SDPA over them as one batch, on the step's own keys and values
ONE_CHUNK = "one chunk"  # one prefill chunk alone: SDPA (over its prefix gathered from the cache)
VARLEN = "varlen"  # the Triton varlen kernel on the prefill chunks, the paged decode kernel on the decodes
RESUME = "resume"  # one long chunk over a cached prefix: cuDNN on its own keys, the Triton kernel over the prefix


class AttentionBackend:
    """The attention of one model: chosen once at start-up (``select_backend``, the runner: KernelConfig's
    prefill_attention and the device), bound to every attention layer. Its metadata builder (``build``) runs once
    per step and decides there the step's route (``route``, from the step's shape); every layer then calls
    ``forward`` after its cache write. The backends differ only in the routes they take."""

    name = ""
    uses_varlen = False  # takes the Triton varlen kernel (start-up builds its variants: Attention.warm_up_kernels)

    def __init__(self, head_dim: int):
        self.head_dim = head_dim

    def build(self, seqs: list[SeqSpan], block_size: int, device: torch.device) -> AttentionMetadata:
        """The step's metadata (AttentionMetadata.build), its route, and the varlen kernel's plan where it runs."""
        meta = AttentionMetadata.build(seqs, block_size, device)
        meta.route = self.route(meta)
        if meta.route in (VARLEN, RESUME):
            _varlen_plan(meta, device, self.head_dim)
        return meta

    def route(self, meta: AttentionMetadata) -> str:
        raise NotImplementedError

    def forward(self, layer: Attention, q3: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMetadata
                ) -> torch.Tensor:
        """The layer's attention of the step (its keys and values already in the cache): [T, nh*hd]."""
        T, nh, hd = q3.shape
        nd = meta.num_decode_tokens
        route = meta.route
        if route == RESUME:
            out = layer._chunk_over_prefix(q3, k, v, meta)
            if out is not None:
                return out
            route = VARLEN  # cuDNN cannot run it or the merging kernel does not compile
        if route == VARLEN:
            # the decodes on the paged decode kernel (a decode row alone in a varlen tile wastes the tile), the
            # prefill chunks on the varlen kernel, into one output
            cfg, plan = _varlen_plan(meta, q3.device, hd)
            out = None
            if nd:
                out = torch.empty(T, nh, hd, dtype=q3.dtype, device=q3.device)
                ops.paged_decode_attention(q3[:nd], layer.k_cache, layer.v_cache, meta.decode_block_tables,
                                           meta.decode_context_lens, layer.scale, out=out[:nd], k_scale=layer.k_scale,
                                           v_scale=layer.v_scale)
            out = ops.varlen_paged_attention(q3, layer.k_cache, layer.v_cache, meta.block_tables, meta.seq_lens,
                                             meta.query_start_loc, plan, layer.scale, out=out, config=cfg,
                                             tma_memo=layer.tma_memo, k_scale=layer.k_scale, v_scale=layer.v_scale)
            return out.view(T, nh * hd)
        if route == FRESH:
            return layer._fresh_sdpa(q3, k, v, meta.fresh_len)
        if route == ONE_CHUNK:  # SDPA's output (token-major) is the layer's
            return layer._prefill_sdpa(q3, k, v, meta, 0, meta.seqs[0]).reshape(T, nh * hd)
        out = torch.empty(T, nh, hd, dtype=q3.dtype, device=q3.device)
        if nd:
            ops.paged_decode_attention(q3[:nd], layer.k_cache, layer.v_cache, meta.decode_block_tables,
                                       meta.decode_context_lens, layer.scale, out=out[:nd],
                                       part_tokens=meta.decode_part_tokens, k_scale=layer.k_scale,
                                       v_scale=layer.v_scale)
        for i, seg in enumerate(meta.prefills, start=nd):
            s, n = seg.query_start, seg.query_len
            out[s:s + n] = layer._prefill_sdpa(q3[s:s + n], k, v, meta, i, seg)
        return out.view(T, nh * hd)


class SdpaBackend(AttentionBackend):
    """``prefill_attention=sdpa``, the CPU's, and a GPU's without Triton: the paged decode kernel for the decodes,
    torch SDPA for the prefill chunks (fresh prompts of one length as one batch; a chunk over a cached prefix
    gathers it from the cache first)."""

    name = "sdpa"

    def route(self, meta: AttentionMetadata) -> str:
        if meta.fresh_len:
            return FRESH
        return ONE_CHUNK if meta.num_decode_tokens == 0 and len(meta.seqs) == 1 else DECODE


class TritonBackend(AttentionBackend):
    """``prefill_attention=triton``: the Triton varlen kernel for every step with a prefill (the CPU runs it in
    Triton's interpreter: tests), the paged decode kernel for the decodes."""

    name = "triton"
    uses_varlen = True

    def route(self, meta: AttentionMetadata) -> str:
        return VARLEN if meta.num_decode_tokens < meta.num_tokens else DECODE


class CudaAutoBackend(TritonBackend):
    """``prefill_attention=auto`` on a GPU with Triton (the measured routes of the module's docstring): SDPA's
    flash backend for fresh prompts of one length, cuDNN + the merging Triton kernel for one long chunk over a
    cached prefix at the head sizes it compiles at, the Triton varlen kernel for any other step with a prefill."""

    name = "auto"

    def route(self, meta: AttentionMetadata) -> str:
        if meta.num_decode_tokens == 0 and len(meta.seqs) == 1 and self.head_dim in RESUME_HEAD_DIMS:
            seg = meta.seqs[0]
            if seg.context_len > seg.query_len and seg.query_len >= RESUME_MIN_QUERY:
                return RESUME
        if meta.fresh_len:
            return FRESH
        return super().route(meta)


def select_backend(prefill_attention: str, device: torch.device, head_dim: int) -> AttentionBackend:
    """The backend of a model: KernelConfig.prefill_attention (auto, triton or sdpa) on this device. Without the
    Triton kernel every choice is SDPA; auto takes the Triton kernel on CUDA only."""
    if prefill_attention == "sdpa" or not ops.varlen_attention_available():
        return SdpaBackend(head_dim)
    if prefill_attention == "triton":
        return TritonBackend(head_dim)
    if prefill_attention != "auto":
        raise ValueError(f"prefill_attention must be auto, triton or sdpa, got {prefill_attention!r}")
    return CudaAutoBackend(head_dim) if torch.device(device).type == "cuda" else SdpaBackend(head_dim)
