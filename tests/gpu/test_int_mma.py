"""The tensor-core kernels for integer weights in the "mma" layout (csrc/cuda/int_gemm.cu through
engine/ops/int_mma.py and quant_linear) against dequantize-then-matmul on random shapes: 4 and 8 bits, groups of
16 / 32 (scaled in the weight) and 64 / 128 / per channel (scaled after the products), act-order, padded rows and
K, 1..256 rows of x (one launch up to 64, 16 rows a launch for groups of 16 / 32, the dequantized weight and the GEMM
beyond), bias, strided x and out, bf16 and fp16; every shape of the x-sharing kernel (tiles per block x k-groups, the
ones the engine picks and the others); the whole-weight dequantization bit for bit; the prefill path; a CUDA graph
replay equal to the eager call."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from engine.ops import int_mma
from engine.ops.quant_linear import quant_linear
from engine.weight_quant import IntCodes
from tests.support.int_codes import random_int_codes

if not int_mma.available():
    pytest.skip("engine._C was built without CUDA", allow_module_level=True)


CASES = [  # bits, n, k, group, act-order, scale dtype
    (4, 200, 384, 128, False, torch.float16), (4, 33, 576, 64, False, torch.float16),
    (4, 256, 1040, 16, False, torch.float16), (4, 96, 512, 32, True, torch.float16),
    (4, 64, 4096, 4096, False, torch.bfloat16), (8, 200, 384, 384, False, torch.float16),
    (8, 48, 1040, 1040, False, torch.float32), (8, 130, 512, 64, False, torch.float16),
    (8, 64, 256, 32, False, torch.float16), (8, 80, 768, 128, True, torch.float16),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bits,n,k,group,act,sdt", CASES)
def test_kernel_against_dequantize_then_matmul(dtype, bits, n, k, group, act, sdt):
    gen = torch.Generator().manual_seed(bits * 7 + n + k + group)
    c = random_int_codes(gen, n, k, bits, group, act, symmetric=(n % 2 == 0))
    c = IntCodes(c.codes, c.scales.to(sdt), c.zeros, bits, group, c.g_idx)
    w = c.pack(sdt, layout="mma").to("cuda")
    ref_w = c.dequantize().cuda()
    for m in (1, 2, 7, 8, 9, 16, 17, 23, 32, 33, 48, 64, 100, 256):
        big = torch.randn(m, k + 64, device="cuda", dtype=dtype)
        x = big[:, 8:8 + k] if m % 2 else big[:, :k].contiguous()  # strided rows (16-byte aligned) or contiguous
        bias = torch.randn(n, device="cuda", dtype=dtype) if m % 3 == 0 else None
        ref = x.float() @ ref_w.t() + (0 if bias is None else bias.float())
        if m == 9:  # into a strided out
            out_big = torch.full((m, n + 5), float("nan"), device="cuda", dtype=dtype)
            got = quant_linear(x, w, bias, out=out_big[:, 3:3 + n])
            assert torch.isnan(out_big[:, :3]).all() and torch.isnan(out_big[:, 3 + n:]).all()
        else:
            got = quant_linear(x, w, bias)
        err = (got.float() - ref).abs().max().item()
        assert err <= 1e-2 * ref.abs().max().item() + 1e-3, (m, err)


@pytest.mark.parametrize("bits,n,k,group", [(4, 200, 384, 128), (8, 1000, 4096, 4096), (4, 4096, 14336, 128),
                                           (8, 48, 1040, 1040)])
def test_every_tiles_per_block_and_k_groups_shape(bits, n, k, group):
    gen = torch.Generator().manual_seed(bits + n + k)
    c = random_int_codes(gen, n, k, bits, group, False)
    w = c.pack(torch.bfloat16, layout="mma").to("cuda")
    ref_w = c.dequantize().cuda()
    for m in (1, 8, 9, 16, 17, 32, 33, 64):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = x.float() @ ref_w.t()
        chosen = int_mma.linear(x, w)
        for nb in (2, 4, 8):
            for kw in (1, 2, 3, 4, 8):  # past a shape's most k-groups the launcher takes its most
                got = int_mma.linear(x, w, tiles_per_block=nb, k_groups=kw)
                err = (got.float() - ref).abs().max().item()
                assert err <= 1e-2 * ref.abs().max().item() + 1e-3, (m, nb, kw, err)
        again = int_mma.linear(x, w)
        assert torch.equal(chosen, again), m  # the k-groups' sums meet in a fixed order


@pytest.mark.parametrize("bits,group,act", [(4, 128, False), (4, 32, True), (8, 1024, False), (8, 64, False)])
def test_dequantize_is_exact_and_the_prefill_path_matches(bits, group, act):
    gen = torch.Generator().manual_seed(bits + group)
    c = random_int_codes(gen, 300, 1024, bits, group, act)
    w = c.pack(torch.float16, layout="mma").to("cuda")
    ref_w = c.dequantize().cuda()
    assert torch.equal(int_mma.dequantize(w, torch.float32), ref_w)
    assert torch.equal(int_mma.dequantize(w, torch.bfloat16), ref_w.to(torch.bfloat16))
    x = torch.randn(500, 1024, device="cuda", dtype=torch.bfloat16)  # past SLICED_MAX_M: dequantize + GEMM
    ref = x.float() @ ref_w.t()
    got = quant_linear(x, w)
    assert (got.float() - ref).abs().max() <= 1e-2 * ref.abs().max()


def test_graph_replay_equals_the_eager_call():
    gen = torch.Generator().manual_seed(1)
    w = random_int_codes(gen, 4096, 4096, 4, 128).pack(layout="mma").to("cuda")
    x = torch.randn(3, 4096, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(3, 4096, device="cuda", dtype=torch.bfloat16)
    eager = quant_linear(x, w).clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        quant_linear(x, w, out=out)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        quant_linear(x, w, out=out)
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
