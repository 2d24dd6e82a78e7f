"""Vocab-parallel token embedding and LM head."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine import ops
from engine.parallel.context import TPContext


class VocabParallelEmbedding(torch.nn.Module):
    def __init__(self, vocab_size: int, hidden: int, dtype, tp: TPContext):
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        per = -(-vocab_size // tp.size)
        self.start = min(tp.rank * per, vocab_size)
        self.stop = min(self.start + per, vocab_size)
        self.weight = torch.nn.Parameter(torch.empty(self.stop - self.start, hidden, dtype=dtype),
                                         requires_grad=False)

    head_int8: ops.Int8Weight | None = None  # int8 copy for the LM head (the lookup keeps the float rows)

    def load(self, weights, name: str) -> None:
        self.weight.data.copy_(weights.get_slice(name, 0, self.start, self.stop))

    def quantize_head_int8(self) -> bool:
        if self.head_int8 is None and ops.Int8Weight.supports(self.weight):
            self.head_int8 = ops.Int8Weight.quantize(self.weight.data)
        return self.head_int8 is not None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        mask = (local < 0) | (local >= self.weight.shape[0])
        out = F.embedding(local.masked_fill(mask, 0), self.weight)
        out.masked_fill_(mask.unsqueeze(-1), 0)
        return self.tp.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Each rank computes logits for its vocab slice; they are gathered on every rank."""

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # the largest GEMV of a decode step (vocab x hidden)
        local = ops.linear(hidden, self.weight if self.head_int8 is None else self.head_int8)
        if self.tp.size == 1:
            return local
        # equal shards for the gather: pad to ceil(V / size) columns, trim below
        full = self.tp.all_gather_last_dim(local, pad_to=-(-self.vocab_size // self.tp.size))
        return full[..., : self.vocab_size]
