"""Dual-stream micro-batch overlap over a model's decoder layers (comm strategy ``overlap``).

The step's tokens split in two micro-batches; while one micro-batch's all-reduce runs
(``comm.all_reduce_async``: a second CUDA stream, NCCL's stream, or the host transport's helper thread), the
other one computes:

    attn(A) -> AR(A) | attn(B) -> AR(B) | wait A, mlp(A) -> AR(A) | wait B, mlp(B) -> AR(B) | wait A, attn(A) ...

so every all-reduce after the first of a layer hides behind the other half's compute. It drives the model's own
decoder layers through their two halves (``attention_half`` / ``mlp_half`` with ``reduce=False``): one decoder,
whatever the strategy. The split keeps the engine's token layout (``AttentionMetadata.split``); the result is
the computation of the unsplit forward (tests/parallel: token-identical on the CPU, where it runs sequentially).
"""

from __future__ import annotations

import torch

from engine.layers.attention import AttentionMetadata


def overlapped_layers(layers, norm, x: torch.Tensor, meta: AttentionMetadata, comm) -> torch.Tensor:
    """The decoder stack and the final norm on embedded tokens x [T, hidden], as two overlapped micro-batches.
    Returns the final hidden states [T, hidden]."""
    T = x.shape[0]
    cut = T // 2
    metas = meta.split(cut)
    xs = [x[:cut], x[cut:]]
    res: list[torch.Tensor | None] = [None, None]
    pending = [None, None]
    for layer in layers:
        for m in (0, 1):
            if pending[m] is not None:
                xs[m] = pending[m].wait()
            partial, res[m] = layer.attention_half(xs[m], res[m], metas[m], reduce=False)
            pending[m] = comm.all_reduce_async(partial)
        for m in (0, 1):
            partial, res[m] = layer.mlp_half(pending[m].wait(), res[m], reduce=False)
            pending[m] = comm.all_reduce_async(partial)
    out = []
    for m in (0, 1):
        h, _ = norm(pending[m].wait(), res[m])
        out.append(h)
    return torch.cat(out)
