"""Hugging Face checkpoint directories: config.json + model.safetensors (or shards listed in
model.safetensors.index.json), memory-mapped through ``safetensors.safe_open``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from engine.checkpoint_json import read_json
from engine.errors import CheckpointError
from engine.loader.weights import WeightSource

INDEX_FILE = "model.safetensors.index.json"

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": getattr(torch, "float8_e4m3fn", None),
    "F8_E5M2": getattr(torch, "float8_e5m2", None),
}


class SafetensorsWeights(WeightSource):
    """The tensors of one or more .safetensors files, read lazily through memory maps."""

    def __init__(self, directory: Path):
        self.path = Path(directory)
        index_path = self.path / INDEX_FILE
        if index_path.is_file():
            index = read_json(index_path)
            weight_map = index.get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(index_path, "has no 'weight_map'")
            files = sorted(set(weight_map.values()))
            missing = [f for f in files if not (self.path / f).is_file()]
            if missing:
                more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
                raise CheckpointError(
                    self.path / missing[0],
                    f"shard listed in {INDEX_FILE} is missing: {', '.join(missing[:3])}{more} "
                    "(incomplete download? download the model again)",
                )
        else:
            weight_map = None
            files = sorted(p.name for p in self.path.glob("*.safetensors"))
            if not files:
                bins = sorted(p.name for p in self.path.glob("*.bin"))
                extra = (f"; it has PyTorch .bin weights ({', '.join(bins[:2])}), convert them to safetensors"
                         if bins else "")
                raise CheckpointError(self.path, f"has no *.safetensors weights{extra}")

        self._handles: dict[str, Any] = {}
        self._where: dict[str, str] = {}
        keys: dict[str, set[str]] = {}
        for fname in files:
            handle = self._open(self.path / fname)
            self._handles[fname] = handle
            keys[fname] = set(handle.keys())
            for key in keys[fname]:
                self._where.setdefault(key, fname)
        if weight_map is not None:
            for name, fname in weight_map.items():
                if name not in keys[fname]:
                    raise CheckpointError(
                        self.path / fname, f"lacks tensor {name!r} that {INDEX_FILE} says it holds"
                    )
                self._where[name] = fname
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._dtypes: dict[str, str] = {}

    def _open(self, file: Path):
        try:
            return safe_open(str(file), framework="pt", device="cpu")
        except SafetensorError as e:
            raise CheckpointError(
                file, f"is not a valid safetensors file ({e}); it may be truncated or corrupt, download it again"
            ) from None
        except OSError as e:
            raise CheckpointError(file, f"cannot be read: {e.strerror or e}") from None

    def names(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def file_of(self, name: str) -> Path:
        return self.path / self._file(name)

    def _file(self, name: str) -> str:
        try:
            return self._where[name]
        except KeyError:
            raise self._missing(name) from None

    def _meta(self, name: str) -> None:
        fname = self._file(name)
        try:
            sl = self._handles[fname].get_slice(name)
            self._shapes[name] = tuple(sl.get_shape())
            self._dtypes[name] = sl.get_dtype()
        except SafetensorError as e:
            raise CheckpointError(self.path / fname, f"cannot read tensor {name!r}: {e}") from None

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self._shapes:
            self._meta(name)
        return self._shapes[name]

    def dtype(self, name: str) -> torch.dtype:
        if name not in self._dtypes:
            self._meta(name)
        dtype = _DTYPES.get(self._dtypes[name])
        if dtype is None:
            raise CheckpointError(self.file_of(name), f"tensor {name!r} has unsupported dtype {self._dtypes[name]}")
        return dtype

    def get(self, name: str) -> torch.Tensor:
        fname = self._file(name)
        try:
            return self._handles[fname].get_tensor(name)
        except SafetensorError as e:
            raise CheckpointError(self.path / fname, f"cannot read tensor {name!r}: {e}") from None

    def get_slice(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
        shape = self._check_slice(name, dim, start, stop)
        dim %= len(shape)
        fname = self._file(name)
        index = tuple([slice(None)] * dim + [slice(start, stop)])
        try:
            return self._handles[fname].get_slice(name)[index].contiguous()
        except SafetensorError as e:
            raise CheckpointError(self.path / fname, f"cannot read tensor {name!r}: {e}") from None

    def close(self) -> None:
        self._handles.clear()
