"""transformers references: the model (float32, eval) and the tokenizer of a Hugging Face directory or of a
.gguf file."""

from __future__ import annotations

from pathlib import Path


def load_hf_model(path: Path):
    """transformers AutoModelForCausalLM of ``path`` (a HF directory or a .gguf file), float32, eval."""
    import torch
    from transformers import AutoModelForCausalLM

    if path.suffix == ".gguf":
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                     dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return model.eval()


def load_hf_tokenizer(path: Path):
    """transformers AutoTokenizer of ``path`` (a HF directory or a .gguf file)."""
    from transformers import AutoTokenizer

    if path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(str(path))
