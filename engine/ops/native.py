"""The dispatch mechanism every op in engine.ops shares: loading engine._C (or falling back to the references),
the dtype codes, the CUDA stream getter, the device checks and the cold validation helpers.

Each op (engine/ops/norm.py, rotary.py, attention.py, gemm.py) is written the same way:

1. ``if _C is None``: the pure-torch reference (engine/ops/reference.py);
2. one compact boolean test of cheap attributes (dtype code, shape, strides); only when it fails does the op's
   cold validator (built from the ``_check_*`` helpers below) work out what exactly is wrong and raise
   ValueError, or accept the input (e.g. a size-1 dim whose stride the compact test did not like);
3. by the first tensor's device: ``_cuda_ready`` then ``_C.cuda_<op>(common args..., device, _stream(t))``, or
   (a cheap ``is_cpu`` test, ``_not_cpu`` when it fails) ``_C.<op>(common args...)``.

The calls to engine._C are written out in full in both branches, on purpose: splatting a shared tuple of
arguments (``_C.x(*args, eps)``) cost ~0.2 us more per call through pybind11 than positional arguments
(measured, CPython 3.11), and a helper choosing the device would add a Python call per op; this is the decode
hot path (~10 calls per layer, ~2-4 us each on small CPU tensors).

The op modules bind ``_C`` at import (a module global: reading ``native._C`` instead costs an attribute load
per use); a test that simulates a build without engine._C patches ``_C`` in each of them
(tests/unit/test_ops.py does).

Not registered with torch.library (``torch.library.custom_op`` / ``register_fake`` in a "kestrel" namespace):
the custom-op dispatcher costs ~40-60 us per call on CPU (torch 2.13, measured on rms_norm with ``out=``: 2.7 us
eager, 44 us through ``torch.ops.kestrel.*``, 61 us through the custom_op object) against a few microseconds for
the whole op here, and nothing in Kestrel traces or compiles these calls. Register thin wrappers beside these
functions (the eager functions unchanged) if torch.compile ever needs them.
"""

from __future__ import annotations

import logging
import warnings

import torch

from engine import envs

log = logging.getLogger(__name__)

try:
    from engine import _C
except ImportError as _exc:  # not built: fall back to the references, loudly
    if envs.KESTREL_REQUIRE_NATIVE:
        raise ImportError(f"engine._C (Kestrel's native kernels) is not importable: {_exc}") from _exc
    _C = None
    _msg = (
        f"engine._C is not importable ({_exc}); engine.ops runs the slow pure-torch reference kernels. "
        "Build the native module with `pip install -e .` (or `pip install .`)."
    )
    log.warning(_msg)
    warnings.warn(_msg, RuntimeWarning, stacklevel=2)

_DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
# What the ops call: engine._C's dtype code, None for a dtype it lacks. The dict's bound get, not
# `_DTYPE_CODE.get(...)` in the op modules: there `_DTYPE_CODE` is an imported name, and CPython compiles
# `imported_name.attr(...)` as an attribute load plus a call (it assumes a module), a new bound method per call.
_dtype_code = _DTYPE_CODE.get
_HAS_CUDA = bool(_C is not None and _C.has_cuda)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def native_available() -> bool:
    """True when engine._C is loaded (the kernels below are native, not the torch references)."""
    return _C is not None


def cuda_available() -> bool:
    """True when engine._C was compiled with the CUDA kernels."""
    return _HAS_CUDA


def cpu_isa() -> str:
    """The ISA level the CPU dispatcher uses ('avx512', 'avx2', 'scalar'), or 'reference' without _C."""
    return _C.cpu_isa() if _C is not None else "reference"


def available_isas() -> list[str]:
    return list(_C.available_isas()) if _C is not None else []


def linear_isa() -> str:
    """The level the CPU linear kernels use: cpu_isa(), or 'avx512bf16' (AVX-512 with the bf16 dot product
    vdpbf16ps) where the CPU has it; 'reference' without _C."""
    return _C.linear_isa() if _C is not None else "reference"


def set_num_threads(n: int) -> None:
    """Threads the native CPU kernels may use (they use fewer when the work is small)."""
    if n < 1:
        raise ValueError(f"set_num_threads: n must be >= 1, got {n}")
    if _C is not None:
        _C.set_num_threads(int(n))


# ------------------------------------------------------------------------------------------------
# Device dispatch


def _stream(t: torch.Tensor) -> int:
    """The current CUDA stream of t's device, as the raw handle engine._C takes."""
    if _raw_stream is not None:
        return _raw_stream(t.get_device())
    return torch.cuda.current_stream(t.device).cuda_stream


def _cuda_ready(op: str, first: torch.Tensor, *others: torch.Tensor) -> None:
    """first is a CUDA tensor: the others must be on its device and the CUDA kernels must exist."""
    dev = first.device
    for t in others:
        if t.device != dev:
            _fail(op, f"all tensors must be on {dev}, got one on {t.device}")
    if not _HAS_CUDA:
        _fail(op, "got CUDA tensors, but engine._C was built without CUDA (no CUDA compiler at build time). "
                  "Rebuild on a machine with the CUDA toolkit (nvcc on PATH), or run on CPU.")


def _not_cpu(op: str, *tensors: torch.Tensor):
    """Called when the CPU branch's is_cpu test failed: raise for the first tensor not on the CPU."""
    for t in tensors:
        if not t.is_cpu:
            _fail(op, f"tensors must all be on CPU or all on one CUDA device, got one on {t.device}")


# ------------------------------------------------------------------------------------------------
# Cold validation: what the ops' validators are built from (never on the hot path of a valid call).


def _fail(op: str, msg: str):
    raise ValueError(f"{op}: {msg}")


def _check_dtype(op: str, name: str, t: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    if dtype is None:
        if t.dtype not in _DTYPE_CODE:
            _fail(op, f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    elif t.dtype != dtype:
        _fail(op, f"{name} must be {dtype}, got {t.dtype}")


def _check_shape(op: str, name: str, t: torch.Tensor, shape: tuple) -> None:
    """shape: ints, or None for 'any size'."""
    ok = t.dim() == len(shape) and all(s is None or t.shape[i] == s for i, s in enumerate(shape))
    if not ok:
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        _fail(op, f"{name} must have shape {want}, got {list(t.shape)}")


def _check_last_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        _fail(op, f"{name}'s last dimension must be contiguous (row-strided views are fine)")


def _check_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        _fail(op, f"{name} must be contiguous")
