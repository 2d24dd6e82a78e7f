"""A tensor-parallel worker process (rank >= 1): ``python -m engine.executor.worker``.

Reads its boot data (length-prefixed pickle) from stdin - the EngineConfig, the communication and kernel
configurations rank 0 resolved (CommConfig, KernelConfig: nothing of them comes from this process's environment)
and the logging level - then
watches stdin for end-of-file: rank 0's end of the pipe closes when rank 0 exits, however it exits, and the worker
then exits at once (it also polls its parent pid while idle). Status messages go to rank 0 on the inherited ``status_fd`` pipe: "built"
(with the KV blocks this rank could hold), "ready", "error" (before exiting with code 1).

Loop: receive a message from the mailbox - ("step", StepInputs) runs ``runner.run``; ("setup", n) allocates n
KV blocks and tunes auto; ("strategy", name); ("bench", sizes, names, dtype); ("ping",); ("stop",).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import traceback


def _watch_stdin(fd: int, seg_holder: list) -> None:
    try:
        while os.read(fd, 65536):
            pass
    except Exception:  # noqa: BLE001 - any failure to read means rank 0 is gone
        pass
    if seg_holder:
        try:
            seg_holder[0].abort()
        except Exception:  # noqa: BLE001
            pass
    os._exit(0)


def _status(fd: int, **msg) -> None:
    from engine.executor.tp_executor import write_msg

    with os.fdopen(os.dup(fd), "wb", buffering=0) as f:
        write_msg(f, msg)


def _load_weights(boot):
    factory = boot.get("factory")
    if factory:
        import importlib

        path, kwargs = factory
        module, _, name = path.partition(":")
        return getattr(importlib.import_module(module), name)(**kwargs)
    from engine.loader import load_checkpoint

    return load_checkpoint(boot["model_path"], validate=False)


def run(boot: dict, seg_holder: list) -> None:
    import torch

    from engine.kernel_config import KernelConfig
    from engine.parallel.comm.config import CommConfig
    from engine.parallel.comm.group import Communicator
    from engine.parallel.comm.shm import Segment
    from engine.parallel.context import TPContext
    from engine.executor.mailbox import Mailbox, MailboxClosed, parent_alive
    from engine.runner.device import resolve_device
    from engine.runner.model_runner import ModelRunner

    rank, world, config = boot["rank"], boot["world"], boot["config"]
    status_fd = boot["status_fd"]
    device = resolve_device(config.device)
    if device.type == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    seg = Segment.attach(boot["shm_fd"], boot["layout"])
    seg_holder.append(seg)
    # spin through rank 0's turnaround between decode steps (sampling, scheduling: ~0.1-1 ms) so that a step
    # normally needs no futex wake-up (measured: the wake costs rank 0 ~130 us here); then sleep
    mailbox = Mailbox(seg, rank, spin_ns=5_000 if boot["oversubscribed"] else 2_000_000)
    comm = Communicator(rank, world, device, CommConfig.from_dict(boot["comm_config"]), seg,
                        store_port=boot["store_port"])
    comm.set_dead_reason(lambda: "tensor parallelism: the group was aborted by rank 0" if seg.aborted else None)
    tp = TPContext(rank, world, comm)
    ckpt = _load_weights(boot)
    runner = ModelRunner(config, ckpt.config, ckpt.weights, boot["max_model_len"], boot["torch_dtype"], tp,
                         defer_kv=True, kernel_config=KernelConfig.from_dict(boot["kernel_config"]))
    comm.connect()
    _status(status_fd, kind="built", num_blocks=int(runner.num_kv_blocks_that_fit()), pid=os.getpid())
    ppid = boot["ppid"]
    alive = lambda: parent_alive(ppid)
    try:
        while True:
            msg = mailbox.recv(alive)
            kind = msg[0]
            if kind == "step":
                runner.run(msg[1])
            elif kind == "setup":
                runner.allocate_kv(int(msg[1]))
                comm.tune(runner.dtype)
                _status(status_fd, kind="ready")
            elif kind == "strategy":
                comm.set_strategy(msg[1])
                if msg[1] in ("auto", "overlap"):
                    comm.tune(runner.dtype)
            elif kind == "bench":
                _, sizes, names, dtype = msg
                comm.benchmark(dtype, sizes, names)
            elif kind == "ping":
                if comm.transport is not None and comm.transport.hc.barrier() != 0:
                    return
            elif kind == "stop":
                break
    except MailboxClosed:
        return
    finally:
        comm.close()


def main() -> None:
    from engine.executor.tp_executor import read_msg_fd

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group; rank 0 decides
    fd = sys.stdin.fileno()
    boot = read_msg_fd(fd)
    if boot is None:
        os._exit(2)
    logging.basicConfig(level=boot["log_level"],
                        format="%(asctime)s %(levelname)s tp-worker %(name)s: %(message)s")
    seg_holder: list = []
    threading.Thread(target=_watch_stdin, args=(fd, seg_holder), name="parent-watch", daemon=True).start()
    try:
        run(boot, seg_holder)
    except BaseException as e:  # noqa: BLE001 - report, then exit non-zero
        text = f"{type(e).__name__}: {e}"
        try:
            _status(boot["status_fd"], kind="error", message=text, traceback=traceback.format_exc())
        except Exception:  # noqa: BLE001
            pass
        if not (seg_holder and seg_holder[0].aborted):
            traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
