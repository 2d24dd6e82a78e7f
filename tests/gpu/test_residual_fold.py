"""The residual add folded into the row-parallel GEMMs of a prefill (ops.linear_into: o_proj and down_proj add
their product into the residual stream themselves, cuBLAS with beta = 1): a 600-token prompt's logits with the
fold equal those without it, on the tiny model of every architecture, in float32 and bfloat16."""

from __future__ import annotations

import random

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from engine import ops
from engine.ops import gemm
from tests.support.tiny_models import TINY_ARCHS


@pytest.mark.parametrize("arch", TINY_ARCHS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_folded_residual_equals_the_separate_add(tiny_model_dir, arch, dtype, monkeypatch):
    from engine.llm import LLM

    rng = random.Random(arch)
    with LLM(str(tiny_model_dir(arch)), dtype=dtype, device="cuda", kv_cache_memory_gib=0.25,
             max_num_batched_tokens=1024) as llm:
        ids = [rng.randrange(10, llm.core.model_config.vocab_size) for _ in range(600)]
        folds = []
        real = ops.linear_into
        monkeypatch.setattr(ops, "linear_into", lambda *a: folds.append(real(*a)) or folds[-1])
        folded = llm.core.score(ids)
        assert folds and all(folds), "the prefill's row-parallel GEMMs did not fold the residual add"
        monkeypatch.setattr(gemm, "FOLD_MIN_ROWS", 1 << 30)
        folds.clear()
        plain = llm.core.score(ids)
        assert folds and not any(folds)
    err = ((folded - plain).abs().max() / plain.abs().max()).item()
    assert err <= (1e-5 if dtype == "float32" else 2e-2), err
