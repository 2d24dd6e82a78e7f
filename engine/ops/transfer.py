"""Host lists onto the device without a host synchronisation: written straight into pinned staging memory and
copied asynchronously (the step's inputs, the sampler's per-row parameters, the attention plans). On the CPU the
tensor itself. Lists go through numpy, whose conversion of Python ints is ~4x faster than torch.tensor's (a
32,768-token prompt: 0.47 ms against 1.7)."""

from __future__ import annotations

import numpy as np
import torch

_NUMPY = {torch.int64: np.int64, torch.int32: np.int32, torch.float32: np.float32, torch.float64: np.float64,
          torch.float16: np.float16, torch.bool: np.bool_, torch.uint8: np.uint8, torch.int8: np.int8}


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    np_dtype = _NUMPY.get(dtype)
    if np_dtype is None:  # bfloat16: no numpy type
        t = torch.tensor(values, dtype=dtype)
        return t if device.type == "cpu" else t.pin_memory().to(device, non_blocking=True)
    if device.type == "cpu":
        return torch.from_numpy(np.array(values, dtype=np_dtype))
    staged = torch.empty(len(values), dtype=dtype, pin_memory=True)
    staged.numpy()[:] = values
    return staged.to(device, non_blocking=True)
