"""Dual-stream overlap: the step's tokens split in two micro-batches inside the forward; while one
micro-batch's all-reduce runs (``comm.all_reduce_async``: a second CUDA stream, NCCL's stream, or the host
transport's helper thread), the other one computes:

    attn(A) -> AR(A) | attn(B) -> AR(B) | wait A, mlp(A) -> AR(A) | wait B, mlp(B) -> AR(B) | wait A, attn(A) ...

so every all-reduce after the first of a layer hides behind the other half's compute.

The split keeps the engine's token layout (decodes first, then prefill chunks): micro-batch A takes the first
half of the tokens, B the rest; a prefill chunk that straddles the cut becomes two chunks - A's part
attends to its own prefix, B's part reads A's keys and values from the paged cache, which A wrote in the
same layer just before (chunked prefill, same code path). The result is the same computation as the
unsplit forward (tests/parallel: token-identical on the CPU, where it runs sequentially).

This mirrors LlamaDecoderLayer / LlamaAttention / LlamaMLP (engine/models/llama.py) step for step, minus
the row-parallel all-reduces, which it issues itself; keep the two in sync.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from engine import ops
from engine.layers.attention import AttentionMetadata, PrefillSegment


def split_metadata(meta: AttentionMetadata, T: int, cut: int) -> tuple[AttentionMetadata, AttentionMetadata]:
    """The metadata of tokens [0, cut) and [cut, T) (each in the engine's layout)."""
    nd = meta.num_decode_tokens
    da = min(nd, cut)
    pa: list[PrefillSegment] = []
    pb: list[PrefillSegment] = []
    for seg in meta.prefills:
        q0, n, ctx = seg.query_start, seg.query_len, seg.context_len
        if q0 + n <= cut:
            pa.append(seg)
        elif q0 >= cut:
            pb.append(replace(seg, query_start=q0 - cut))
        else:  # straddles the cut
            na = cut - q0
            pa.append(replace(seg, query_len=na, context_len=ctx - (n - na)))
            pb.append(replace(seg, query_start=0, query_len=n - na))

    def part(lo: int, hi: int, d0: int, d1: int, prefills) -> AttentionMetadata:
        m = AttentionMetadata(positions=meta.positions[lo:hi], slot_mapping=meta.slot_mapping[lo:hi],
                              num_decode_tokens=d1 - d0, prefills=prefills)
        if d1 > d0:
            m.decode_block_tables = meta.decode_block_tables[d0:d1]
            m.decode_context_lens = meta.decode_context_lens[d0:d1]
        return m

    return part(0, cut, 0, da, pa), part(cut, T, da, nd, pb)


def _attn_partial(sa, x: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """LlamaAttention.forward without the o_proj all-reduce: this rank's partial o_proj output."""
    qkv = sa.qkv_proj(x)
    q, k, v = qkv.split([sa.q_size, sa.kv_size, sa.kv_size], dim=-1)
    if sa.q_norm is not None:
        T = x.shape[0]
        q = sa.q_norm(q.reshape(-1, sa.head_dim)).view(T, sa.q_size)
        k = sa.k_norm(k.reshape(-1, sa.head_dim)).view(T, sa.kv_size)
    sa.rotary(meta.positions, q, k)
    return ops.linear(sa.attn(q, k, v, meta), sa.o_proj.weight)


def _mlp_partial(mlp, x: torch.Tensor) -> torch.Tensor:
    return ops.linear(ops.silu_and_mul(mlp.gate_up_proj(x)), mlp.down_proj.weight)


@torch.inference_mode()
def overlapped_forward(model, input_ids: torch.Tensor, meta: AttentionMetadata, comm) -> torch.Tensor:
    T = input_ids.shape[0]
    if T < 2:
        return model(input_ids, meta)
    cut = T // 2
    metas = split_metadata(meta, T, cut)
    spans = ((0, cut), (cut, T))
    x = model.embed_tokens(input_ids)  # vocab-parallel embedding: one (small) all-reduce for both halves
    xs = [x[a:b] for a, b in spans]
    res: list[torch.Tensor | None] = [None, None]
    pending = [None, None]
    for layer in model.layers:
        for m in (0, 1):
            if pending[m] is not None:
                xs[m] = pending[m].wait()
            if res[m] is None:
                res[m] = xs[m]
                h = layer.input_layernorm(xs[m])
            else:
                h, res[m] = layer.input_layernorm(xs[m], res[m])
            pending[m] = comm.all_reduce_async(_attn_partial(layer.self_attn, h, metas[m]))
        for m in (0, 1):
            h = pending[m].wait()
            h, res[m] = layer.post_attention_layernorm(h, res[m])
            pending[m] = comm.all_reduce_async(_mlp_partial(layer.mlp, h))
    out = []
    for m in (0, 1):
        h = pending[m].wait()
        h, _ = model.norm(h, res[m])
        out.append(h)
    return torch.cat(out)
