"""A checkpoint's JSON files (config.json, the safetensors index, tokenizer_config.json, generation_config.json,
chat_template.json) read as one JSON object each, every fault a CheckpointError naming the file. Torch-free, below
both engine.loader and engine.tokenizer, which read them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.errors import CheckpointError


def read_json(path: Path, what: str = "") -> dict[str, Any]:
    """The JSON object in ``path``; CheckpointError when it cannot be read, is not JSON (``what`` is added to that
    message) or is not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise CheckpointError(path, f"cannot be read: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(path, f"is not valid JSON ({e}){what}") from None
    if not isinstance(data, dict):
        raise CheckpointError(path, "is not a JSON object")
    return data
