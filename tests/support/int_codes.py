"""Random integer weight codes for the quantized-linear tests: codes, fp16 scales, zero points (or the symmetric
2**(bits-1)) and, optionally, GPTQ's act-order (the columns quantized in a random order, groups in that order)."""

from __future__ import annotations

import torch

from engine.weight_quant import IntCodes


def random_int_codes(gen: torch.Generator, n: int, k: int, bits: int, group: int, act_order: bool = False,
                     symmetric: bool = False) -> IntCodes:
    top = 2 ** bits - 1
    g = -(-k // group)
    codes = torch.randint(0, top + 1, (n, k), generator=gen, dtype=torch.int32).to(torch.uint8)
    scales = (torch.rand(n, g, generator=gen) * 0.02 + 0.001).half()
    zeros = (torch.full((n, g), 2 ** (bits - 1), dtype=torch.uint8) if symmetric
             else torch.randint(0, top + 1, (n, g), generator=gen, dtype=torch.int32).to(torch.uint8))
    g_idx = None
    if act_order:
        order = torch.randperm(k, generator=gen)
        g_idx = torch.empty(k, dtype=torch.int32)
        g_idx[order] = (torch.arange(k) // group).to(torch.int32)
    return IntCodes(codes, scales, zeros, bits, group, g_idx)
