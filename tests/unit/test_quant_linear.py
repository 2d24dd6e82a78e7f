"""Quantized linear weights (engine/ops/quant_linear.py): the codes' round trip, packing (plain and act-order),
slicing for tensor parallelism, and the Triton fp8 kernels (on the CPU in Triton's interpreter: tests/conftest.py
sets TRITON_INTERPRET=1 without a GPU; tests/gpu/test_quant_linear_cuda.py runs them compiled) against a
dequantize-then-matmul reference on random shapes. (The Triton integer kernels were deleted, issue 46: the GPU's
integer path is the tensor-core kernels of csrc/cuda/int_gemm.cu, tests/gpu/test_int_mma.py; their layout's packing:
tests/unit/test_int_mma_layout.py.)"""

from __future__ import annotations

import pytest
import torch

from engine.ops.quant_linear import quant_linear
from engine.weight_quant import FP8, Fp8Weight, IntCodes, IntWeight, concat_rows, quantize_int
from tests.support.int_codes import random_int_codes

triton = pytest.importorskip("triton")
if torch.cuda.is_available():
    pytest.skip("CPU interpreter tests (tests/gpu covers CUDA)", allow_module_level=True)

from engine.ops import quant_linear_triton as kern  # noqa: E402


def _reference(x, w_float, bias):
    y = x.float() @ w_float.float().t()
    return y if bias is None else y + bias.float()


@pytest.mark.parametrize("bits,group,act", [(4, 128, False), (4, 32, False), (4, 64, True), (8, 256, False),
                                            (8, 32, True)])
def test_pack_keeps_the_weight(bits, group, act):
    gen = torch.Generator().manual_seed(bits * 1000 + group + act)
    c = random_int_codes(gen, 48, 256, bits, group, act)
    w = c.dequantize()
    packed = c.pack(torch.float32)
    assert (packed.perm is not None) == act
    assert torch.equal(packed.dequantize(), w)
    assert packed.q.dtype == torch.int32 and packed.q.shape == (48, 2 * 16 * bits // 4)
    # chunk 1 (positions 128..255), position 128 + 16 * 2 + 5: nibble 2 of the chunk's word 5 (of each plane)
    stored = (c.codes[:, packed.perm] if act else c.codes).int()
    word = packed.q[3, 16 * bits // 4 + 5].item()
    code = int(stored[3, 128 + 37])
    assert (word >> 8 & 0xF) == (code if bits == 4 else code >> 4)
    if bits == 8:
        assert (packed.q[3, 16 * 2 + 16 + 5].item() >> 8 & 0xF) == code & 0xF


def test_slices_for_tensor_parallelism():
    gen = torch.Generator().manual_seed(3)
    c = random_int_codes(gen, 64, 256, 4, 64)
    w = c.dequantize()
    assert torch.equal(c.rows(16, 40).pack(torch.float32).dequantize(), w[16:40])
    assert torch.equal(c.cols(128, 256).pack(torch.float32).dequantize(), w[:, 128:256])
    with pytest.raises(ValueError, match="cut groups"):
        c.cols(32, 128)
    per_channel = IntCodes(c.codes, c.scales[:, :1], c.zeros[:, :1], 4, 256)
    half = per_channel.cols(0, 128)
    assert half.group == 128 and torch.equal(half.dequantize(), per_channel.dequantize()[:, :128])
    act = random_int_codes(gen, 16, 256, 4, 64, act_order=True)
    assert torch.equal(act.rows(0, 8).pack(torch.float32).dequantize(), act.dequantize()[:8])
    with pytest.raises(ValueError, match="unequal"):  # a random column slice of act-order groups
        act.cols(0, 100).pack()
    fused = concat_rows([c.rows(0, 16), c.rows(16, 64)])
    assert torch.equal(fused.dequantize(), w)


@pytest.mark.parametrize("bits,symmetric", [(4, False), (4, True), (8, True), (8, False)])
def test_quantize_round_to_nearest(bits, symmetric):
    gen = torch.Generator().manual_seed(bits + symmetric)
    w = torch.randn(40, 256, generator=gen)
    w[3] = 0.0  # a zero row: scale 0, codes at the zero point, dequantized exactly 0
    c = quantize_int(w, bits, 128, symmetric)
    assert int(c.codes.max()) < 2 ** bits
    d = c.dequantize()
    s = c.scales.float().repeat_interleave(128, 1)
    # half a step, except where the rounded zero point pushes the group's edge one step past the last code
    err = (d - w).abs()
    assert bool((err <= s * (0.5 if symmetric else 1.0) + 1e-6).all())
    assert float((err <= s * 0.5 + 1e-6).float().mean()) > 0.99
    assert torch.equal(d[3], torch.zeros(256))


def test_fp8_forms():
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(200, 300, generator=gen)
    for per in ("channel", "tensor"):
        f = Fp8Weight.quantize(w, per)
        d = f.dequantize()
        assert (d - w).abs().max() <= w.abs().max() * 2 ** -3
        assert torch.equal(f.rows(8, 100).dequantize(), d[8:100])
        assert torch.equal(f.cols(0, 150).dequantize(), d[:, :150])
    blocks = Fp8Weight((torch.randn(200, 300, generator=gen) * 10).to(FP8), torch.rand(2, 3, generator=gen) + 0.5)
    d = blocks.dequantize()
    assert torch.equal(d[130, 260], blocks.w[130, 260].float() * blocks.scale[1, 2])
    assert torch.equal(blocks.rows(128, 200).dequantize(), d[128:])
    with pytest.raises(ValueError, match="scale blocks"):
        blocks.cols(64, 300)
    with pytest.raises(ValueError, match="fits neither"):
        Fp8Weight(blocks.w, torch.ones(3))


def _int_weight(gen, n, k, bits, group, act=False) -> IntWeight:
    return random_int_codes(gen, n, k, bits, group, act).pack(torch.float16)


CASES = [  # (name, n, k, weight factory)
    ("fp8 per channel", 64, 256, lambda g, n, k: Fp8Weight.quantize(torch.randn(n, k, generator=g), "channel")),
    ("fp8 per tensor", 50, 256, lambda g, n, k: Fp8Weight.quantize(torch.randn(n, k, generator=g), "tensor")),
    ("fp8 blocks", 200, 384, lambda g, n, k: Fp8Weight(torch.randn(n, k, generator=g).to(FP8),
                                                       torch.rand(2, 3, generator=g) + 0.5)),
]


@pytest.mark.parametrize("name,n,k,make", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("m", [1, 5, 16, 40, 70])
def test_fused_kernel_against_reference(name, n, k, make, m):
    gen = torch.Generator().manual_seed(n * k + m)
    weight = make(gen, n, k)
    assert kern.supported(weight)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    bias = torch.randn(n, generator=gen).to(torch.bfloat16) if m == 5 else None
    ref = _reference(x, weight.dequantize(), bias)
    got = kern.fused(x, weight, bias)
    scale = ref.abs().max().item()
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    torch.testing.assert_close(got.float(), ref, atol=scale * 1e-2, rtol=1e-2)
    wide = torch.zeros(m, n + 8, dtype=torch.bfloat16)  # strided output rows, another tile shape
    out = wide[:, 4:4 + n]
    assert kern.fused(x, weight, bias, out=out, config=kern.QuantConfig(16, 16, 32, 2, 2)) is out
    torch.testing.assert_close(out.float(), ref, atol=scale * 1e-2, rtol=1e-2)
    assert not wide[:, :4].any() and not wide[:, 4 + n:].any()


@pytest.mark.parametrize("name,n,k,make", CASES, ids=[c[0] for c in CASES])
def test_dequantize_kernel_is_exact(name, n, k, make):
    gen = torch.Generator().manual_seed(n + k)
    weight = make(gen, n, k)
    assert torch.equal(kern.dequantize(weight, torch.float32), weight.dequantize())


def test_fp8_per_token_quantization():
    gen = torch.Generator().manual_seed(9)
    x = (torch.randn(7, 1500, generator=gen) * torch.rand(7, 1, generator=gen) * 10).to(torch.bfloat16)
    x[2] = 0
    q, s = kern.fp8_per_token(x)
    amax = x.float().abs().amax(1, keepdim=True)
    torch.testing.assert_close(s, torch.where(amax > 0, amax / 448, torch.ones_like(amax)))
    assert q.dtype == FP8 and q.shape == x.shape
    # the values: tests/gpu (the interpreter's float32 -> e4m3 cast does not round to nearest near 2**k)


def test_integer_weights_are_not_the_triton_kernels():
    gen = torch.Generator().manual_seed(3)
    assert not kern.supported(_int_weight(gen, 24, 256, 4, 16))


def test_quant_linear_on_the_cpu_dequantizes():
    gen = torch.Generator().manual_seed(11)
    weight = _int_weight(gen, 32, 128, 4, 32)
    x = torch.randn(3, 2, 128, generator=gen)
    y = quant_linear(x, weight)
    torch.testing.assert_close(y, (x.reshape(6, 128) @ weight.dequantize().t()).reshape(3, 2, 32))
    with pytest.raises(ValueError, match="does not match"):
        quant_linear(torch.randn(2, 64), weight)
