"""CUDA graphs for decode steps.

A decode step of an 8B model launches ~400 kernels of a few microseconds each; eagerly, the Python that launches
them (op wrappers, argument checks, pybind11) takes longer than the GPU needs to run them, so the GPU waits on the
host. A graph replays the whole forward (embedding, every layer, final norm, LM head) with one launch.

A graph bakes in the addresses and shapes of everything it touches, so:

- one graph per batch-size bucket (1, 2, 4, 8, then every 8 up to the largest), captured largest first into one
  memory pool (each capture reuses the larger ones' memory); a live batch of n sequences replays the smallest
  bucket >= n, its rows past n padded: token 0 at position 0, slot -1 (the cache write skips it), context length
  0 (the decode kernel reads nothing for it);
- the step's inputs live in static device buffers that the graphs read: one int64 buffer [token ids | positions |
  slots] and one int32 buffer [context lengths | block table rows of the maximum width], each bucket reading its
  own prefix of them, so that a step's inputs go up in two copies from pinned host staging (non-blocking);
- the block table has the width of the longest context (max_model_len / block_size blocks); the decode kernel
  then cuts every sequence's context on the device into a number of partitions fixed per bucket
  (``partition_tokens`` returns it as -splits: many for small batches, so that a short context still spreads over
  the GPU; one at 64 sequences of the 8B shape on the H200). (Fixed partition sizes over the table's width launched
  mostly empty blocks: 256 per KV head at batch 1 over a 16k-token table, 9 of them with work at a 512-token
  context; planned for the table's width instead, a batch-1 step at a 512-token context ran one partition per
  head: 4.2 ms.)

Prefill and mixed steps stay eager. The sampler runs eagerly on the graph's logits (its shapes change with the
requests' parameters). Tensor parallelism stays eager until its all-reduces are capturable.

``capture=False`` runs the same bucketed, padded forward eagerly: what the CPU tests check the padding and staging
with, and the reference the GPU tests compare replays to bit for bit.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch

from engine.layers.attention import DECODE, AttentionMetadata, SeqSpan
from engine.ops import skinny_gemm

log = logging.getLogger(__name__)

MAX_CAPTURE_SIZE = 256  # larger batches decode eagerly (their launch overhead is a small share of the step)


def capture_sizes(max_num_seqs: int, limit: int = MAX_CAPTURE_SIZE) -> list[int]:
    """The batch-size buckets: 1, 2, 4, 8, then steps of 8, up to min(max_num_seqs, limit) (itself a bucket)."""
    top = max(1, min(max_num_seqs, limit))
    sizes = [s for s in (1, 2, 4, *range(8, top + 1, 8)) if s <= top]
    if sizes[-1] != top:
        sizes.append(top)
    return sizes


class DecodeGraphs:
    """Captured decode forwards by bucket, and the static buffers they read.

    ``forward(input_ids, meta) -> logits`` is the model's whole decode forward (hidden states to float32 logits
    of every row); the runner passes it in, so this module knows the metadata layout but not the model."""

    def __init__(self, forward: Callable[[torch.Tensor, AttentionMetadata], torch.Tensor], device: torch.device,
                 sizes: Sequence[int], max_blocks_per_seq: int, block_size: int, num_kv_heads: int,
                 capture: bool = True):
        self.forward = forward
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.sm_count = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
        self.device = device
        self.sizes = sorted(set(sizes))
        self.max_size = self.sizes[-1]
        self.width = max(1, max_blocks_per_seq)
        self.capturing = capture
        cap = self.max_size
        self.longs = torch.zeros(3 * cap, dtype=torch.long, device=device)
        self.ints = torch.zeros(cap * (1 + self.width), dtype=torch.int32, device=device)
        pin = device.type == "cuda"
        self.host_longs = torch.zeros(3 * cap, dtype=torch.long, pin_memory=pin)
        self.host_ints = torch.zeros(cap * (1 + self.width), dtype=torch.int32, pin_memory=pin)
        self._longs_np = self.host_longs.numpy()
        self._ints_np = self.host_ints.numpy()
        self._staged: torch.cuda.Event | None = None  # the last upload out of the staging buffers
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # every graph copies its logits into the first rows of one buffer: a buffer per graph would keep
        # 1 + 2 + ... + 256 rows of logits alive in the pool (2.1 GiB on a 128k vocabulary, measured)
        self.logits: torch.Tensor | None = None
        self.capture_seconds = 0.0
        self.pool_bytes = 0

    # -- the buffers each bucket reads ---------------------------------------------------------
    def _inputs(self, b: int) -> tuple[torch.Tensor, AttentionMetadata]:
        ids, positions, slots = self.longs[:b], self.longs[b:2 * b], self.longs[2 * b:3 * b]
        context_lens = self.ints[:b]
        table = self.ints[b:b + b * self.width].view(b, self.width)
        meta = AttentionMetadata(positions=positions, slot_mapping=slots, num_decode_tokens=b, seqs=[],
                                 block_tables=table, seq_lens=context_lens, query_start_loc=None,
                                 decode_block_tables=table, decode_context_lens=context_lens,
                                 decode_part_tokens=partition_tokens(b, self.num_kv_heads, self.sm_count),
                                 route=DECODE)
        return ids, meta

    def bucket(self, n: int) -> int | None:
        """The smallest bucket holding n sequences; None when n is past the largest."""
        if n > self.max_size or n < 1:
            return None
        for s in self.sizes:
            if s >= n:
                return s
        return None

    # -- capture ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self, progress: Callable[[str], None] | None = None) -> None:
        """Capture every bucket, largest first, into one pool (a no-op without ``capture``). The padded inputs of
        an idle buffer (context 0, slot -1) make the warm-up and capture runs write nothing into the KV cache."""
        self._stage_padding()
        if not self.capturing:
            return
        t0 = time.perf_counter()
        torch.cuda.empty_cache()  # so that the difference below is the graphs' pool, not the warm-ups' cache
        before = torch.cuda.memory_reserved(self.device)
        pool = torch.cuda.graph_pool_handle()
        with skinny_gemm.for_graphs():  # the Triton GEMV for one-row linears (engine/ops/skinny_gemm.py)
            self._capture_all(pool, progress)
        torch.cuda.synchronize(self.device)
        self.capture_seconds = time.perf_counter() - t0
        torch.cuda.empty_cache()
        self.pool_bytes = torch.cuda.memory_reserved(self.device) - before
        log.info("CUDA graphs for %d decode batch sizes (1..%d) captured in %.2f s, %.0f MiB", len(self.sizes),
                 self.max_size, self.capture_seconds, self.pool_bytes / 2**20)

    def _capture_all(self, pool, progress) -> None:
        for i, b in enumerate(reversed(self.sizes)):
            if progress is not None:
                progress(f"CUDA graphs: batch size {b} ({i + 1} of {len(self.sizes)})")
            ids, meta = self._inputs(b)
            warm = self.forward(ids, meta)  # warm-up outside the capture: lazy initialisation, Triton compiles
            if self.logits is None:
                self.logits = torch.empty(self.max_size, warm.shape[-1], dtype=warm.dtype, device=self.device)
            del warm
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[:b].copy_(self.forward(ids, meta))
            self.graphs[b] = graph

    def _stage_padding(self) -> None:
        cap = self.max_size
        self.longs[:cap].zero_()
        self.longs[cap:2 * cap].zero_()
        self.longs[2 * cap:].fill_(-1)
        self.ints.zero_()

    # -- one step ----------------------------------------------------------------------------------
    def run(self, token_ids: Sequence[int], seqs: Sequence[SeqSpan], fed: torch.Tensor | None = None
            ) -> torch.Tensor | None:
        """Float32 logits [n, vocab] of a decode step of n sequences (one token each: token_ids[i] at the last
        position of seqs[i]'s context), or None when n has no bucket. The logits are a view of the graphs' shared
        output buffer: read them before the next step (a later replay on the same stream overwrites them after
        the kernels queued before it have read them). ``fed``: the first input ids on the device (int64), copied
        over the staged ones (a step launched ahead of the one that sampled them)."""
        n = len(token_ids)
        b = self.bucket(n)
        if b is None:
            return None
        self._stage(token_ids, seqs, b, fed)
        return self._forward_bucket(n, b)

    def _stage(self, token_ids: Sequence[int], seqs: Sequence[SeqSpan], b: int,
               fed: torch.Tensor | None = None) -> None:
        """The step's inputs into the static buffers of bucket b (padding rows past the live ones)."""
        n = len(token_ids)
        if self._staged is not None:
            self._staged.synchronize()  # the previous step's upload has left the staging buffers
        L, I = self._longs_np, self._ints_np
        bs = self.block_size
        L[:n] = token_ids
        L[n:b] = 0
        L[b + n:2 * b] = 0
        L[2 * b + n:3 * b] = -1
        I[n:b] = 0
        context_lens = [s.context_len for s in seqs]
        L[b:b + n] = [c - 1 for c in context_lens]  # positions
        L[2 * b:2 * b + n] = [s.block_ids[(c - 1) // bs] * bs + (c - 1) % bs for s, c in zip(seqs, context_lens)]
        I[:n] = context_lens
        table = I[b:b + b * self.width].reshape(b, self.width)
        for i, s in enumerate(seqs):
            table[i, :len(s.block_ids)] = s.block_ids
        nonblocking = self.device.type == "cuda"
        self.longs[:3 * b].copy_(self.host_longs[:3 * b], non_blocking=nonblocking)
        self.ints[:b + b * self.width].copy_(self.host_ints[:b + b * self.width], non_blocking=nonblocking)
        if fed is not None:
            self.longs[:len(fed)].copy_(fed)  # after the staged ids on the stream
        if nonblocking:
            if self._staged is None:
                self._staged = torch.cuda.Event()
            self._staged.record()

    def _forward_bucket(self, n: int, b: int) -> torch.Tensor:
        graph = self.graphs.get(b)
        if graph is None:  # capture=False: the same padded forward, eagerly
            ids, meta = self._inputs(b)
            with skinny_gemm.for_graphs():
                return self.forward(ids, meta)[:n]
        graph.replay()
        return self.logits[:n]


def partition_tokens(batch: int, num_kv_heads: int, sm_count: int) -> int:
    """The decode kernel's partitions in a graph of ``batch`` sequences, as ``-splits`` (ops.paged_decode_attention:
    each context cut on the device into that many partitions of at least 32 tokens): as many as keep the (sequence,
    KV head) pairs times the partitions (the kernel's blocks: each takes the query heads of one KV head) within one
    wave of the four blocks per SM the kernel holds. Past one wave a split only adds a merge: on the H200 at batch
    64 x 512 tokens 1 partition ran at 2,492 GB/s, 2 (the rounded-up choice before) at 2,142; at batch 1 the 66
    partitions of a full wave won at 16k tokens (1,816 against 1,496 GB/s for 32)."""
    return -max(1, 4 * sm_count // max(1, batch * num_kv_heads))


def reserve_bytes(max_size: int, vocab_size: int, hidden_size: int, intermediate_size: int, dtype_bytes: int) -> int:
    """GPU memory to leave for the graphs' pool when sizing the KV cache: the largest bucket's activations (its
    logits in the model dtype, in float32 and in the shared float32 output buffer, the MLP's gate/up and activation,
    a few hidden-size temporaries) plus a margin for workspaces. The pool is private to the graphs, so the eager
    activation peak measured by the profiling forward does not cover it. (Llama-3-8B shape, buckets to 256, H200:
    414 MiB reserved, 408 MiB measured.)"""
    per_row = vocab_size * (dtype_bytes + 8) + intermediate_size * 3 * dtype_bytes + hidden_size * 8 * dtype_bytes
    return max_size * per_row + (64 << 20)

