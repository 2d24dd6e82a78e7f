"""How an embedding is pooled from a model's final hidden states: read from a sentence-transformers
configuration beside the checkpoint, else the engine's ``--pooling`` choice.

sentence-transformers describes a model as a pipeline in ``modules.json``: a Transformer module, a Pooling
module (its ``config.json`` says last-token, mean or CLS pooling) and optionally a Normalize module. An
embedding model published that way (Qwen3-Embedding, gte-Qwen2, e5-mistral, ...) is served exactly as
sentence-transformers would run it: same pooling, same normalisation. A decoder without that file is pooled as
``--pooling`` says (last token by default: what decoder embedding models are trained for) and normalised
(OpenAI's embeddings are unit vectors). A pipeline this engine cannot reproduce (max or weighted pooling, a Dense
projection after pooling) is recorded as ``unsupported`` so that an embedding request gets a 400 saying why,
while the model still loads and generates.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

POOLING_MODES = ("last", "mean", "cls")

_ST_MODES = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
_ST_OTHER = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens")
_ST_PREFIX = "sentence_transformers.models."


@dataclass(frozen=True)
class Pooling:
    mode: str  # "last" | "mean" | "cls"
    normalize: bool  # L2-normalise the pooled vector
    source: str  # where the choice came from: "sentence-transformers" or "--pooling"
    unsupported: str | None = None  # why embeddings cannot be served for this model (None: they can)


def pooling_for(model_path: Path | None, default_mode: str = "last") -> Pooling:
    """The pooling of the checkpoint at ``model_path`` (a directory may carry a sentence-transformers
    configuration; a .gguf file never does), else ``default_mode`` with normalisation."""
    if default_mode not in POOLING_MODES:
        raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}, not {default_mode!r}")
    modules = model_path / "modules.json" if model_path is not None and model_path.is_dir() else None
    if modules is None or not modules.is_file():
        return Pooling(default_mode, True, "--pooling")
    return _from_sentence_transformers(model_path, json.loads(modules.read_text(encoding="utf-8")))


def _from_sentence_transformers(root: Path, modules: list[dict]) -> Pooling:
    src = "sentence-transformers"
    kinds = [str(m.get("type", "")).removeprefix(_ST_PREFIX) for m in modules]
    pool = next((m for m, k in zip(modules, kinds) if k == "Pooling"), None)
    if pool is None:
        return Pooling("last", True, src, "its modules.json has no Pooling module")
    extra = [k for k in kinds if k not in ("Transformer", "Pooling", "Normalize")]
    if extra:
        return Pooling("last", True, src, f"its sentence-transformers pipeline has a {extra[0]} module, which "
                                          "Kestrel does not run")
    cfg_file = root / pool.get("path", "1_Pooling") / "config.json"
    cfg = json.loads(cfg_file.read_text(encoding="utf-8")) if cfg_file.is_file() else {}
    normalize = "Normalize" in kinds
    # sentence-transformers >= 3 writes "pooling_mode": "lasttoken"; older files set the boolean flags
    named = {"lasttoken": "last", "mean": "mean", "cls": "cls"}.get(cfg.get("pooling_mode", ""))
    modes = [named] if named else [mode for key, mode in _ST_MODES.items() if cfg.get(key)]
    other = [k for k in _ST_OTHER if cfg.get(k)]
    if other or len(modes) != 1 or cfg.get("include_prompt") is False:
        why = other[0] if other else ("include_prompt false" if cfg.get("include_prompt") is False
                                      else "not exactly one pooling mode")
        return Pooling(modes[0] if modes else "last", normalize, src,
                       f"its pooling configuration ({cfg_file.name}: {why}) is not one Kestrel runs "
                       "(last token, mean or CLS)")
    return Pooling(modes[0], normalize, src)
