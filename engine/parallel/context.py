"""The tensor-parallel context a model is built with: this rank, the group size and the
communication strategy used by row-parallel layers. TP=1 is the identity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class TPContext:
    rank: int = 0
    size: int = 1
    comm: Any = None  # engine.parallel.comm strategy with all_reduce / all_gather

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.size == 1 else self.comm.all_reduce(x)

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.size == 1 else self.comm.all_gather(x, dim=-1)

    def split(self, n: int, what: str) -> tuple[int, int]:
        """This rank's [start, stop) of a dimension of size n split evenly across ranks."""
        if n % self.size:
            raise ValueError(f"{what} ({n}) is not divisible by the tensor-parallel size ({self.size})")
        per = n // self.size
        return self.rank * per, (self.rank + 1) * per


SINGLE = TPContext()
