"""Vocab-parallel token embedding and LM head."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine import ops
from engine.layers.linear import load_gguf_blocks, quantize_for_gpu
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

    # A quantized copy for the LM head (the lookup keeps the float rows): ops.Int8Weight on the CPU (--quantization
    # int8), an IntWeight / Fp8Weight on a GPU (quantize_head)
    head_quant = None
    # The table as the GGUF file's blocks (--quantization gguf on the CPU, a type with a kernel): the lookup
    # dequantizes the rows it needs (gguf_embedding) and the LM head computes on the blocks (gguf_linear), as
    # llama.cpp does; the float weight is then dropped. A tied table serves both from the same bytes.
    gguf: ops.GGUFWeight | None = None

    def load(self, weights, name: str) -> None:
        self.gguf = load_gguf_blocks(weights, [(name, 0, self.start, self.stop)], self.weight)
        if self.gguf is None:
            self.weight.data.copy_(weights.get_slice(name, 0, self.start, self.stop))

    def quantize_head_int8(self) -> bool:
        if self.gguf is None and self.head_quant is None and ops.Int8Weight.supports(self.weight):
            self.head_quant = ops.Int8Weight.quantize(self.weight.data)
        return self.head_quant is not None

    def quantize_head(self, mode: str) -> bool:
        """--quantization int8 | int4 | fp8 on a GPU: the head in int8 with a scale per row, whatever the mode (4 bits
        or e4m3 would cost the logits more than the bytes they save: on SmolLM2 an e4m3 head alone added ~1% to
        the perplexity)."""
        if self.gguf is None and self.head_quant is None:
            self.head_quant = quantize_for_gpu(self.weight.data, "int8")
        return self.head_quant is not None

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
        weight = self.gguf if self.gguf is not None else self.weight if self.head_quant is None else self.head_quant
        local = ops.linear(hidden, weight)
        if self.tp.size == 1:
            return local
        # equal shards for the gather: pad to ceil(V / size) columns, trim below
        full = self.tp.all_gather_last_dim(local, pad_to=-(-self.vocab_size // self.tp.size))
        return full[..., : self.vocab_size]
