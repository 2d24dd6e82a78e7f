"""GGUFFile.release: once the loader has copied a tensor's blocks out of the file's memory map, the map's pages do
not stay in the process's resident set (the page cache holds files in large folios, and a fault in one maps all of
its pages: releasing only each tensor's own range left the released tail of a tensor mapped again by the read of
the next one; 34 of SmolLM2's 94 MiB stayed resident after load)."""

from __future__ import annotations

import struct
import sys

import numpy as np
import pytest

from engine.loader.gguf import GGUFWeights
from engine.loader.gguf_file import GGUFFile
from engine.ops import GGUFWeight

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/pagemap")


def _present_pages(gf: GGUFFile) -> int:
    """Pages of this GGUFFile's own memory map that are mapped now (pagemap's present bit). Only its own: other
    objects of the test process (an engine a fixture keeps loaded) may map the same file."""
    start = np.frombuffer(gf._map, dtype=np.uint8).ctypes.data
    n = 0
    with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb") as pm:
        for line in maps:
            lo, hi = (int(a, 16) for a in line.split()[0].split("-"))
            if lo <= start < hi and line.rstrip().endswith(str(gf.path)):
                pm.seek(lo // 4096 * 8)
                data = pm.read((hi - lo) // 4096 * 8)
                n += sum(v >> 63 for (v,) in struct.iter_unpack("<Q", data))
    return n


def test_copied_tensors_leave_the_resident_set(smollm2_gguf):
    gf = GGUFFile(smollm2_gguf)
    try:
        src = GGUFWeights(gf, 9, 3)
        src.keep_quantized = True
        header = min(t.offset for t in gf.tensors.values())
        copied, first = 0, None
        for name in src.names():
            if len(src.shape(name)) == 2:
                got = src.quantized_slice(name, 0, 0, src.shape(name)[0], GGUFWeight.KERNEL_TYPES)
                if got is not None:
                    copied += got[0].nbytes
                    first = first or (name, got[0])
        assert copied > 60 * 2**20  # the linear layers and the token table: most of the file was read
        # what may stay mapped: the header (metadata, vocabulary) and a few pages at the span's edges
        assert _present_pages(gf) * 4096 <= header + 2**20
        # a released tensor reads back the same bytes (from the page cache)
        name, blocks = first
        again = src.quantized_slice(name, 0, 0, src.shape(name)[0], GGUFWeight.KERNEL_TYPES)
        assert again is not None and (again[0] == blocks).all()
    finally:
        gf.close()


def test_loaded_drops_the_header_pages_too(smollm2_gguf):
    """GGUFWeights.loaded (the end of load_weights): the header's pages leave the resident set as well, and a later
    read still returns the file's bytes."""
    gf = GGUFFile(smollm2_gguf)
    try:
        src = GGUFWeights(gf, 9, 3)
        name = next(iter(gf.tensors))
        before = np.array(gf.raw(name), copy=True)
        header = min(t.offset for t in gf.tensors.values())
        assert _present_pages(gf) * 4096 >= header // 2  # the parse read the header through the map
        src.loaded()
        assert _present_pages(gf) * 4096 <= 64 * 1024
        assert (np.asarray(gf.raw(name)) == before).all()
    finally:
        gf.close()


def test_tokenizer_arrays_dropped_after_the_tokenizer_is_built(smollm2_gguf):
    """The vocabulary's metadata lists are not kept beside the tokenizer built from them (their lengths are)."""
    from engine.loader import load_checkpoint

    ck = load_checkpoint(smollm2_gguf)
    gf = ck.weights.file
    assert "tokenizer.ggml.tokens" not in gf.metadata and "tokenizer.ggml.merges" not in gf.metadata
    assert gf.dropped_arrays["tokenizer.ggml.tokens"] == ck.config.vocab_size == 49152
    ids = ck.tokenizer.encode("Hello, world")
    assert ck.tokenizer.decode(ids) == "Hello, world"
    assert gf.metadata["general.architecture"] == "llama"  # the scalar metadata stays
