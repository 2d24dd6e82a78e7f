"""An MXFP4 packer for tests (the inverse of engine/loader/mxfp4.py's dequantizer, written from the format's
definition): float [..., K] (K a multiple of 32) -> (blocks uint8 [..., K / 32, 16], scales uint8 [..., K / 32]).
Each block of 32 gets the OCP scale 2^(floor(log2(amax)) - 2) (E2M1's largest exponent), each element the nearest
FP4 E2M1 value of x / scale (above 6: 6), element 2i in byte i's low nibble and 2i + 1 in its high nibble."""

from __future__ import annotations

import math

import torch

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # codes 0-7; code | 8 is the negative


def pack_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    *lead, k = w.shape
    assert k % 32 == 0, k
    x = w.float().reshape(*lead, k // 32, 32)
    amax = x.abs().amax(dim=-1)
    exponent = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp(min=2.0 ** -126))) - 2,
                           torch.full_like(amax, -127.0)).clamp(-127, 127)
    q = x / torch.exp2(exponent).unsqueeze(-1)
    magnitudes = torch.tensor(E2M1)
    code = (q.abs().unsqueeze(-1) - magnitudes).abs().argmin(dim=-1)  # nearest magnitude (6 for anything above)
    code = code | ((q < 0) & (code > 0)).long() << 3
    pairs = code.view(*lead, k // 32, 16, 2).to(torch.uint8)
    blocks = pairs[..., 0] | (pairs[..., 1] << 4)
    return blocks.contiguous(), (exponent + 127).to(torch.uint8).contiguous()


def decode_reference(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The format read element by element in Python (sign, 2-bit exponent with bias 1, 1 mantissa bit; subnormal
    at exponent 0), float64: the straightforward reference of the dequantizer."""
    *lead, groups, half = blocks.shape
    flat_b = blocks.reshape(-1, half).tolist()
    flat_s = scales.reshape(-1).tolist()
    out = []
    for row, s in zip(flat_b, flat_s):
        for byte in row:
            for code in (byte & 0xF, byte >> 4):
                sign = -1.0 if code & 8 else 1.0
                e, m = (code >> 1) & 3, code & 1
                mag = m * 0.5 if e == 0 else 2.0 ** (e - 1) * (1 + m / 2)
                out.append(sign * mag * math.ldexp(1.0, s - 127))
    return torch.tensor(out, dtype=torch.float64).reshape(*lead, groups * half * 2)
