"""The dispatch mechanism every op in engine.ops shares: loading engine._C (or falling back to the references),
the dtype codes, the CUDA stream getter, the device checks and the cold validation helpers. They are public
(this module's interface to the op modules, not to the rest of the engine, which goes through engine.ops):

- ``native_lib``: the loaded engine._C, or None when it is not built;
- ``dtype_code(dtype)``: engine._C's dtype code, None for a dtype it lacks;
- ``raw_stream(t)``: the current CUDA stream of t's device as the raw handle engine._C takes;
- ``check_cuda(op, first, *others)``: first is a CUDA tensor; the others on its device and a CUDA build;
- ``fail_not_cpu(op, *tensors)``: raise for the first tensor not on the CPU;
- ``fail`` and the ``check_*`` helpers the ops' cold validators are built from;
- ``mode``: process-wide kernel options (``mode.flags``, OR-ed into the dtype code of the CPU linear and
  paged_decode_attention calls; ``set_batch_invariant``).

Each op (engine/ops/norm.py, rotary.py, attention.py, gemm.py) is written the same way:

1. ``if native_lib is None``: the pure-torch reference (engine/ops/reference.py);
2. one compact boolean test of cheap attributes (dtype code, shape, strides); only when it fails does the op's
   cold validator (built from the ``check_*`` helpers below) work out what exactly is wrong and raise
   ValueError, or accept the input (e.g. a size-1 dim whose stride the compact test did not like);
3. by the first tensor's device: ``check_cuda`` then ``native_lib.cuda_<op>(common args..., device,
   raw_stream(t))``, or (a cheap ``is_cpu`` test, ``fail_not_cpu`` when it fails) ``native_lib.<op>(common
   args...)``.

The calls to engine._C are written out in full in both branches, on purpose: splatting a shared tuple of
arguments (``native_lib.x(*args, eps)``) cost ~0.2 us more per call through pybind11 than positional arguments
(measured, CPython 3.11), and a helper choosing the device would add a Python call per op; this is the decode
hot path (~10 calls per layer, ~2-4 us each on small CPU tensors).

The op modules bind ``native_lib`` and the helpers at import (``from engine.ops.native import ...``: module
globals, because reading ``native.native_lib`` instead costs an attribute load per use); a test that simulates
a build without engine._C patches ``native_lib`` in each of them (tests/unit/test_ops.py does).

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

from engine import dtype_codes
from engine.cpu_features import cpu_flags
from engine.kernel_config import DeviceFacts, KernelConfig

log = logging.getLogger(__name__)

try:
    from engine import _C as native_lib
except ImportError as _exc:  # not built: fall back to the references, loudly
    native_lib = None
    _msg = (
        f"engine._C is not importable ({_exc}); engine.ops runs the slow pure-torch reference kernels. "
        "Build the native module with `pip install -e .` (or `pip install .`)."
    )
    log.warning(_msg)
    warnings.warn(_msg, RuntimeWarning, stacklevel=2)

_DTYPE_CODE = dtype_codes.torch_map(torch)  # {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
# What the ops call: engine._C's dtype code, None for a dtype it lacks. The dict's bound get, not
# `DTYPE_CODE.get(...)` in the op modules: there the dict would be an imported name, and CPython compiles
# `imported_name.attr(...)` as an attribute load plus a call (it assumes a module), a new bound method per call.
dtype_code = _DTYPE_CODE.get
# KV caches: the model dtypes' codes, and fp8 e4m3 (--kv-cache-dtype fp8: the CUDA cache-write and decode kernels
# take it with a float32 scale per cache; kCacheFp8E4M3). The CPU kernels have no fp8 cache: the ops run their
# torch references there. The codes: engine/dtype_codes.py (csrc/dtype_codes.h).
FP8_CACHE_CODE = dtype_codes.CACHE_FP8_E4M3
_CACHE_CODE = dtype_codes.torch_map(torch, dtype_codes.CACHE_BY_NAME)
cache_code = _CACHE_CODE.get
_HAS_CUDA = bool(native_lib is not None and native_lib.has_cuda)
_current_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def native_available() -> bool:
    """True when engine._C is loaded (the kernels below are native, not the torch references)."""
    return native_lib is not None


def cuda_available() -> bool:
    """True when engine._C was compiled with the CUDA kernels."""
    return _HAS_CUDA


def cpu_isa() -> str:
    """The ISA level the CPU dispatcher uses ('avx512bf16': AVX-512 with the bf16 dot product vdpbf16ps, 'avx512',
    'avx2', 'scalar'), or 'reference' without engine._C."""
    return native_lib.cpu_isa() if native_lib is not None else "reference"


def available_isas() -> list[str]:
    return list(native_lib.available_isas()) if native_lib is not None else []


def linear_isa() -> str:
    """The level the CPU linear kernels use (the same as cpu_isa()); 'reference' without engine._C."""
    return native_lib.linear_isa() if native_lib is not None else "reference"


def amx_bf16() -> bool:
    """Whether large CPU linear calls in bfloat16 go to torch's oneDNN GEMM on the AMX matrix units (engine/ops/
    gemm.py): KernelConfig.cpu_amx as ``configure`` applied it; before any configure, where the CPU has AMX-BF16
    (Sapphire Rapids and later Xeons; Linux's cpuinfo flag amx_bf16)."""
    return mode.amx


# ------------------------------------------------------------------------------------------------
# Kernel options


# Option bits OR-ed into the dtype code of the CPU linear and paged_decode_attention calls (csrc/cpu/types.h).
BATCH_INVARIANT = dtype_codes.BATCH_INVARIANT  # kBatchInvariant


class KernelMode:
    """Process-wide options of the CPU kernels; the ops read ``mode.flags`` at every call (one attribute load)."""

    __slots__ = ("flags", "amx")

    def __init__(self) -> None:
        self.flags = 0  # option bits for the CPU linear and paged_decode_attention calls
        self.amx = "amx_bf16" in cpu_flags()  # KernelConfig.cpu_amx (configure); the CPU's flag until then


mode = KernelMode()


def set_batch_invariant(on: bool) -> None:
    """Batch-invariant CPU kernels (--deterministic): each row of ``linear`` and of ``paged_decode_attention`` is
    computed the same way whatever the other rows of the call and the thread count (linear: the GEMV kernels
    for every M, never the GEMM ones; attention: context partitions of a fixed length), so a request gets the
    same bits alone or in any batch. Slower for large M (prefill, big batches). CUDA tensors are not covered.
    Process-wide: ModelRunner sets it from its config at every step."""
    mode.flags = BATCH_INVARIANT if on else 0


def batch_invariant() -> bool:
    return bool(mode.flags & BATCH_INVARIANT)


def device_facts(device: torch.device | str) -> DeviceFacts:
    """What engine.kernel_config.resolve needs to know of ``device`` and this machine."""
    import os

    device = torch.device(device)
    capability = None
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        capability = tuple(torch.cuda.get_device_capability(index))
    from engine.ops.varlen_attention import available as triton_available  # Triton importable (and not broken)

    return DeviceFacts(device_type=device.type, cuda_capability=capability, cpu_flags=cpu_flags(),
                       omp_passive=os.environ.get("OMP_WAIT_POLICY", "").lower() == "passive",
                       triton=device.type == "cuda" and triton_available())


def configure(kc: KernelConfig) -> KernelConfig:
    """Apply a resolved kernel configuration to this process, once at engine start (ModelRunner; each TP rank with
    the executor's): the CPU kernels' ISA levels and GEMM threads, the AMX route, the integer tensor-core kernel's
    warps (engine._C's one-time settings; no kernel reads the environment). A level this build or CPU lacks falls
    back to the best one with a warning. Returns the configuration as applied (the levels as the native module
    reports them are in ``cpu_isa()`` / ``gguf_isa``)."""
    mode.amx = kc.cpu_amx == "on" if kc.cpu_amx != "auto" else "amx_bf16" in cpu_flags()
    if native_lib is None:
        return kc
    for setter, value, what in ((native_lib.force_isa, kc.cpu_isa, "cpu_isa"),
                                (native_lib.gguf_force_isa, kc.gguf_isa, "gguf_isa")):
        try:
            setter(value)
        except ValueError as e:
            log.warning("KernelConfig.%s=%s is not a level this build and CPU support (%s); using the best one",
                        what, value, e)
            setter("auto")
    native_lib.set_gemm_threads(kc.gemm_threads)
    if _HAS_CUDA:
        native_lib.cuda_set_int_mma_warps(int(kc.int_mma_warps))
    return kc


def set_num_threads(n: int) -> None:
    """Threads the native CPU kernels may use (they use fewer when the work is small)."""
    if n < 1:
        raise ValueError(f"set_num_threads: n must be >= 1, got {n}")
    if native_lib is not None:
        native_lib.set_num_threads(int(n))


# ------------------------------------------------------------------------------------------------
# Device dispatch


def raw_stream(t: torch.Tensor) -> int:
    """The current CUDA stream of t's device, as the raw handle engine._C takes."""
    if _current_raw_stream is not None:
        return _current_raw_stream(t.get_device())
    return torch.cuda.current_stream(t.device).cuda_stream


def check_cuda(op: str, first: torch.Tensor, *others: torch.Tensor) -> None:
    """first is a CUDA tensor: the others must be on its device and the CUDA kernels must exist."""
    dev = first.device
    for t in others:
        if t.device != dev:
            fail(op, f"all tensors must be on {dev}, got one on {t.device}")
    if not _HAS_CUDA:
        fail(op, "got CUDA tensors, but engine._C was built without CUDA (no CUDA compiler at build time). "
                 "Rebuild on a machine with the CUDA toolkit (nvcc on PATH), or run on CPU.")


def fail_not_cpu(op: str, *tensors: torch.Tensor):
    """Called when the CPU branch's is_cpu test failed: raise for the first tensor not on the CPU."""
    for t in tensors:
        if not t.is_cpu:
            fail(op, f"tensors must all be on CPU or all on one CUDA device, got one on {t.device}")


# ------------------------------------------------------------------------------------------------
# Cold validation: what the ops' validators are built from (never on the hot path of a valid call).


def fail(op: str, msg: str):
    raise ValueError(f"{op}: {msg}")


def check_dtype(op: str, name: str, t: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    if dtype is None:
        if t.dtype not in _DTYPE_CODE:
            fail(op, f"{name} must be float32, bfloat16 or float16, got {t.dtype}")
    elif t.dtype != dtype:
        fail(op, f"{name} must be {dtype}, got {t.dtype}")


def check_scales(op: str, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None, device: torch.device) -> None:
    """An fp8 cache's scales: float32 tensors of one element on the caches' device."""
    for name, t in (("k_scale", k_scale), ("v_scale", v_scale)):
        if t is None:
            fail(op, f"an fp8 KV cache needs {name} (a float32 tensor of one element)")
        if t.dtype != torch.float32 or t.numel() != 1 or t.device != device:
            fail(op, f"{name} must be a float32 tensor of one element on {device}, got {t.dtype} "
                     f"{list(t.shape)} on {t.device}")


def check_shape(op: str, name: str, t: torch.Tensor, shape: tuple) -> None:
    """shape: ints, or None for 'any size'."""
    ok = t.dim() == len(shape) and all(s is None or t.shape[i] == s for i, s in enumerate(shape))
    if not ok:
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        fail(op, f"{name} must have shape {want}, got {list(t.shape)}")


def check_last_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        fail(op, f"{name}'s last dimension must be contiguous (row-strided views are fine)")


def check_contiguous(op: str, name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        fail(op, f"{name} must be contiguous")
