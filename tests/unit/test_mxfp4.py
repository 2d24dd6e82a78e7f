"""engine/loader/mxfp4.py's dequantizer against the format read bit by bit (tests/support/mxfp4.py
decode_reference), against transformers' own (integrations.mxfp4.convert_moe_packed_tensors), and the test packer
round trip (values exactly representable come back exactly)."""

import pytest
import torch

from engine.loader.mxfp4 import dequantize_mxfp4
from tests.support.mxfp4 import pack_mxfp4, decode_reference


def _random_packed(seed: int, shape=(3, 5, 4)):
    g = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (*shape, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(110, 140, shape, generator=g, dtype=torch.uint8)
    # the extremes: 2^-127 (float32 subnormals), 1, 2^125 (6 x 2^125 stays under float32's largest value)
    scales.view(-1)[:3] = torch.tensor([0, 127, 252], dtype=torch.uint8)
    return blocks, scales


def test_dequantize_matches_the_format_bit_by_bit():
    blocks, scales = _random_packed(0)
    got = dequantize_mxfp4(blocks, scales, torch.float32)
    assert got.shape == (3, 5, 128)
    assert torch.equal(got.double(), decode_reference(blocks, scales))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantize_matches_transformers(dtype):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    blocks, scales = _random_packed(1, (4, 6, 3))  # [E, N, K / 32]
    scales.clamp_(100, 150)  # (transformers' ldexp in bfloat16: keep clear of its subnormals)
    ours = dequantize_mxfp4(blocks, scales, dtype)  # [E, N, K]
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=dtype)  # transformers' parameter layout [E, K, N]
    assert torch.equal(ours.transpose(1, 2), theirs)


def test_pack_round_trip_is_exact_for_representable_values():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(2, 8, 64, generator=g)
    blocks, scales = pack_mxfp4(w)
    once = dequantize_mxfp4(blocks, scales)
    assert (once - w).abs().max() <= w.abs().max() / 4  # a 4-bit rounding of each block
    again = dequantize_mxfp4(*pack_mxfp4(once))
    assert torch.equal(again, once)


def test_rejects_mismatched_shapes():
    blocks, scales = _random_packed(3)
    with pytest.raises(ValueError, match="do not match"):
        dequantize_mxfp4(blocks, scales[..., :-1])
