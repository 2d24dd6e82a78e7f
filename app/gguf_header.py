"""A GGUF file's metadata and tensor table, read from a memory map with the standard library only.

The app needs a model's architecture, shape and quantization to list it and to estimate its memory; the
engine's own reader (engine.loader.gguf_file) imports the ``gguf`` package, which imports torch, and the
app process must not. Large arrays (the vocabulary, the merges) are skipped, not decoded.
"""

from __future__ import annotations

import mmap
import struct
from collections import Counter
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any

MAGIC = b"GGUF"

# ggml tensor type ids (ggml.h) -> names
GGML_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K",
              11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS",
              18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8",
              25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0",
              39: "MXFP4", 40: "NVFP4", 41: "Q1_0"}
# general.file_type (llama.cpp's LlamaFileType) -> the name people use for the file's quantization
FILE_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
              11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
              18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
              25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
              32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0"}

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_KEEP_ARRAY = 64  # arrays longer than this are skipped (their length is kept)


class GGUFHeaderError(ValueError):
    pass


@dataclass
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensor_types: dict[str, str]  # tensor name -> ggml type name
    num_params: int
    skipped_arrays: dict[str, int] = field(default_factory=dict)  # key -> length, for long arrays

    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")

    def arch_value(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{key}", default)

    @property
    def quantization(self) -> str | None:
        """general.file_type's name, else the most common type of the tensors."""
        ftype = self.metadata.get("general.file_type")
        if ftype in FILE_TYPES:
            return FILE_TYPES[ftype]
        counts = Counter(self.tensor_types.values())
        return counts.most_common(1)[0][0] if counts else None

    @property
    def vocab_size(self) -> int | None:
        v = self.arch_value("vocab_size")
        return int(v) if v is not None else self.skipped_arrays.get("tokenizer.ggml.tokens")


def read_gguf_header(path: str | Path) -> GGUFHeader:
    path = Path(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _Reader(mm, path).read()
    except (struct.error, IndexError, UnicodeDecodeError, OverflowError, MemoryError):
        raise GGUFHeaderError("the GGUF header is corrupt or cut short") from None
    except ValueError as e:  # mmap of an empty file
        if path.is_file() and path.stat().st_size == 0:
            raise GGUFHeaderError("the file is empty") from None
        raise GGUFHeaderError(str(e)) from None


def first_bytes_words(head: bytes) -> str:
    """The first bytes of a file as a person reads them: "FRP3" when they are printable, else hex ("00 1f 8b")."""
    if head and all(32 <= b < 127 for b in head):
        return '"' + head.decode("ascii") + '"'
    return " ".join(f"{b:02x}" for b in head) or "nothing"


class _Reader:
    def __init__(self, mm: mmap.mmap, path: Path):
        self.mm = mm
        self.pos = 0
        self.path = path

    def _take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.mm):
            raise GGUFHeaderError("the GGUF header is cut short (the file is truncated)")
        (value,) = struct.unpack_from(fmt, self.mm, self.pos)
        self.pos += size
        return value

    def _string(self) -> str:
        n = self._take("<Q")
        if self.pos + n > len(self.mm):
            raise GGUFHeaderError("the GGUF header is cut short (the file is truncated)")
        s = bytes(self.mm[self.pos:self.pos + n]).decode("utf-8")
        self.pos += n
        return s

    def _skip_string(self) -> None:
        n = self._take("<Q")
        self.pos += n

    def _value(self, vtype: int, key: str, skipped: dict[str, int]) -> Any:
        if vtype in _SCALARS:
            return self._take(_SCALARS[vtype])
        if vtype == _STRING:
            return self._string()
        if vtype == _ARRAY:
            etype = self._take("<I")
            n = self._take("<Q")
            if n > _KEEP_ARRAY:
                skipped[key] = n
                if etype in _SCALARS:
                    self.pos += n * struct.calcsize(_SCALARS[etype])
                elif etype == _STRING:
                    for _ in range(n):
                        self._skip_string()
                else:
                    raise GGUFHeaderError(f"the GGUF header is corrupt (nested arrays in {key})")
                return None
            return [self._value(etype, key, skipped) for _ in range(n)]
        raise GGUFHeaderError(f"the GGUF header is corrupt (unknown value type {vtype} for {key})")

    def read(self) -> GGUFHeader:
        if bytes(self.mm[:4]) != MAGIC:
            raise GGUFHeaderError(f"not a GGUF file (it starts with {first_bytes_words(bytes(self.mm[:4]))}, "
                                  'where a GGUF file starts with "GGUF")')
        self.pos = 4
        version = self._take("<I")
        if version not in (2, 3):
            raise GGUFHeaderError(f"GGUF version {version} is not supported (versions 2 and 3 are)")
        n_tensors = self._take("<Q")
        n_kv = self._take("<Q")
        metadata: dict[str, Any] = {}
        skipped: dict[str, int] = {}
        for _ in range(n_kv):
            key = self._string()
            vtype = self._take("<I")
            value = self._value(vtype, key, skipped)
            if value is not None or key not in skipped:
                metadata[key] = value
        types: dict[str, str] = {}
        params = 0
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._take("<I")
            dims = [self._take("<Q") for _ in range(n_dims)]
            ttype = self._take("<I")
            self._take("<Q")  # offset
            types[name] = GGML_TYPES.get(ttype, f"type#{ttype}")
            params += prod(dims)
        return GGUFHeader(self.path, version, metadata, types, params, skipped)
