"""A tensor-parallel engine refuses a size that would split a GGUF file's expert blocks before it starts a worker
process (engine/executor/tp_executor.py runs engine/runner/load_checks.py check_expert_split next to check_tp_size):
the random Qwen3-MoE file of `kestrel bench offline` with 768-wide Q4_K experts (Qwen3-30B-A3B's width) at TP=2,
the error raised from the pre-start check, never from the workers' start-up or a rank's model build."""

from __future__ import annotations

import pytest

from engine import LLM
from engine.bench.gguf_models import ensure_random_llama
from engine.bench.gguf_moe_models import RandomQwen3Moe, small_moe_shape
from engine.errors import ModelLoadError


def test_refused_before_any_worker_starts(tmp_path):
    path = ensure_random_llama(RandomQwen3Moe("Q4_K", small_moe_shape(expert_ffn=768, layers=1, experts=2, seed=5)),
                               tmp_path)
    with pytest.raises(ModelLoadError, match=r"Q4_K blocks \(256 columns each\) cannot be split over "
                                             r"tensor_parallel_size=2.*boundaries \(1, 3\), or with "
                                             r"--quantization none") as err:
        LLM(str(path), device="cpu", dtype="float32", kv_cache_memory_gib=0.05, tensor_parallel_size=2,
            comm_strategy="host")
    frames = [entry.name for entry in err.traceback]
    assert "check_expert_split" in frames
    assert "_start" not in frames and "load_weights" not in frames  # no worker started, no model built
