"""Memory a server returns: glibc keeps freed large blocks by default.

glibc serves a block of 128 KiB or more by mmap and returns it on free, but after the first such free it raises
that threshold to the block's size (up to 32 MiB), so the next 10 MiB request bodies, their parsed strings and
copies come from the heap and arenas, which keep them: a server refusing 10 MiB inputs grew ~90 MiB over 15 of
them and stayed there. A fixed threshold of 1 MiB keeps every large block mmapped (returned on free); the cost is
an mmap / munmap pair per large block, nothing next to parsing a megabyte of JSON.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc malloc.h
LARGE_BLOCK = 1 << 20


def return_large_blocks() -> bool:
    """Fix glibc's mmap threshold at LARGE_BLOCK (Linux with glibc; elsewhere nothing). True when it was set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = bool(libc.mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK))
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    if not ok:
        log.debug("mallopt(M_MMAP_THRESHOLD) refused")
    return ok
