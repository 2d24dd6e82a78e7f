"""The C heap's free pages back to the system: glibc's ``malloc_trim(0)``, a no-op elsewhere (musl, macOS).

glibc keeps the memory freed in the middle of its heap (a tensor dropped, a load's temporaries) in the process's
resident set until a trim; the engine trims after a load, once its KV cache is allocated where the rotary table is
resized then (built for more positions than the cache holds: a GPU's or tensor parallelism's) and when its step loop
goes idle. About a millisecond a call."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_trim = None  # the libc function, False where there is none


def trim() -> None:
    global _trim
    if _trim is None:
        _trim = False
        if sys.platform.startswith("linux"):
            try:
                _trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
            except (OSError, AttributeError):
                pass  # not glibc (musl has no malloc_trim)
    if _trim:
        _trim(0)
