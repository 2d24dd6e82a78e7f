"""The tensor-parallel context a model is built with: this rank, the group size and the
communication strategy used by row-parallel layers. TP=1 is the identity."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class TPContext:
    rank: int = 0
    size: int = 1
    comm: Any = None  # engine.parallel.comm.Communicator (all_reduce / all_reduce_async / all_gather)
    on_error: Callable[[BaseException], None] | None = None  # the executor marks the group broken

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.size == 1 else self.comm.all_reduce(x)

    def all_gather_last_dim(self, x: torch.Tensor, pad_to: int | None = None) -> torch.Tensor:
        """The ranks' shards concatenated along the last dim. Shards may be uneven (the vocab split): with
        ``pad_to`` every shard is zero-padded to that width first (the collectives need equal shards), so
        the result has size * pad_to columns and the caller trims it."""
        if self.size == 1:
            return x
        if pad_to is not None and x.shape[-1] != pad_to:
            padded = x.new_zeros(*x.shape[:-1], pad_to)
            padded[..., : x.shape[-1]] = x
            x = padded
        return self.comm.all_gather(x, dim=-1)

    def overlaps(self, num_tokens: int) -> bool:
        """Whether the model should run this step as two overlapped micro-batches (comm strategy overlap,
        and enough tokens for the split to pay)."""
        return self.size > 1 and self.comm.overlap and num_tokens >= max(2, self.comm.overlap_min_tokens)

    def guard(self, fn, *args):
        """Run one step's work on this rank. Any failure in the middle breaks the group (the ranks'
        collectives would no longer match): ``on_error`` marks it dead and may replace the exception."""
        try:
            out = fn(*args)
            self.comm.end_step()
            return out
        except BaseException as e:
            if self.on_error is None:
                raise
            replacement = self.on_error(e)
            if replacement is None or replacement is e:
                raise
            raise replacement from e

    def split(self, n: int, what: str) -> tuple[int, int]:
        """This rank's [start, stop) of a dimension of size n split evenly across ranks."""
        if n % self.size:
            raise ValueError(f"{what} ({n}) is not divisible by the tensor-parallel size ({self.size})")
        per = n // self.size
        return self.rank * per, (self.rank + 1) * per


SINGLE = TPContext()
