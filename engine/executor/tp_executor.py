"""Tensor-parallel executor: rank 0 (inside the EngineCore) and its N-1 worker processes.

Start-up (``TPExecutor(...)`` then ``attach(runner)``):
  1. rank 0 checks the TP size against the model (it must divide the attention heads, the KV heads or be a
     multiple of them, and the intermediate size), creates the group's shared segment (engine/parallel/comm/
     shm.py: nameless, handed to the workers as a file descriptor) and a TCPStore for torch.distributed;
  2. it starts the workers: ``python -m engine.executor.worker`` (a fresh interpreter like the engine process:
     no resource tracker, the parent's __main__ is not re-run), boot data pickled on their stdin, which stays
     open - a worker exits as soon as it reads end-of-file, i.e. when rank 0 dies, however it dies;
  3. every rank builds its ModelRunner reading only its slices of the checkpoint (mmap), in parallel, then
     joins torch.distributed; each worker reports the KV blocks it could hold, rank 0 takes the minimum
     (with its own), tells the workers, everybody allocates that many; auto runs its micro-benchmark;
  4. ``runner.on_step`` ships every step's StepInputs to the workers through the segment's mailbox
     (engine/executor/mailbox.py) before rank 0 runs it; workers loop: receive, ``runner.run(inp)``.

Failure: a monitor thread per worker reads its status pipe; when a worker exits unexpectedly the executor
records why, raises the segment's abort flag (every wait in an all-reduce / the mailbox gives up within a
millisecond) and the engine raises EngineDeadError with that plain message - never a hang. A failure on
rank 0 in the middle of a step also breaks the group (the ranks' collectives would no longer match).
Shutdown (``shutdown()``, also at garbage collection / interpreter exit): "stop" message, wait, kill what
is left; nothing stays behind (the segment has no name, the store goes with rank 0).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import torch

from engine.errors import EngineDeadError, KestrelError, ModelLoadError
from engine.parallel.comm.config import CommConfig
from engine.parallel.comm.group import Communicator
from engine.parallel.comm.shm import Layout, Segment
from engine.parallel.context import TPContext
from engine.executor.mailbox import Mailbox, MailboxClosed

log = logging.getLogger(__name__)


def check_tp_size(mc, size: int) -> None:
    """Plain errors for a TP size the model cannot be split by."""
    heads, kv = mc.num_attention_heads, mc.num_key_value_heads

    def divisors(n: int) -> str:
        return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0 and d <= 16)

    if size < 1:
        raise ModelLoadError(f"tensor_parallel_size must be >= 1, got {size}")
    if heads % size:
        raise ModelLoadError(f"tensor_parallel_size={size} does not divide the model's {heads} attention heads; "
                             f"use one of: {divisors(heads)}")
    if not (kv % size == 0 or size % kv == 0):
        raise ModelLoadError(f"tensor_parallel_size={size} does not fit the model's {kv} KV heads (it must "
                             f"divide them or be a multiple of them)")
    for name, width in tp_split_widths(mc):
        if width % size:
            raise ModelLoadError(f"tensor_parallel_size={size} does not divide the model's {name} {width}")


def tp_split_widths(mc) -> list[tuple[str, int]]:
    """The MLP widths the ranks split (engine/layers/linear.py, FusedMoE): a dense model's intermediate size; an
    MoE's expert width (moe_intermediate_size; DeepSeek's shared experts are a multiple of it), Qwen2-MoE's shared
    expert width and the dense layers' intermediate size where it has any (DeepSeek's first_k_dense_replace)."""
    if not mc.num_experts:
        return [("intermediate size", mc.intermediate_size)]
    widths = [("expert width (moe_intermediate_size)", mc.moe_intermediate_size)]
    if mc.shared_expert_intermediate_size:
        widths.append(("shared expert width (shared_expert_intermediate_size)", mc.shared_expert_intermediate_size))
    if not all(mc.is_moe_layer(i) for i in range(mc.num_hidden_layers)):
        widths.append(("dense layers' intermediate size", mc.intermediate_size))
    return widths


def write_msg(f, obj) -> None:
    """One length-prefixed pickled message to the binary file ``f`` (read back by read_msg_fd)."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(struct.pack("<Q", len(data)) + data)
    f.flush()


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def read_msg_fd(fd: int):
    head = _read_exact(fd, 8)
    if head is None:
        return None
    data = _read_exact(fd, struct.unpack("<Q", head)[0])
    return None if data is None else pickle.loads(data)


@dataclasses.dataclass
class _Worker:
    rank: int
    proc: subprocess.Popen
    status_fd: int
    messages: queue.Queue = dataclasses.field(default_factory=queue.Queue)
    last_error: str | None = None
    thread: threading.Thread | None = None


class _State:
    """What shutdown needs, apart from the executor (weakref.finalize must not hold the executor)."""

    def __init__(self):
        self.workers: list[_Worker] = []
        self.seg: Segment | None = None
        self.comm: Communicator | None = None
        self.mailbox: Mailbox | None = None
        self.store = None
        self.closing = False
        self.closed = False
        self.dead_reason: str | None = None


def _shutdown(state: _State, timeout: float = 5.0) -> None:
    if state.closed:
        return
    state.closing = True
    if state.mailbox is not None and state.dead_reason is None and state.seg is not None and not state.seg.aborted:
        try:
            state.mailbox.send(("stop",), timeout_s=min(timeout, 2.0))
        except Exception:  # noqa: BLE001 - the workers are killed below anyway
            pass
    deadline = time.monotonic() + timeout
    for w in state.workers:
        try:
            w.proc.wait(timeout=max(0.05, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    if state.seg is not None:
        state.seg.abort()  # anything still waiting gives up
    for w in state.workers:
        if w.proc.poll() is None:
            w.proc.kill()
            try:
                w.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        if w.proc.stdin is not None:
            try:
                w.proc.stdin.close()
            except OSError:
                pass
    for w in state.workers:
        if w.thread is not None and w.thread is not threading.current_thread():
            w.thread.join(timeout=2)
    if state.comm is not None:
        state.comm.close()
    if state.seg is not None:
        state.seg.close()
    state.store = None
    state.closed = True


class TPExecutor:
    def __init__(self, config, checkpoint, max_model_len: int, comm_config: CommConfig | None = None):
        """``comm_config``: the communication defaults to start from (default: the measured ones, CommConfig());
        resolved here once, with the user's --comm-strategy, into ``self.comm_config``, which every rank gets. The
        kernel configuration is resolved here once too (``self.kernel_config``, as rank 0's ModelRunner resolves
        its own) and handed to every worker's ModelRunner; ``attach`` checks that rank 0's runner has the same."""
        from engine import ops
        from engine.runner import model_runner
        from engine.runner.device import physical_cores, resolve_device
        from engine.runner.load_checks import check_expert_split

        self.config = config
        self.size = int(config.tensor_parallel_size)
        check_tp_size(checkpoint.config, self.size)
        self.device = resolve_device(config.device)
        check_expert_split(config, checkpoint, self.device, self.size)  # GGUF expert blocks: before any worker
        if self.device.type == "cuda" and torch.cuda.device_count() < self.size:
            raise KestrelError(f"tensor_parallel_size={self.size} needs {self.size} GPUs; "
                               f"{torch.cuda.device_count()} visible")
        total = config.num_threads or physical_cores()
        self.threads_per_rank = max(1, total // self.size)
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover
            cores = os.cpu_count() or 1
        self.oversubscribed = self.device.type == "cpu" and self.size * self.threads_per_rank > cores
        try:
            self.comm_config = CommConfig.for_engine(config, device_type=self.device.type, world=self.size,
                                                     oversubscribed=self.oversubscribed, base=comm_config)
        except ValueError as e:
            raise KestrelError(str(e)) from None
        self.kernel_config = model_runner.resolve_kernels(ops.device_facts(self.device), config)
        # the workers log at the engine process's level (engine/core/process.py sets it from its client)
        self.log_level = logging.getLogger("engine").getEffectiveLevel()
        self._state = _State()
        self._finalizer = weakref.finalize(self, _shutdown, self._state)
        self.startup_times: dict[str, float] = {}
        self.step_bytes = 0  # pickled StepInputs bytes sent (totals)
        self.steps_sent = 0
        self.send_seconds = 0.0
        try:
            t0 = time.perf_counter()
            self._start(checkpoint, max_model_len)
            self.startup_times["spawn_s"] = time.perf_counter() - t0
        except BaseException:
            self.shutdown()
            raise

    # -- start-up ---------------------------------------------------------------------------------------
    def _start(self, checkpoint, max_model_len: int) -> None:
        import torch.distributed as dist

        st = self._state
        cuda = self.device.type == "cuda"
        layout = Layout(world=self.size, slot_bytes=(8 << 20) if cuda else (1 << 20),
                        nslots=4, gpu_slot_bytes=(1 << 20) if cuda else (64 << 10))
        st.seg = Segment.create(layout)
        st.mailbox = Mailbox(st.seg, 0)
        st.store = dist.TCPStore("127.0.0.1", 0, self.size, True, wait_for_workers=False,
                                 timeout=datetime.timedelta(seconds=self.comm_config.startup_timeout_s))
        port = st.store.port
        factory = getattr(checkpoint, "tp_factory", None)
        boot_common = {
            "config": self.config, "world": self.size, "layout": layout, "store_port": port,
            "model_path": str(checkpoint.path), "factory": factory, "max_model_len": max_model_len,
            "torch_dtype": checkpoint.config.torch_dtype, "oversubscribed": self.oversubscribed,
            "threads": self.threads_per_rank, "ppid": os.getpid(),
            "comm_config": self.comm_config.to_dict(), "kernel_config": self.kernel_config.to_dict(),
            "log_level": self.log_level,
        }
        env = dict(os.environ)
        if self.device.type == "cpu":
            env["OMP_NUM_THREADS"] = str(self.threads_per_rank)
        pkg_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        for rank in range(1, self.size):
            r_fd, w_fd = os.pipe()
            try:
                proc = subprocess.Popen([sys.executable, "-m", "engine.executor.worker"], stdin=subprocess.PIPE,
                                        pass_fds=(st.seg.fd, w_fd), env=env, close_fds=True)
            finally:
                os.close(w_fd)
            w = _Worker(rank, proc, r_fd)
            st.workers.append(w)
            write_msg(proc.stdin, {**boot_common, "rank": rank, "shm_fd": st.seg.fd, "status_fd": w_fd})
            w.thread = threading.Thread(target=self._monitor, args=(st, w),
                                        name=f"tp-monitor-{rank}", daemon=True)
            w.thread.start()
        comm_device = torch.device("cuda", torch.cuda.current_device()) if cuda else self.device
        st.comm = Communicator(0, self.size, comm_device, self.comm_config, st.seg, store_port=port,
                               store=st.store)
        st.comm.set_dead_reason(lambda: st.dead_reason)
        self.tp = TPContext(0, self.size, st.comm, on_error=self._on_rank0_error)
        log.info("tensor parallelism: %d ranks (%s, %s), %d thread(s) per rank", self.size, self.device,
                 self.config.comm_strategy, self.threads_per_rank)

    @staticmethod
    def _monitor(st: _State, w: _Worker) -> None:
        """Reads the worker's status messages; on its exit, records why (unless shutting down)."""
        try:
            while True:
                msg = read_msg_fd(w.status_fd)
                if msg is None:
                    break
                if msg.get("kind") == "error":
                    w.last_error = msg.get("message")
                w.messages.put(msg)
        except Exception:  # noqa: BLE001
            pass
        finally:
            try:
                os.close(w.status_fd)
            except OSError:
                pass
        rc = w.proc.wait()
        if st.closing:
            return
        if rc < 0:
            try:
                how = f"was killed by {signal.Signals(-rc).name}"
            except ValueError:
                how = f"was killed by signal {-rc}"
        else:
            how = f"exited with code {rc}"
        reason = f"tensor-parallel worker rank {w.rank} (pid {w.proc.pid}) {how}"
        if w.last_error:
            reason += f": {w.last_error}"
        reason += "; the engine must be restarted"
        if st.dead_reason is None:
            st.dead_reason = reason
            log.error("%s", reason)
        if st.seg is not None:
            st.seg.abort()
        w.messages.put({"kind": "exit", "message": reason})

    def _wait_all(self, kind: str, timeout: float | None = None) -> list[dict]:
        out = []
        if timeout is None:
            timeout = self.comm_config.startup_timeout_s
        deadline = time.monotonic() + timeout
        for w in self._state.workers:
            while True:
                try:
                    msg = w.messages.get(timeout=max(0.01, deadline - time.monotonic()))
                except queue.Empty:
                    raise KestrelError(f"tensor-parallel worker rank {w.rank} did not report {kind!r} within "
                                       f"{timeout:.0f} s") from None
                if msg.get("kind") == kind:
                    out.append(msg)
                    break
                if msg.get("kind") in ("error", "exit"):
                    text = msg.get("message") or "failed"
                    raise ModelLoadError(f"tensor-parallel worker rank {w.rank} failed: {text}")
        return out

    def attach(self, runner) -> None:
        """After rank 0's runner is built (defer_kv=True): connect, agree on the KV blocks, tune, go."""
        st = self._state
        if runner.kernel_config != self.kernel_config:
            raise KestrelError(f"tensor parallelism: rank 0's kernel configuration {runner.kernel_config} is not "
                               f"the one its workers were given ({self.kernel_config})")
        t = self.startup_times
        try:
            t0 = time.perf_counter()
            st.comm.connect()
            t["connect_s"] = time.perf_counter() - t0
            built = self._wait_all("built")
            t["workers_built_s"] = time.perf_counter() - t0
            n = min([runner.num_kv_blocks_that_fit()] + [int(m["num_blocks"]) for m in built])
            runner.allocate_kv(n)
            self._send(("setup", n))
            t1 = time.perf_counter()
            st.comm.tune(runner.dtype)
            t["tune_s"] = time.perf_counter() - t1
            self._wait_all("ready")
            t["attach_s"] = time.perf_counter() - t0
            log.info("tensor parallelism up: %s", {k: round(v, 2) for k, v in t.items()})
        except MailboxClosed:
            raise EngineDeadError(st.dead_reason or "tensor parallelism: a worker died during start-up") from None
        self.runner = runner
        runner.on_step = self.on_step

    # -- steps ------------------------------------------------------------------------------------------
    def _send(self, msg) -> int:
        st = self._state
        if st.dead_reason is not None:
            raise EngineDeadError(st.dead_reason)
        if st.closed:
            raise EngineDeadError("tensor parallelism: the engine was shut down")
        try:
            return st.mailbox.send(msg)
        except MailboxClosed:
            raise EngineDeadError(st.dead_reason or "tensor parallelism: a worker stopped reading steps; "
                                  "the engine must be restarted") from None

    def on_step(self, inp) -> None:
        t0 = time.perf_counter()
        self.step_bytes += self._send(("step", inp))
        self.steps_sent += 1
        self.send_seconds += time.perf_counter() - t0

    def _on_rank0_error(self, e: BaseException):
        st = self._state
        if isinstance(e, EngineDeadError):
            # a peer died: give the monitor a moment to say which and why
            t0 = time.monotonic()
            while st.dead_reason is None and time.monotonic() - t0 < 2.0:
                if time.monotonic() - t0 > 0.2 and all(w.proc.poll() is None for w in st.workers):
                    break  # nobody exited (a timeout): no better reason will come
                time.sleep(0.02)
        if st.dead_reason is None:
            st.dead_reason = (f"tensor parallelism: rank 0 failed in the middle of a step ({type(e).__name__}: "
                              f"{e}); the ranks are out of step and the engine must be restarted")
        if st.seg is not None:
            st.seg.abort()
        if isinstance(e, EngineDeadError):
            return EngineDeadError(st.dead_reason)
        return None  # re-raise the original error (KeyboardInterrupt, a bug); the group is marked dead

    @property
    def dead_reason(self) -> str | None:
        return self._state.dead_reason

    @property
    def worker_pids(self) -> list[int]:
        return [w.proc.pid for w in self._state.workers]

    @property
    def comm(self) -> Communicator:
        return self._state.comm

    def set_strategy(self, name: str) -> None:
        """Switch every rank's communication strategy between steps (auto tunes again)."""
        self._send(("strategy", name))
        self.comm.set_strategy(name)
        if name in ("auto", "overlap"):
            self.comm.tune(self.runner.dtype)

    def benchmark(self, sizes: list[int], names: list[str] | None = None, dtype: torch.dtype | None = None
                  ) -> list[dict]:
        """All-reduce latency table of the strategies on the live group (collective, between steps)."""
        dtype = dtype or self.runner.dtype
        self._send(("bench", sizes, names, dtype))
        return self.comm.benchmark(dtype, sizes, names)

    def ping(self, n: int = 200) -> dict:
        """Round trip of the step channel: rank 0 sends a tiny message, the workers answer through a barrier
        of the host segment (when there is one). Returns median microseconds."""
        times = []
        hc = self.comm.transport.hc if self.comm.transport is not None else None
        for _ in range(n):
            t0 = time.perf_counter()
            self._send(("ping",))
            if hc is not None:
                if hc.barrier() != 0:
                    raise EngineDeadError(self.dead_reason or "tensor parallelism: ping failed")
            times.append(time.perf_counter() - t0)
        times.sort()
        return {"round_trip_us": times[len(times) // 2] * 1e6, "n": n}

    def comm_stats(self) -> dict:
        c = self.comm
        s = c.stats
        s.resolve()
        return {
            "tp_size": self.size, "comm_strategy": c.requested, "comm": c.describe(),
            "comm_config": self.comm_config.to_dict(),
            "calls": s.total.calls, "payload_bytes": s.total.payload_bytes, "link_bytes": s.total.link_bytes,
            "seconds": s.total.seconds,
            "by_strategy": {k: dataclasses.asdict(v) for k, v in s.by_strategy.items()},
            "table": c.table, "steps_sent": self.steps_sent, "step_bytes": self.step_bytes,
            "send_seconds": self.send_seconds,
        }

    def shutdown(self, timeout: float = 5.0) -> None:
        self._finalizer.detach()
        _shutdown(self._state, timeout)
