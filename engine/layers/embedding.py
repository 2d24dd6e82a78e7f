"""Vocab-parallel token embedding and LM head."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine import ops
from engine.layers.linear import load_gguf_blocks
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
    # The table as the GGUF file's blocks (--quantization gguf on the CPU, a type with a kernel): the lookup
    # dequantizes the rows it needs (gguf_embedding) and the LM head computes on the blocks (gguf_linear), as
    # llama.cpp does; the float weight is then dropped. A tied table serves both from the same bytes.
    gguf: ops.GGUFWeight | None = None

    def load(self, weights, name: str) -> None:
        self.gguf = load_gguf_blocks(weights, [(name, 0, self.start, self.stop)], self.weight)
        if self.gguf is None:
            self.weight.data.copy_(weights.get_slice(name, 0, self.start, self.stop))

    def quantize_head_int8(self) -> bool:
        if self.gguf is None and self.head_int8 is None and ops.Int8Weight.supports(self.weight):
            self.head_int8 = ops.Int8Weight.quantize(self.weight.data)
        return self.head_int8 is not None

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if self.gguf is not None:
            return ops.gguf_embedding(ids, self.gguf, self.weight.dtype)
        return F.embedding(ids, self.weight)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return self._lookup(ids)
        local = ids - self.start
        mask = (local < 0) | (local >= self.stop - self.start)
        out = self._lookup(local.masked_fill(mask, 0))
        out.masked_fill_(mask.unsqueeze(-1), 0)
        return self.tp.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Each rank computes logits for its vocab slice; they are gathered on every rank."""

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # the largest GEMV of a decode step (vocab x hidden)
        weight = self.gguf if self.gguf is not None else self.weight if self.head_int8 is None else self.head_int8
        local = ops.linear(hidden, weight)
        if self.tp.size == 1:
            return local
        # equal shards for the gather: pad to ceil(V / size) columns, trim below
        full = self.tp.all_gather_last_dim(local, pad_to=-(-self.vocab_size // self.tp.size))
        return full[..., : self.vocab_size]
