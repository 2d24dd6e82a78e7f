"""Kestrel's inference engine. Importable without a GPU and without Qt."""

from engine.sampling_params import SamplingParams

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
