"""CPU decode tapes: a decode step's native kernel calls recorded once per batch-size bucket and replayed.

On the CPU a decode step of a small model spends a third of its time in Python: the op wrappers of engine/ops check
their arguments, pick a kernel and pass raw pointers to engine._C, ~10 times per layer (SmolLM2-135M, 30 layers:
~4 ms of a 14 ms step). The kernels themselves take pointers, sizes and a few flags, all of which stay the same from
one decode step to the next when the step's inputs live in static buffers (engine/runner/cuda_graphs.py keeps them
for the CUDA graphs: token ids, positions, slots, context lengths, block-table rows). So the first step of each
bucket runs the decoder layers, the final norm and the LM head with every ``engine._C`` call recorded (function and
arguments); later steps replay the recorded calls in order, one Python loop of ~10 calls per layer with no
wrappers, checks or allocations: the CPU's counterpart of a CUDA graph.

A recording is only valid if the layers did nothing but native calls, views and allocations: every other torch
operation (a copy, an arithmetic op, torch's own GEMM on the AMX route) would not be replayed. A torch function mode
watches the recording: any such operation refuses the tape (that bucket stays eager, with a log line), and every
tensor made during the recording is kept alive with the tape, so that the recorded pointers stay valid.

The embedding lookup runs eagerly into a static buffer before the replay, and the float32 logits are converted
after it; both are one torch call each. The recorded pointers include the KV cache and the weights: the runner
drops the tapes when it allocates a KV cache (``DecodeTapes.reset``).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable

import torch
from torch.overrides import TorchFunctionMode

from engine.runner.cuda_graphs import DecodeGraphs

log = logging.getLogger(__name__)

_ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


class NotRecordable(RuntimeError):
    """The recorded forward ran a torch operation that a replay would skip."""


def _tensors(tree) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (list, tuple)):
        return [t for x in tree for t in _tensors(x)]
    if isinstance(tree, dict):
        return [t for x in tree.values() for t in _tensors(x)]
    return []


class _Watch(TorchFunctionMode):
    """Sees every torch function the recorded forward calls (a function mode: a dispatch mode would import ~900
    modules, 145 MiB, on first use); keeps every tensor they make, and notes the first call that a replay would
    miss: one that writes into a tensor (an in-place method, item assignment, ``out=``) or returns a tensor with
    storage of its own other than an allocation (arithmetic, a copy, a ``reshape`` whose strides allow no view)."""

    def __init__(self):
        super().__init__()
        self.keep: list = []
        self.refused: str | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.refused is None:
            name = getattr(func, "__name__", str(func))
            made = _tensors(out)
            if (name.endswith("_") and not name.endswith("__")) or name.startswith("__i") or name == "__setitem__" \
                    or "out" in kwargs:
                self.refused = name
            elif made and name not in _ALLOCATIONS:
                storages = {t.untyped_storage().data_ptr() for t in _tensors((args, kwargs))}
                if any(t.untyped_storage().data_ptr() not in storages for t in made):
                    self.refused = name
            if made:
                self.keep.append(out)
        return out


class _Recorder:
    """Stands in for engine._C while recording: calls through, and notes each call made by the recording thread
    (another engine of the process may run kernels meanwhile: its calls pass through unrecorded)."""

    def __init__(self, lib, calls: list):
        self._lib = lib
        self._calls = calls
        self._thread = threading.get_ident()

    def __getattr__(self, name: str):
        fn = getattr(self._lib, name)
        if not callable(fn):
            return fn

        def call(*args, **kwargs):
            if threading.get_ident() == self._thread:
                self._calls.append((fn, args, kwargs))
            return fn(*args, **kwargs)

        return call


class Tape:
    """The native calls of one recorded forward, the tensors they point into, and its output; ``refused`` says why
    the recording cannot be replayed (None: it can)."""

    def __init__(self, calls: list, keep: list, output: torch.Tensor, refused: str | None = None):
        self.calls = calls
        self.keep = keep
        self.output = output
        self.refused = refused

    def replay(self) -> torch.Tensor:
        if self.refused is not None:
            raise NotRecordable(self.refused)
        for fn, args, kwargs in self.calls:
            fn(*args, **kwargs)
        return self.output


def record(forward: Callable[[], torch.Tensor]) -> Tape:
    """Run forward() once with every engine._C call recorded. The tape's output is forward()'s result either way
    (everything ran for real); it is refused for replays when forward() also ran a torch operation that is neither
    a view nor an allocation, or engine._C is not built."""
    from engine.ops import native

    lib = native.native_lib
    if lib is None:
        return Tape([], [], forward(), "engine._C is not built")
    calls: list = []
    recorder = _Recorder(lib, calls)
    patched = [m for name, m in list(sys.modules.items())
               if name.startswith("engine.ops.") and getattr(m, "native_lib", None) is lib]
    for m in patched:
        m.native_lib = recorder
    try:
        with _Watch() as watch:
            out = forward()
    finally:
        for m in patched:
            m.native_lib = lib
    if watch.refused is not None:
        return Tape([], [], out, f"the forward ran {watch.refused}")
    return Tape(calls, watch.keep, out)


class DecodeTapes(DecodeGraphs):
    """DecodeGraphs' buckets and static input buffers on the CPU, each bucket's forward recorded as a Tape on its
    first step (lazily: a chat at batch 1 records one tape; the recording step runs the forward for real) and
    replayed by the later ones. ``embed(ids)`` is the token-embedding lookup, ``body(x, meta)`` the decoder layers,
    final norm and LM head over embeddings x (logits in the model's dtype). capture=False runs every bucket eagerly
    (the reference the tests compare replays with)."""

    def __init__(self, embed: Callable, body: Callable, sizes, max_blocks_per_seq: int, block_size: int,
                 num_kv_heads: int, hidden_size: int, dtype: torch.dtype, capture: bool = True):
        super().__init__(lambda ids, meta: body(embed(ids), meta).float(), torch.device("cpu"), sizes,
                         max_blocks_per_seq, block_size, num_kv_heads, capture=capture)
        self.embed, self.body = embed, body
        self.hidden = torch.zeros(self.max_size, hidden_size, dtype=dtype)  # the embeddings the tapes read
        self.tapes: dict[int, Tape] = {}

    def capture(self, progress=None) -> None:
        self._stage_padding()  # the tapes are recorded by each bucket's first step

    def reset(self) -> None:
        """Forget every tape (the KV cache or the weights moved: their recorded pointers are stale)."""
        self.tapes.clear()

    def _forward_bucket(self, n: int, b: int) -> torch.Tensor:
        if not self.capturing:
            return super()._forward_bucket(n, b)
        ids, meta = self._inputs(b)
        self.hidden[:n].copy_(self.embed(ids[:n]))  # rows n..b keep earlier (finite) values: padding
        tape = self.tapes.get(b)
        if tape is None:
            t0 = time.perf_counter()
            tape = self.tapes[b] = record(lambda: self.body(self.hidden[:b], meta))
            self.capture_seconds += time.perf_counter() - t0
            if tape.refused is not None:
                log.info("decode batch size %d on the CPU stays eager: %s", b, tape.refused)
            logits = tape.output
        elif tape.refused is not None:
            logits = self.body(self.hidden[:b], meta)
        else:
            logits = tape.replay()
        return logits[:n].float()
