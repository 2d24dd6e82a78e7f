"""The "mma" layout of integer weights (engine/weight_quant.py, csrc/cuda/int_gemm.cu) on the CPU: the codes' round
trip, and an emulation of the CUDA kernel's tensor-core products written from PTX's fragment tables for
mma.m16n8k16 (not from the packing code), which must give x @ W^T. tests/gpu/test_int_mma.py runs the kernel."""

from __future__ import annotations

import pytest
import torch

from engine.weight_quant import mma_packable, quantize_int
from tests.support.int_codes import random_int_codes


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("n,k,group,act", [(48, 256, 128, False), (37, 80, 16, False), (16, 64, 64, True),
                                           (130, 576, 576, False), (5, 96, 32, True)])
def test_round_trip(bits, n, k, group, act):
    gen = torch.Generator().manual_seed(n * k + bits + group)
    c = random_int_codes(gen, n, k, bits, group, act)
    packed = c.pack(torch.float32, layout="mma")
    assert packed.layout == "mma" and packed.shape == (n, k)
    assert packed.q.shape == (-(-n // 16), -(-k // 64) * 128 * bits // 4)
    assert torch.equal(packed.dequantize(), c.dequantize())
    assert torch.equal(packed.dequantize(), c.pack(torch.float32).dequantize())  # = the chunk layout's
    chunk = packed.as_layout("chunk")  # repacked: same weight, same act-order permutation
    assert chunk.layout == "chunk" and torch.equal(chunk.dequantize(), c.dequantize())
    assert chunk.as_layout("mma").q.equal(packed.q) and packed.as_layout("mma") is packed


def test_layout_refuses_what_the_kernels_cannot_take():
    assert mma_packable(4096, 128) and mma_packable(96, 32) and not mma_packable(100, 4) and not mma_packable(72, 24)
    with pytest.raises(ValueError, match="multiples of 16"):
        quantize_int(torch.randn(8, 72), 4, 24, False).pack(layout="mma")
    with pytest.raises(ValueError, match="unknown integer weight layout"):
        quantize_int(torch.randn(8, 64), 4, 32, False).pack(layout="tiles")


def _emulate(x: torch.Tensor, packed) -> torch.Tensor:
    """y = x @ W^T as int_mma_kernel computes it: lane l = 4 g + t of tile nt, quad kq, k-tile j decodes its word into
    A registers r_i = (nibble i, nibble i + 4) (the low half first), which PTX's A fragment of m16n8k16 places at
    a_{2i}, a_{2i+1}: a0 a1 (row g, columns 2t, 2t+1), a2 a3 (row g + 8, same), a4 a5 (row g, 2t+8, 2t+9), a6 a7
    (row g + 8, 2t+8, 2t+9); its B fragment b0 b1 (rows 2t, 2t+1, column g), b2 b3 (rows 2t+8, 2t+9) comes from
    the 32-bit words 2j and 2j + 1 of x[m = g, 64 kq + 16 t ... + 16]. The codes are dequantized with the group of
    the K position that the B element came from."""
    m, k = x.shape
    n = packed.shape[0]
    bits, group = packed.bits, packed.group
    tiles, quads = -(-n // 16), -(-k // 64)
    words = packed.q.reshape(tiles, quads, 32, 4, bits // 4)
    scales, zeros = packed.scales.double(), packed.zeros.double()
    y = torch.zeros(m, tiles * 16, dtype=torch.float64)
    xp = torch.zeros(8 * -(-m // 8), quads * 64, dtype=torch.float64)
    xp[:m, :k] = x.double()
    for nt in range(tiles):
        for kq in range(quads):
            for j in range(4):
                a = torch.zeros(16, 16, dtype=torch.float64)  # fragment rows x fragment columns
                b = torch.zeros(16, xp.shape[0], dtype=torch.float64)
                kpos = torch.zeros(16, 16, dtype=torch.long)  # the K position of each A element
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    w = [int(words[nt, kq, lane, j, p]) & 0xFFFFFFFF for p in range(bits // 4)]
                    nib = [[(wp >> (4 * s)) & 0xF for s in range(8)] for wp in w]
                    code = [nib[0][s] if bits == 4 else nib[0][s] * 16 + nib[1][s] for s in range(8)]
                    regs = [(code[i], code[i + 4]) for i in range(4)]
                    frag = {0: (g, 2 * t), 1: (g + 8, 2 * t), 2: (g, 2 * t + 8), 3: (g + 8, 2 * t + 8)}
                    xk = kq * 64 + 16 * t
                    for i, (r, col) in frag.items():
                        for e in range(2):
                            a[r, col + e] = regs[i][e]
                    for mg in range(0, xp.shape[0], 8):
                        xv = xp[mg + g, xk:xk + 16]
                        b[2 * t, mg + g], b[2 * t + 1, mg + g] = xv[4 * j], xv[4 * j + 1]
                        b[2 * t + 8, mg + g], b[2 * t + 9, mg + g] = xv[4 * j + 2], xv[4 * j + 3]
                    for col in (2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9):  # column c of lane t's B rows
                        e = {2 * t: 0, 2 * t + 1: 1, 2 * t + 8: 2, 2 * t + 9: 3}[col]
                        kpos[:, col] = xk + 4 * j + e
                rows = torch.arange(16) + 16 * nt
                rows_c = rows.clamp(max=n - 1)
                gi = (kpos.clamp(max=k - 1) // group)
                z = zeros[rows_c[:, None], gi]
                s = scales[rows_c[:, None], gi]
                y[:, rows] += ((a - z) * s @ b).t()[:m]
    return y[:, :n]


@pytest.mark.parametrize("bits,n,k,group,m", [(4, 32, 128, 64, 1), (8, 20, 64, 64, 3), (4, 16, 96, 32, 9),
                                              (8, 16, 64, 16, 2)])
def test_emulated_tensor_core_products(bits, n, k, group, m):
    gen = torch.Generator().manual_seed(bits + n + k + m)
    c = random_int_codes(gen, n, k, bits, group)
    packed = c.pack(torch.float32, layout="mma")
    x = torch.randn(m, k, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(_emulate(x, packed), x @ c.dequantize(torch.float64).t(), rtol=1e-9, atol=1e-9)
