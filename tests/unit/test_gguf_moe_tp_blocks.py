"""A GGUF file's expert blocks under tensor parallelism, at load (engine/layers/moe_gguf.py load_gguf_experts on a
real FusedMoE of one rank and the random Qwen3-MoE file of `kestrel bench offline`, experts 768 wide as
Qwen3-30B-A3B's): each rank keeps its gate / up rows and down columns as blocks where the columns are whole blocks
(Q4_K at TP=3: 256 a rank; Q8_0 at TP=2: 384 = 12 blocks of 32), and a split off the blocks (Q4_K at TP=2: 384 of
256-column blocks) is refused with a plain error before any expert loads, naming the sizes that split and
--quantization none; with the blocks not kept (--quantization none) the caller dequantizes, no refusal. No engine
is built (tests/parallel/test_moe_gguf_tp.py runs the engines)."""

from __future__ import annotations

import pytest
import torch

from engine.bench.gguf_models import ensure_random_llama
from engine.bench.gguf_moe_models import RandomQwen3Moe, small_moe_shape
from engine.errors import ModelLoadError
from engine.layers.moe import FusedMoE
from engine.layers.moe_gguf import load_gguf_experts
from engine.loader.gguf import GGUFWeights
from engine.loader.gguf_file import GGUFFile
from engine.ops import GGUFWeight
from engine.parallel.context import TPContext

WIDTH = 768


@pytest.fixture(scope="module", params=["Q4_K", "Q8_0"])
def weights(request, tmp_path_factory):
    spec = RandomQwen3Moe(request.param, small_moe_shape(expert_ffn=WIDTH, layers=1, experts=2, seed=5))
    gf = GGUFFile(ensure_random_llama(spec, tmp_path_factory.mktemp("moe-tp")))
    w = GGUFWeights(gf, 4, 2)
    yield request.param, gf, w
    gf.close()


def _names(e: int) -> tuple[str, str, str]:
    return tuple(f"model.layers.0.mlp.experts.{e}.{p}_proj.weight" for p in ("gate", "up", "down"))


def _moe(size: int, rank: int) -> FusedMoE:
    return FusedMoE(2, 256, WIDTH, torch.float32, TPContext(rank=rank, size=size))


def test_column_block_of_kept_tensors(weights):
    qtype, _, w = weights
    down = _names(0)[2]
    w.keep_quantized = False
    assert w.column_block(down, GGUFWeight.KERNEL_TYPES) is None
    w.keep_quantized = True
    want = {"Q4_K": ("Q4_K", 256, 144), "Q8_0": ("Q8_0", 32, 34)}[qtype]
    assert w.column_block(down, GGUFWeight.KERNEL_TYPES) == want
    assert w.column_block("model.layers.0.input_layernorm.weight", GGUFWeight.KERNEL_TYPES) is None


@pytest.mark.parametrize("size, rank", [(2, 1), (3, 1)])
def test_rank_keeps_its_blocks_or_is_refused(weights, size, rank):
    qtype, _, w = weights
    w.keep_quantized = True
    moe = _moe(size, rank)
    if qtype == "Q4_K" and size == 2:
        with pytest.raises(ModelLoadError, match=r"Q4_K blocks \(256 columns each\) cannot be split over "
                                                 r"tensor_parallel_size=2: each rank's 384 of the experts' 768 "
                                                 r"columns.*block boundaries \(1, 3\), or with --quantization none "
                                                 r"to dequantize the experts at load \(about 7\.1x"):
            load_gguf_experts(moe, w, _names)
        assert moe.quantized_experts is None and moe.w13.numel() > 0  # untouched
        return
    assert load_gguf_experts(moe, w, _names)
    i0, i1 = moe.cols
    assert (i0, i1) == (rank * WIDTH // size, (rank + 1) * WIDTH // size)
    gate_up, down = moe.quantized_experts[1]
    assert tuple(gate_up.shape) == (2 * (i1 - i0), 256) and tuple(down.shape) == (256, i1 - i0)
    assert gate_up.type_name == down.type_name == qtype
    # the down blocks are the file's, columns [i0, i1) of expert 1
    torch.testing.assert_close(down.dequantize(), w.get(_names(1)[2])[:, i0:i1], atol=0, rtol=0)


def test_not_kept_is_left_to_the_caller(weights):
    _, _, w = weights
    w.keep_quantized = False
    moe = _moe(2, 0)
    assert not load_gguf_experts(moe, w, _names)
    assert moe.quantized_experts is None
