"""Host lists onto the device without a host synchronisation: a pinned staging copy and an asynchronous transfer
(the step's inputs, the sampler's per-row parameters, the attention plans). On the CPU the tensor itself."""

from __future__ import annotations

import torch


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    t = torch.tensor(values, dtype=dtype)
    if device.type == "cpu":
        return t
    return t.pin_memory().to(device, non_blocking=True)
