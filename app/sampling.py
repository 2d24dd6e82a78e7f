"""Sampling settings of the chat: what the UI edits, their defaults from the model's generation_config
(or sensible ones when it has none, as GGUF files do), and the engine's SamplingParams."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

FALLBACK = {"temperature": 0.7, "top_p": 0.95, "top_k": 40, "min_p": 0.05, "max_tokens": 1024}


@dataclass
class SamplingSettings:
    temperature: float = FALLBACK["temperature"]
    top_p: float = FALLBACK["top_p"]
    top_k: int = FALLBACK["top_k"]  # 0: off
    min_p: float = FALLBACK["min_p"]
    max_tokens: int = FALLBACK["max_tokens"]
    seed: int | None = None  # None: random
    stop: list[str] = field(default_factory=list)
    repetition_penalty: float = 1.0  # from generation_config only (not in the form)

    @classmethod
    def from_generation_config(cls, gc: dict[str, Any] | None) -> SamplingSettings:
        """The model's recommended values where it gives them; FALLBACK for the rest. A config that turns
        sampling off (do_sample false) means greedy."""
        gc = gc or {}
        s = cls()
        if gc:
            s.temperature = float(gc.get("temperature", s.temperature))
            s.top_p = float(gc.get("top_p", s.top_p))
            s.top_k = int(gc.get("top_k", 0 if "top_p" in gc else s.top_k))
            s.min_p = float(gc.get("min_p", 0.0 if ("top_p" in gc or "top_k" in gc) else s.min_p))
            s.repetition_penalty = float(gc.get("repetition_penalty", 1.0))
            if gc.get("do_sample") is False:
                s.temperature = 0.0
        return s

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SamplingSettings:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_params(self):
        from engine.sampling_params import SamplingParams

        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
                              max_tokens=self.max_tokens, seed=self.seed, stop=list(self.stop),
                              repetition_penalty=self.repetition_penalty)
