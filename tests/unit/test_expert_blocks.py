"""Tensor parallelism over a GGUF file's expert blocks, the one rule (engine/expert_blocks.py) and the check a TP
engine runs before its workers start (engine/runner/load_checks.py check_expert_split), on the random Qwen3-MoE
file of `kestrel bench offline` with 768-wide experts as Qwen3-30B-A3B's: Q4_K (256-column blocks) splits over 1
and 3 ranks, not 2, and the refusal before the workers is the very message a rank's load gives
(engine/layers/moe_gguf.py); Q8_0 (32 columns) and --quantization none split over 2. No engine is built
(tests/parallel/test_expert_split_prestart.py checks that a TP engine refuses before it starts a worker)."""

from __future__ import annotations

import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from engine.bench.gguf_models import ensure_random_llama
from engine.bench.gguf_moe_models import RandomQwen3Moe, small_moe_shape
from engine.config import GGUF_KERNEL_TYPES, EngineConfig
from engine.errors import ModelLoadError
from engine.expert_blocks import KEPT_BLOCKS, kept_block, refusal, sizes_on_blocks, splits_on_blocks
from engine.layers.moe import FusedMoE
from engine.layers.moe_gguf import load_gguf_experts
from engine.loader import load_checkpoint
from engine.parallel.context import TPContext
from engine.runner.load_checks import check_expert_split

WIDTH = 768
CPU = torch.device("cpu")


def test_block_table_is_ggmls_for_every_kernel_type():
    assert set(KEPT_BLOCKS) == set(GGUF_KERNEL_TYPES)
    for name, blocks in KEPT_BLOCKS.items():
        assert blocks == GGML_QUANT_SIZES[GGMLQuantizationType[name]], name


def test_the_rule():
    assert sizes_on_blocks(768, 256) == [1, 3]  # Qwen3-30B-A3B's experts in a K-quant
    assert sizes_on_blocks(768, 32) == [1, 2, 3, 4, 6, 8, 12]  # Q8_0: 16 ranks' 48 columns are 1.5 blocks
    assert sizes_on_blocks(1408, 256) == [1]  # DeepSeek-V2-Lite's
    assert sizes_on_blocks(512, 256, limit=4) == [1, 2]
    assert splits_on_blocks(100, 1, 256) and not splits_on_blocks(768, 2, 256) and splits_on_blocks(768, 2, 32)
    assert not splits_on_blocks(768, 5, 32)  # 768 does not divide by 5 at all
    assert kept_block(["Q4_K", "Q8_0", "F32"]) == ("Q4_K", 256)  # layers of mixed types: the widest block rules
    assert kept_block(["Q8_0"]) == ("Q8_0", 32)
    assert kept_block(["F16", "IQ4_XS"]) is None  # dequantized at load: no block constraint
    text = refusal("m.gguf", "Q4_K", 256, 768, 2, 7.1, "float32")
    assert "each rank's 384 of the experts' 768 columns" in text and "boundaries (1, 3)" in text


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    work = tmp_path_factory.mktemp("expert-split")
    out = {}
    for qtype in ("Q4_K", "Q8_0"):
        spec = RandomQwen3Moe(qtype, small_moe_shape(expert_ffn=WIDTH, layers=1, experts=2, seed=5))
        out[qtype] = load_checkpoint(ensure_random_llama(spec, work))
    yield out
    for ckpt in out.values():
        ckpt.weights.close()


def _config(ckpt, quantization="auto", size=2) -> EngineConfig:
    return EngineConfig(model=str(ckpt.path), dtype="float32", device="cpu", quantization=quantization,
                        tensor_parallel_size=size)


def test_refused_before_the_workers_with_the_ranks_message(checkpoints):
    ckpt = checkpoints["Q4_K"]
    with pytest.raises(ModelLoadError) as before:
        check_expert_split(_config(ckpt), ckpt, CPU, 2)
    # the message a rank gives while it loads its experts (with the blocks kept, as --quantization auto does here)
    ckpt.weights.keep_quantized = True
    try:
        moe = FusedMoE(2, 256, WIDTH, torch.float32, TPContext(rank=1, size=2))
        names = lambda e: tuple(f"model.layers.0.mlp.experts.{e}.{p}_proj.weight" for p in ("gate", "up", "down"))
        with pytest.raises(ModelLoadError) as at_load:
            load_gguf_experts(moe, ckpt.weights, names)
    finally:
        ckpt.weights.keep_quantized = False
    assert str(before.value) == str(at_load.value)
    assert "each rank's 384 of the experts' 768 columns" in str(before.value)
    assert "boundaries (1, 3), or with --quantization none" in str(before.value)
    with pytest.raises(ModelLoadError, match=r"tensor_parallel_size=2"):
        check_expert_split(_config(ckpt, "gguf"), ckpt, CPU, 2)


@pytest.mark.parametrize("qtype, quantization, size", [("Q4_K", "auto", 3), ("Q4_K", "none", 2),
                                                       ("Q4_K", "int8", 2), ("Q8_0", "auto", 2),
                                                       ("Q4_K", "auto", 1)])
def test_sizes_that_split_pass(checkpoints, qtype, quantization, size):
    ckpt = checkpoints[qtype]
    check_expert_split(_config(ckpt, quantization, size), ckpt, CPU, size)
