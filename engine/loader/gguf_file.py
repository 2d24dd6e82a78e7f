"""A GGUF file's header: metadata and tensor table, parsed from a memory map, with every offset checked
so a truncated or corrupt file gives a CheckpointError that says so (never a struct/numpy traceback).

Why not ``gguf.GGUFReader``: it builds numpy views for every string of the vocabulary and merge
table, about 3 s for a 49k-token vocabulary; this reads the same header in ~0.1 s. Tensor data stays
in the memory map and is dequantized with ``gguf.quants.dequantize``, as transformers does.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from enum import IntEnum
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import CheckpointError

GGUF_MAGIC = b"GGUF"
_SUPPORTED_VERSIONS = (2, 3)
_DEFAULT_ALIGNMENT = 32

# metadata value type id -> (struct format, width)
_SCALAR = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4),
           6: ("<f", 4), 7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8",
          11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9


class GGMLQuantizationType(IntEnum):
    """ggml's tensor type ids (ggml.h) under gguf-py's names: a copy of ``gguf.GGMLQuantizationType`` (gguf 0.19),
    as GGML_QUANT_SIZES and LLAMA_FILE_TYPES below are of gguf's tables, so that reading a file (header, float
    tensors, the blocks the native kernels take) needs no ``import gguf``: that package imports all its modules and
    PyYAML on any import, 1.5 MiB of a SmolLM2 process. gguf is imported where a block type is dequantized
    (engine.loader.gguf). IntEnum: its members equal gguf's and plain ids. tests/unit/test_loader.py holds the
    three copies equal to gguf's tables."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41


# ggml type -> (values per block, bytes per block): gguf.GGML_QUANT_SIZES
GGML_QUANT_SIZES: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 40), 10: (256, 84),
    11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292), 16: (256, 66), 17: (256, 74),
    18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2),
    26: (1, 4), 27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17),
    40: (64, 36), 41: (128, 18),
}
# general.file_type -> gguf.LlamaFileType's name
LLAMA_FILE_TYPES: dict[int, str] = {
    0: "ALL_F32", 1: "MOSTLY_F16", 2: "MOSTLY_Q4_0", 3: "MOSTLY_Q4_1", 7: "MOSTLY_Q8_0", 8: "MOSTLY_Q5_0",
    9: "MOSTLY_Q5_1", 10: "MOSTLY_Q2_K", 11: "MOSTLY_Q3_K_S", 12: "MOSTLY_Q3_K_M", 13: "MOSTLY_Q3_K_L",
    14: "MOSTLY_Q4_K_S", 15: "MOSTLY_Q4_K_M", 16: "MOSTLY_Q5_K_S", 17: "MOSTLY_Q5_K_M", 18: "MOSTLY_Q6_K",
    19: "MOSTLY_IQ2_XXS", 20: "MOSTLY_IQ2_XS", 21: "MOSTLY_Q2_K_S", 22: "MOSTLY_IQ3_XS", 23: "MOSTLY_IQ3_XXS",
    24: "MOSTLY_IQ1_S", 25: "MOSTLY_IQ4_NL", 26: "MOSTLY_IQ3_S", 27: "MOSTLY_IQ3_M", 28: "MOSTLY_IQ2_S",
    29: "MOSTLY_IQ2_M", 30: "MOSTLY_IQ4_XS", 31: "MOSTLY_IQ1_M", 32: "MOSTLY_BF16", 36: "MOSTLY_TQ1_0",
    37: "MOSTLY_TQ2_0", 38: "MOSTLY_MXFP4_MOE", 39: "MOSTLY_NVFP4", 40: "MOSTLY_Q1_0", 1024: "GUESSED",
}


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order (ggml lists the fastest-moving dimension first)
    qtype: int  # ggml type id
    offset: int  # absolute, in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        try:
            return GGMLQuantizationType(self.qtype).name
        except ValueError:
            return f"type#{self.qtype}"

    def expert_part(self, expert: int) -> GGUFTensorInfo:
        """Expert ``expert``'s matrix of a 3-D expert tensor (llama.cpp's ``ffn_{gate,up,down}_exps``, [experts,
        rows, cols]): its bytes lie contiguous in the file (``name[expert]``, shape [rows, cols])."""
        if len(self.shape) != 3 or not 0 <= expert < self.shape[0]:
            raise ValueError(f"{self.name}: no expert {expert} in a tensor of shape {self.shape}")
        each = self.nbytes // self.shape[0]
        return GGUFTensorInfo(f"{self.name}[{expert}]", self.shape[1:], self.qtype, self.offset + expert * each, each)


def _first_bytes(head) -> str:
    """A file's first bytes as a person reads them: "FRP3" when printable, else hex ("89 50 4e 47")."""
    head = bytes(head)
    if head and all(32 <= c < 127 for c in head):
        return '"' + head.decode("ascii") + '"'
    return " ".join(f"{c:02x}" for c in head)


class _Corrupt(Exception):
    pass


class GGUFFile:
    """A parsed GGUF file. ``metadata`` maps keys to Python values (arrays as lists), ``tensors`` maps
    GGUF tensor names to their GGUFTensorInfo; ``raw(name)`` is the tensor's bytes from the map."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                self.file_size = os.fstat(f.fileno()).st_size
                if self.file_size < 24:
                    raise CheckpointError(self.path, f"is not a GGUF file: only {self.file_size} bytes")
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise CheckpointError(self.path, f"cannot be read: {e.strerror or e}") from e
        self._buf = memoryview(self._map)
        self._released: tuple[int, int] | None = None  # span of the tensors release() dropped (offsets)
        try:
            self._parse()
        except _Corrupt as e:
            raise CheckpointError(
                self.path, f"is not a valid GGUF file ({e}); it may be truncated or corrupt"
            ) from None
        except (struct.error, UnicodeDecodeError, ValueError, IndexError, OverflowError) as e:
            raise CheckpointError(
                self.path, f"has a corrupt or truncated GGUF header ({type(e).__name__}: {e})"
            ) from None

    # parsing ------------------------------------------------------------------------------------
    def _need(self, pos: int, n: int) -> None:
        if n < 0 or pos + n > self.file_size:
            raise _Corrupt(f"header needs bytes {pos}..{pos + n} but the file has {self.file_size}")

    def _unpack(self, fmt: str, pos: int, width: int):
        self._need(pos, width)
        return struct.unpack_from(fmt, self._buf, pos)[0]

    def _string(self, pos: int) -> tuple[str, int]:
        n = self._unpack("<Q", pos, 8)
        self._need(pos + 8, n)
        return bytes(self._buf[pos + 8: pos + 8 + n]).decode("utf-8", errors="replace"), pos + 8 + n

    def _value(self, vtype: int, pos: int) -> tuple[Any, int]:
        if vtype in _SCALAR:
            fmt, width = _SCALAR[vtype]
            return self._unpack(fmt, pos, width), pos + width
        if vtype == _STRING:
            return self._string(pos)
        if vtype == _ARRAY:
            etype = self._unpack("<I", pos, 4)
            count = self._unpack("<Q", pos + 4, 8)
            pos += 12
            if etype in _SCALAR:
                width = _SCALAR[etype][1]
                self._need(pos, count * width)
                arr = np.frombuffer(self._buf, dtype=_NUMPY[etype], count=count, offset=pos)
                values = arr.astype(bool).tolist() if etype == 7 else arr.tolist()
                return values, pos + count * width
            if etype == _STRING:
                out = []
                buf, size = self._buf, self.file_size
                unpack = struct.Struct("<Q").unpack_from
                for _ in range(count):
                    if pos + 8 > size:
                        raise _Corrupt("string array runs past the end of the file")
                    (n,) = unpack(buf, pos)
                    pos += 8
                    if pos + n > size:
                        raise _Corrupt("string array runs past the end of the file")
                    out.append(bytes(buf[pos: pos + n]).decode("utf-8", errors="replace"))
                    pos += n
                return out, pos
            if etype == _ARRAY:  # nested arrays: rare, parse generically
                out = []
                for _ in range(count):
                    v, pos = self._value(_ARRAY, pos)
                    out.append(v)
                return out, pos
            raise _Corrupt(f"unknown metadata array element type {etype}")
        raise _Corrupt(f"unknown metadata value type {vtype}")

    def _parse(self) -> None:
        if bytes(self._buf[:4]) != GGUF_MAGIC:
            raise CheckpointError(self.path, f"is not a GGUF file (it starts with {_first_bytes(self._buf[:4])}, "
                                             'where a GGUF file starts with "GGUF")')
        version = self._unpack("<I", 4, 4)
        if version not in _SUPPORTED_VERSIONS:
            hint = " (big-endian files are not supported)" if version > 0xFFFF else ""
            raise _Corrupt(f"unsupported GGUF version {version}{hint}")
        self.version = version
        n_tensors = self._unpack("<Q", 8, 8)
        n_kv = self._unpack("<Q", 16, 8)
        # each entry takes at least ~12 bytes, so counts beyond the file size are corruption
        if n_tensors > self.file_size // 8 or n_kv > self.file_size // 8:
            raise _Corrupt(f"implausible counts: {n_tensors} tensors, {n_kv} metadata entries")
        pos = 24
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key, pos = self._string(pos)
            vtype = self._unpack("<I", pos, 4)
            metadata[key], pos = self._value(vtype, pos + 4)
        self.metadata = metadata
        self.dropped_arrays: dict[str, int] = {}  # drop_tokenizer_arrays: key -> the list's length

        entries = []
        for _ in range(n_tensors):
            name, pos = self._string(pos)
            n_dims = self._unpack("<I", pos, 4)
            if not 1 <= n_dims <= 4:
                raise _Corrupt(f"tensor {name!r} has {n_dims} dimensions")
            self._need(pos + 4, 8 * n_dims + 12)
            dims = struct.unpack_from(f"<{n_dims}Q", self._buf, pos + 4)
            qtype, offset = struct.unpack_from("<IQ", self._buf, pos + 4 + 8 * n_dims)
            pos += 4 + 8 * n_dims + 12
            entries.append((name, dims, qtype, offset))

        alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0:
            raise _Corrupt(f"bad general.alignment {alignment!r}")
        self.alignment = alignment
        self.data_offset = (pos + alignment - 1) // alignment * alignment

        tensors: dict[str, GGUFTensorInfo] = {}
        for name, dims, qtype, offset in entries:
            shape = tuple(int(d) for d in reversed(dims))
            nbytes = self._nbytes(name, shape, qtype)
            start = self.data_offset + offset
            if start + nbytes > self.file_size:
                raise CheckpointError(
                    self.path,
                    f"is truncated: tensor {name!r} needs bytes up to {start + nbytes} but the file has "
                    f"{self.file_size} (incomplete download? download it again)",
                )
            if name in tensors:
                raise _Corrupt(f"tensor {name!r} appears twice")
            tensors[name] = GGUFTensorInfo(name, shape, qtype, start, nbytes)
        self.tensors = tensors

    def _nbytes(self, name: str, shape: tuple[int, ...], qtype: int) -> int:
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
        except (ValueError, KeyError):
            raise CheckpointError(
                self.path, f"tensor {name!r} has unknown ggml type id {qtype} (a newer llama.cpp format?)"
            ) from None
        if shape[-1] % block:
            raise _Corrupt(f"tensor {name!r} row length {shape[-1]} is not a multiple of the block size {block}")
        return prod(shape) // block * type_size

    # data ---------------------------------------------------------------------------------------
    def raw(self, name: str) -> np.ndarray:
        """The stored bytes of a tensor as a read-only uint8 array of shape (*shape[:-1], bytes_per_row)."""
        return self.raw_of(self.tensors[name])

    def raw_of(self, info: GGUFTensorInfo) -> np.ndarray:
        """``raw`` of a tensor described by ``info``: one of ``tensors``, or a part of one (``expert_part``)."""
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(info.qtype)]
        row_bytes = info.shape[-1] // block * type_size
        arr = np.frombuffer(self._buf, dtype=np.uint8, count=info.nbytes, offset=info.offset)
        return arr.reshape(*info.shape[:-1], row_bytes)

    def release(self, name: str) -> None:
        """Drop a tensor's pages from this process's resident set once its data was copied out (MADV_DONTNEED on
        the read-only map: the bytes stay in the page cache, and a later ``raw`` reads them back). Without it a
        loaded model's resident memory also counts the whole file, read through the map, beside its weights.

        What is dropped is the whole span of the tensors released so far, not just this one: the page cache holds
        a file in large folios, and a fault in one maps all of its pages, so reading the next tensor mapped the
        released tail of the one before it again (measured, SmolLM2 Q4_1 with kernels: 34 of the file's 94 MiB
        still resident after load, every tensor's pages present). Pages of a tensor not yet read that fall in the
        span are only unmapped: a later ``raw`` faults them back in from the page cache."""
        self.release_of(self.tensors[name])

    def release_of(self, info: GGUFTensorInfo) -> None:
        """``release`` of a tensor described by ``info`` (one of ``tensors`` or an ``expert_part``)."""
        advise = getattr(self._map, "madvise", None)
        if advise is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        lo = min(self._released[0], info.offset) if self._released else info.offset
        hi = max(self._released[1], info.offset + info.nbytes) if self._released else info.offset + info.nbytes
        self._released = (lo, hi)
        start = lo // mmap.PAGESIZE * mmap.PAGESIZE
        try:
            advise(mmap.MADV_DONTNEED, start, hi - start)
        except (OSError, ValueError):
            pass  # only a memory hint

    # Metadata arrays of the vocabulary: needed only to build the tokenizer (engine.tokenizer.gguf_vocab) and the
    # config's vocab size, both done before the weights are read.
    TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
                        "tokenizer.ggml.scores")

    def drop_tokenizer_arrays(self) -> None:
        """Forget the vocabulary's metadata lists once the tokenizer is built (49,152 tokens and 48,900 merges of
        SmolLM2 are ~8 MiB of Python strings and ints, kept for the model's life otherwise). Their lengths stay
        readable as ``dropped_arrays[key]``; ``metadata[key]`` is gone."""
        for key in self.TOKENIZER_ARRAYS:
            value = self.metadata.pop(key, None)
            if value is not None:
                self.dropped_arrays[key] = len(value)

    def loaded(self) -> None:
        """Every tensor was copied out: drop the rest of the map (the header's pages, read by the parse) from the
        resident set too. A later ``raw`` faults its pages back in from the page cache."""
        advise = getattr(self._map, "madvise", None)
        if advise is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        try:
            advise(mmap.MADV_DONTNEED, 0, len(self._map))
        except (OSError, ValueError):
            pass  # only a memory hint

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def close(self) -> None:
        try:
            self._buf.release()
            self._map.close()
        except (BufferError, ValueError):
            pass  # arrays still reference the map; it is closed when they are collected
