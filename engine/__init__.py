"""Kestrel's inference engine. Importable without a GPU and without Qt."""

import os as _os
import sys as _sys

# OpenMP threads that finished a parallel region sleep instead of spinning (OMP_WAIT_POLICY=PASSIVE), unless the
# user chose a policy (or torch, hence libgomp, was loaded before the engine: then it is too late). On the CPU a
# decode step's GEMVs and attention run on gemm_pool's threads, and the torch / OpenMP ops around them (the
# sampler's argmax, .float(), the elementwise ops) left a libgomp worker spinning on the core the next GEMV
# needed: on the 2-core Zen 5 dev VM the 1B Q4_0 tape replay took 16 ms inside the decode loop against 11 ms
# back to back, and decode went 54-59 -> 63-74 tok/s with PASSIVE (docs/benchmarks/cpu_gguf_models_2026-12-03.md,
# 2026-12-03b). A user who wants OpenMP's spinning sets OMP_WAIT_POLICY=ACTIVE (the KESTREL_OMP_PASSIVE switch and its
# KESTREL_OMP_WAIT_POLICY_SET marker went: issue 46). OMP_WAIT_POLICY_BY_ENGINE says whether this process's policy
# is the engine's choice (the llama.cpp peer of the bench drops it again: llama.cpp runs with its own defaults).
OMP_WAIT_POLICY_BY_ENGINE = False
if "OMP_WAIT_POLICY" not in _os.environ and "torch" not in _sys.modules:
    _os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    OMP_WAIT_POLICY_BY_ENGINE = True

from engine.sampling_params import SamplingParams  # noqa: E402

__all__ = ["LLM", "SamplingParams", "EngineConfig"]
__version__ = "0.1.0"


def __getattr__(name):  # keep `import engine` light: torch loads only when the engine is used
    if name == "LLM":
        from engine.llm import LLM
        return LLM
    if name == "EngineConfig":
        from engine.config import EngineConfig
        return EngineConfig
    raise AttributeError(name)
