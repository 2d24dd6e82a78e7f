"""``host``: all-reduce through POSIX shared memory across the rank processes, summed by SIMD code on the CPU
(csrc/comm/hostar.cpp; protocol in csrc/comm/hostar.h).

CPU tensors: the C++ HostComm does it all, in place, without the GIL:
  - messages up to ``oneshot_max`` bytes (CommConfig.host_oneshot_max; decode): one phase - every rank copies
    its partial into its slot, raises its flag, waits for the others' flags, and sums all the slots itself (one synchronisation);
  - larger ones: reduce-scatter + all-gather in slot-sized chunks - every rank sums only its part of each
    chunk (SIMD, fp32 accumulation, OpenMP threads for large parts) and copies the others' parts back.

CUDA tensors (written for the GPU machine; never peer access, so it is the PCIe-mode transport):
  - small messages (<= ``gpu_small_max``, CommConfig.host_gpu_small_max): one kernel writes the partial into
    the mapped shared segment (cudaHostRegister'ed, zero-copy), fences, raises per-block flags in host memory, spins on the peers'
    flags and sums their partials read over PCIe (the 7.7 us probe of ../shared/anchors).
  - larger ones: chunked pipeline on two copy streams - device->host copy of chunk i+1 runs while the
    CPU reduces chunk i (reduce-scatter in the segment) and the host->device copies of chunk i-1 run, so
    copy engines, not SMs, move the data.
"""

from __future__ import annotations

import collections

import torch

from engine.parallel.comm import kernels
from engine.parallel.comm.base import CommStrategy, Handle, gather_dim
from engine.parallel.comm.config import CommConfig
from engine.parallel.comm.shm import MAX_BLOCKS, Segment

try:
    from engine import _C
except ImportError:  # pragma: no cover
    _C = None

DTYPE_CODE = kernels.DTYPE_CODE


class HostTransport:
    """This rank's view of the segment's all-reduce machinery, shared by the host and int8 strategies (they
    must share one sequence counter) and by the all-gather of logits."""

    def __init__(self, seg: Segment, rank: int, world: int, device: torch.device, config: CommConfig):
        if _C is None or not getattr(_C, "has_comm", False):
            raise RuntimeError("tensor parallelism needs engine._C built with csrc/comm (pip install -e .)")
        if not config.is_resolved:
            raise ValueError("HostTransport needs a resolved CommConfig (CommConfig.resolved)")
        self.seg, self.rank, self.world, self.device = seg, rank, world, device
        self.config = config
        lay = seg.layout
        # Spin briefly (config.spin_ns: why 20 us, or 2 us oversubscribed, in config.py), then sleep in
        # futex_wait: the peer's flag store wakes us. No sched_yield phase in between (0 ns: it lost).
        self.timeout_s = config.timeout_s
        self.hc = _C.HostComm(seg.addr(lay.flags), seg.addr(lay.sleepers_off), seg.addr(lay.abort_off),
                              seg.addr(lay.slots), lay.slot_bytes, lay.nslots, rank, world, config.spin_ns, 0,
                              int(self.timeout_s * 1e9))
        self.oneshot_max = config.host_oneshot_max
        # GPU state
        self.dev_base = None  # device pointer of the registered segment
        self.gpu_seq = 0
        self._h2d_pending: collections.deque = collections.deque()  # (seq, event) of H2D reads of slots
        self._streams = None
        if device.type == "cuda":
            if not kernels.cuda_native():
                raise RuntimeError("the host strategy on CUDA needs engine._C built with nvcc")
            self.dev_base = _C.cuda_host_register(seg.base, lay.total, device.index or 0)
            self.hc.set_threads(config.host_reduce_threads)

    def slot_view(self, seq: int, j: int, nbytes: int, dtype: torch.dtype) -> torch.Tensor:
        lay = self.seg.layout
        off = lay.slots + ((seq % lay.nslots) * self.world + j) * lay.slot_bytes
        return self.seg.view(off, nbytes, dtype)

    def drain(self, upto_seq: int | None = None) -> None:
        """Wait for host->device copies that still read slots (all, or those of steps <= upto_seq)."""
        q = self._h2d_pending
        while q and (upto_seq is None or q[0][0] <= upto_seq):
            q.popleft()[1].synchronize()

    def close(self) -> None:
        if self.dev_base is not None:
            try:
                self.drain()
                torch.cuda.synchronize(self.device)
                _C.cuda_host_unregister(self.seg.base)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass
            self.dev_base = None


class HostStrategy(CommStrategy):
    name = "host"

    def __init__(self, transport: HostTransport, **kw):
        super().__init__(transport.rank, transport.world, transport.device, **kw)
        self.t = transport
        self.gpu_small_max = transport.config.host_gpu_small_max
        self.gpu_chunk = transport.config.host_gpu_chunk
        self._executor = None

    def link_bytes(self, nbytes: int) -> int:
        if self.device.type == "cuda":  # PCIe traffic of this GPU: partial out, result (or peers' parts) in
            return self.world * nbytes if nbytes <= self.gpu_small_max else 2 * nbytes
        if nbytes <= self.t.oneshot_max:
            return (self.world - 1) * nbytes  # every peer's partial is read
        return 2 * (self.world - 1) * nbytes // self.world

    def _check(self, st: int, what: str) -> None:
        if st != 0:
            raise self._dead(what, st)

    def _all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_contiguous():
            return x.copy_(self._all_reduce(x.contiguous()))
        if x.device.type == "cuda":
            if self._small(x):
                return self._cuda_mapped(x)
            return self._submit_pipelined(x).wait()
        self.t.drain()
        self._check(self.t.hc.all_reduce(DTYPE_CODE[x.dtype], x.data_ptr(), x.numel(), self.t.oneshot_max),
                    "an all-reduce")
        return x

    def all_reduce_async(self, x: torch.Tensor):
        if x.device.type != "cuda" or self._small(x) or not x.is_contiguous():
            return super().all_reduce_async(x)  # CPU: synchronous; mapped kernel: on the side stream
        nbytes = x.numel() * x.element_size()
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        inner = self._submit_pipelined(x)

        def finish() -> torch.Tensor:
            out = inner.wait()
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.stats.add_events(self.name, nbytes, self.link_bytes(nbytes), start, end)
            return out
        return Handle(fn=finish)

    def _small(self, x: torch.Tensor) -> bool:
        return x.numel() * x.element_size() <= min(self.gpu_small_max, self.t.seg.layout.gpu_slot_bytes)

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.world == 1:
            return x
        dev = x.device
        xc = x.detach().contiguous()
        if dev.type == "cuda":  # logits of a decode step: small; a host round trip is simplest
            xc = xc.cpu()
        out = torch.empty((self.world, *xc.shape), dtype=xc.dtype)
        nbytes = xc.numel() * xc.element_size()

        def run() -> int:
            self.t.drain()
            return self.t.hc.all_gather(xc.data_ptr(), nbytes, out.data_ptr())
        st = self._pool().submit(run).result() if dev.type == "cuda" else run()
        self._check(st, "an all-gather")
        self.stats.add(self.name + "-gather", nbytes, (self.world - 1) * nbytes, 0.0)
        res = gather_dim(out, xc.shape, self.world, dim)
        return res.to(dev, non_blocking=True) if dev.type == "cuda" else res

    # -- CUDA paths ---------------------------------------------------------------------------------------
    def _pool(self):
        """One helper thread runs every use of the HostComm on CUDA ranks, in call order (the order of
        collective steps must be the same on every rank), while the main thread keeps enqueueing GPU work."""
        if self._executor is None:
            import concurrent.futures

            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kestrel-hostar")
        return self._executor

    def _cuda_mapped(self, x: torch.Tensor) -> torch.Tensor:
        t, lay = self.t, self.t.seg.layout
        t.gpu_seq = (t.gpu_seq + 1) & 0xFFFFFFFF
        nbytes = x.numel() * x.element_size()
        blocks = max(1, min(32, MAX_BLOCKS, -(-nbytes // 4096)))  # a 16-byte vector per thread, 256 threads
        _C.cuda_mapped_all_reduce(DTYPE_CODE[x.dtype], x.data_ptr(), x.numel(), t.dev_base + lay.gpu_slots,
                                  lay.gpu_slot_bytes, t.dev_base + lay.gpu_flags, MAX_BLOCKS, self.rank,
                                  self.world, t.gpu_seq, t.dev_base + lay.abort_off,
                                  t.dev_base + lay.err(self.rank), t.timeout_s, blocks, x.get_device(),
                                  torch.cuda.current_stream(x.device).cuda_stream)
        return x

    def _submit_pipelined(self, x: torch.Tensor) -> Handle:
        """Start the pipelined all-reduce of x (CUDA, contiguous) on the helper thread; the returned handle's
        wait() makes the current stream wait for the result."""
        dev = x.device
        main = torch.cuda.current_stream(dev)
        ready = torch.cuda.Event()
        ready.record(main)
        t = self.t
        if t._streams is None:
            t._streams = (torch.cuda.Stream(device=dev), torch.cuda.Stream(device=dev))
        x.record_stream(t._streams[0])
        x.record_stream(t._streams[1])
        fut = self._pool().submit(self._cuda_pipelined, x, ready)

        def finish() -> torch.Tensor:
            st, done = fut.result()
            self._check(st, "an all-reduce")
            torch.cuda.current_stream(dev).wait_event(done)
            return x
        return Handle(fn=finish)

    def _cuda_pipelined(self, x: torch.Tensor, ready) -> tuple[int, object]:
        """Runs on the helper thread. Chunk i: device->host copy into this rank's slot (d2h stream), arrive,
        sum of this rank's part of every slot on the CPU, host->device copies of all parts (h2d stream);
        the copy of chunk i+1 is issued as soon as chunk i's step is published, so it runs during the sum."""
        with torch.inference_mode(x.is_inference()):  # thread-local: the engine's tensors are inference tensors
            return self._cuda_pipelined_body(x, ready)

    def _cuda_pipelined_body(self, x: torch.Tensor, ready) -> tuple[int, object]:
        t, hc = self.t, self.t.hc
        d2h, h2d = t._streams
        torch.cuda.set_device(x.device)
        xf = x.view(-1)
        esz = x.element_size()
        code = DTYPE_CODE[x.dtype]
        nslots = t.seg.layout.nslots
        unit = 64 * self.world
        chunk = max(unit, min(hc.slot_bytes, self.gpu_chunk) // esz // unit * unit)
        chunks = [(c0, min(chunk, xf.numel() - c0)) for c0 in range(0, xf.numel(), chunk)]
        d2h.wait_event(ready)
        h2d.wait_event(ready)

        def copy_out(i: int):
            c0, m = chunks[i]
            dst = t.slot_view(hc.seq + 1, self.rank, m * esz, x.dtype)
            with torch.cuda.stream(d2h):
                dst.copy_(xf[c0:c0 + m], non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(d2h)
            return ev

        t.drain(hc.seq + 1 - nslots)
        ev = copy_out(0)
        for i, (c0, m) in enumerate(chunks):
            ev.synchronize()
            # before publishing step s, our reads (H2D copies) of step s - (nslots - 1) must be complete
            t.drain(hc.seq + 1 - (nslots - 1))
            st = hc.arrive()
            if st:
                return st, None
            if i + 1 < len(chunks):
                ev = copy_out(i + 1)  # every peer passed this step: slot (seq + 1) is free everywhere
            st = hc.reduce_own(code, m)
            if st:
                return st, None
            s = hc.seq
            with torch.cuda.stream(h2d):
                for j in range(self.world):
                    a, b = hc.subrange(m, j)
                    if b > a:
                        src = t.slot_view(s, j, m * esz, x.dtype)[a:b]
                        xf[c0 + a:c0 + b].copy_(src, non_blocking=True)
                e = torch.cuda.Event()
                e.record(h2d)
            t._h2d_pending.append((s, e))
        return 0, e

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
