"""The engine process: builds the EngineCore and serves it over the engine.wire protocol.

Started by engine.frontend.client.EngineClient as ``python -m engine.core.process BOOTSTRAP_JSON`` (a fresh
interpreter, so torch's state is clean; unlike multiprocessing's spawn this starts no resource-tracker
process that would outlive a shutdown and does not re-run the parent's __main__).

The loop: drain every waiting message (add / abort / call / shutdown), run one ``core.step()`` while there is
work, and push that step's deltas to the client as one message. It blocks on the socket only when idle and
never sleeps while there is work. Its standard input is a pipe from the client: when it reaches end of file
(the client process died, however it died) the engine exits at once. SIGINT is ignored: Ctrl-C in a terminal
reaches the whole process group, and the client decides when the engine stops. A heartbeat thread
(engine.core.heartbeat) tells the client's watchdog, about once a second and during steps too, that the process
runs and where its loop is (EngineServer.progress).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import sys
import threading
import time

import msgspec
import zmq

from engine import heap, progress, wire
from engine.core.heartbeat import Heartbeat, LoopProgress
from engine.errors import InvalidRequestError, KestrelError, as_request_error
from engine.metrics import TokenRate
from engine.tokenizer.grammar import token_bytes

log = logging.getLogger("engine.core.process")  # literal: run as __main__ (python -m)

DEFAULT_CORE_FACTORY = "engine.core.core:EngineCore"


_core = None  # the running core, for the parent-death path


def _watch_parent(ipc_dir: str | None) -> None:
    """Exit the process when the client's end of our stdin closes (the client died, however it died)."""
    try:
        fd = sys.stdin.fileno()
        while os.read(fd, 65536):  # raw reads: no buffered-reader lock to trip interpreter shutdown
            pass
    except Exception:  # any failure to read means the parent is gone
        log.debug("stdin watch ended", exc_info=True)
    if ipc_dir:
        import shutil

        shutil.rmtree(ipc_dir, ignore_errors=True)
    core = _core
    if core is not None and hasattr(core, "shutdown"):  # tensor-parallel workers: best effort, bounded
        t = threading.Thread(target=core.shutdown, daemon=True)
        t.start()
        t.join(3)
    os._exit(3)


def _shutdown_core(core) -> None:
    if hasattr(core, "shutdown"):
        try:
            core.shutdown()
        except Exception:
            log.exception("engine core shutdown failed")


def _factory(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def model_info(core, load_time: float) -> wire.ModelInfo:
    ckpt = getattr(core, "checkpoint", None)
    mc = getattr(core, "model_config", None)
    tok = getattr(core, "tokenizer", None)
    runner = getattr(core, "runner", None)
    graphs = getattr(runner, "graphs", None)
    graphs = graphs if getattr(graphs, "capturing", False) else None  # captured graphs only
    path = getattr(ckpt, "path", None)
    name = getattr(ckpt, "name", None) or (path.name if path is not None else "model")
    cfg = core.config
    return wire.ModelInfo(
        name=str(name),
        path=str(path or ""),
        architecture=getattr(mc, "architecture", "") or "",
        format=getattr(ckpt, "format", "") or "",
        quantization=getattr(ckpt, "quantization", None),
        max_model_len=int(core.max_model_len),
        dtype=str(getattr(runner, "dtype", "")).removeprefix("torch."),
        device=str(getattr(runner, "device", "")),
        vocab_size=int(getattr(mc, "vocab_size", 0) or (len(tok) if tok is not None else 0)),
        num_kv_blocks=int(core.blocks.num_blocks),
        block_size=int(core.blocks.block_size),
        has_chat_template=bool(getattr(tok, "chat_template", None)),
        generation_config=dict(getattr(ckpt, "generation_config", None) or {}),
        bos_token_id=getattr(tok, "bos_token_id", None),
        eos_token_ids=sorted(int(i) for i in getattr(core, "eos_token_ids", ()) or ()),
        tensor_parallel_size=int(getattr(cfg, "tensor_parallel_size", 1) or 1),
        engine_pid=os.getpid(),
        load_time=load_time,
        cuda_graph_sizes=list(getattr(graphs, "sizes", None) or []),
        cuda_graph_seconds=float(getattr(graphs, "capture_seconds", 0.0) or 0.0),
        quantization_mode=str(getattr(runner, "quantization", "") or ""),
    )


# What may sit in a tokenizer.json for "a text of B UTF-8 bytes has at least B / max_token_bytes tokens" to hold:
# nothing that deletes or shrinks text before the model sees it (normalizers such as NFKC or Strip, whitespace-
# removing pre-tokenizers, added tokens that swallow the spaces around them, fused unknown runs).
_SAFE_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "Split", "Punctuation", "UnicodeScripts"}


def _safe_normalizer(n) -> bool:
    if n is None:
        return True
    kind = n.get("type")
    if kind == "Sequence":
        return all(_safe_normalizer(x) for x in n.get("normalizers") or [])
    if kind == "Prepend":
        return True
    if kind == "Replace":
        pattern = n.get("pattern") or {}
        return pattern.get("String") == " " and n.get("content") == "\u2581"
    return False


def _safe_pre_tokenizer(p) -> bool:
    if p is None:
        return True
    kind = p.get("type")
    if kind == "Sequence":
        return all(_safe_pre_tokenizer(x) for x in p.get("pretokenizers") or [])
    return kind in _SAFE_PRE_TOKENIZERS and p.get("behavior") != "Removed"


def length_bound_is_certain(spec: dict) -> bool:
    """True when every token of this tokenizer (a tokenizer.json as a dict) stands for at most its own
    bytes of the input text, so a text's UTF-8 length bounds its token count from below."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return False
    if model.get("unk_token") is not None and model.get("fuse_unk") and not model.get("byte_fallback"):
        return False
    if not _safe_normalizer(spec.get("normalizer")) or not _safe_pre_tokenizer(spec.get("pre_tokenizer")):
        return False
    return not any(t.get("lstrip") or t.get("rstrip") for t in spec.get("added_tokens") or [])


class EngineServer:
    """The loop around one core. ``core`` is an EngineCore or anything with its interface."""

    def __init__(self, core, pull: zmq.Socket, push: zmq.Socket):
        self.core = core
        self.pull = pull
        self.push = push
        self.enc = wire.encoder()
        self.dec = wire.engine_decoder()
        self.poller = zmq.Poller()
        self.poller.register(pull, zmq.POLLIN)
        self.running = True
        # tokens/s over the last seconds, counted per step (engine.metrics.TokenRate); ``clock`` is for tests
        self.clock = time.monotonic
        self.prompt_rate = TokenRate(clock=self._now)
        self.generation_rate = TokenRate(clock=self._now)
        self._counted = (0, 0)  # the core's prompt / generation totals at the last count
        self._token_bytes: list[bytes] | None = None
        self._worked = False
        self.progress = LoopProgress()  # read by the heartbeat thread (engine.core.heartbeat)

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        core = self.core
        while self.running:
            busy = core.has_unfinished()
            if not busy:
                # the engine just went idle: the freed heap back to the system (step buffers differ in size from
                # step to step; untrimmed, the RSS keeps the high-water mark of every batch shape seen so far)
                if self._worked:
                    self._worked = False
                    heap.trim()
                self.progress.idle()
                self.poller.poll()  # idle: block until a message comes
            else:
                self._worked = True
            self.progress.begin()
            deltas: list = []
            accepted: list = []
            errors: list = []
            self._drain(deltas, accepted, errors)
            if not self.running:
                break
            if core.has_unfinished():
                deltas.extend(self.step())
            if deltas or accepted or errors:
                self.push.send(self.enc.encode(wire.StepOutput(time.monotonic(), deltas, accepted, errors)),
                               copy=False)

    def _drain(self, deltas: list, accepted: list, errors: list) -> None:
        while True:
            try:
                frame = self.pull.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            msg = self.dec.decode(frame.buffer)
            if isinstance(msg, wire.AddRequest):
                self._add(msg, accepted, errors)
            elif isinstance(msg, wire.Abort):
                deltas.extend(self.core.abort(msg.request_ids))
            elif isinstance(msg, wire.Call):
                self._call(msg)
            elif isinstance(msg, wire.Shutdown):
                self.running = False
                return

    def _add(self, msg: wire.AddRequest, accepted: list, errors: list) -> None:
        """Admit one request (its n children). The client normally sends token ids (it tokenizes and applies
        the chat template itself, off this loop); text or messages are tokenized here only for a client
        without a tokenizer of its own (a stand-in core's). A refused request leaves nothing behind: no
        local keeps its exception (whose traceback would hold the prompt's ids until a cycle collection)."""
        core = self.core
        added: list[str] = []
        info = None
        n_prompt = 0
        try:
            ids = msg.prompt_token_ids
            if ids is None:
                ids = core.tokenize_prompt(msg.prompt, msg.messages)
            n_prompt = len(ids)
            for cid, params in zip(msg.child_ids, msg.params):
                if msg.embed:
                    core.add_request(cid, msg.prompt, params, prompt_token_ids=ids, embed=True)
                else:
                    core.add_request(cid, msg.prompt, params, prompt_token_ids=ids)
                added.append(cid)
        except Exception as e:  # noqa: BLE001 - every refusal goes back to the client, typed
            info = wire.error_to_info(as_request_error(e))
            e.__traceback__ = None
        ids = None
        msg.prompt_token_ids = msg.prompt = msg.messages = None
        if info is not None:
            if added:
                core.abort(added)
            errors.extend((cid, info) for cid in msg.child_ids)
            return
        accepted.extend((cid, n_prompt) for cid in msg.child_ids)

    # -- calls ------------------------------------------------------------------------------
    def _call(self, msg: wire.Call) -> None:
        try:
            fn = getattr(self, "call_" + msg.method, None)
            if fn is None:
                raise KestrelError(f"The engine has no call {msg.method!r}.")
            reply = wire.Reply(msg.call_id, fn(**msg.args))
        except Exception as e:  # noqa: BLE001 - typed back to the caller; no local keeps the exception
            reply = wire.Reply(msg.call_id, None,
                              wire.error_to_info(as_request_error(e)))
            e.__traceback__ = None
        msg.args = {}
        self.push.send(self.enc.encode(reply), copy=False)

    def call_ping(self) -> str:
        return "pong"

    def call_stats(self, recent: int = 32) -> dict:
        """The core's EngineStats (every field, tensor-parallel traffic included) plus prefix-cache counts,
        token rates and the time; the client reads it as wire.EngineStats."""
        s = self.core.stats(recent)
        blocks = self.core.blocks
        p_rate, g_rate = self._current_rates()
        out = msgspec.structs.asdict(s)  # shallow: recent_steps stay Structs, encoded as they are
        out.update(prefix_cache_queries=int(getattr(blocks, "prefix_queries", 0)),
                   prefix_cache_hits=int(getattr(blocks, "prefix_hits", 0)),
                   prompt_tokens_per_s=p_rate, generation_tokens_per_s=g_rate, time=time.monotonic())
        return out

    def call_tokenize(self, prompt=None, messages=None, add_special_tokens: bool = True,
                      add_generation_prompt: bool = True) -> list[int]:
        tok = self.core.tokenizer
        if messages is not None:
            return list(tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                tokenize=True))
        if not isinstance(prompt, str):
            raise InvalidRequestError("Give 'prompt' (a string) or 'messages'.", param="prompt")
        return tok.encode(prompt, add_special_tokens=add_special_tokens)

    def call_detokenize(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        vocab = len(self.core.tokenizer)
        bad = next((t for t in token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequestError(f"Token id {bad} is out of the vocabulary (0..{vocab - 1}).", param="tokens")
        return self.core.tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def call_apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        return self.core.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                       tokenize=False)

    def call_token_bytes(self) -> list[bytes]:
        if self._token_bytes is None:
            self._token_bytes = token_bytes(self.core.tokenizer)
        return self._token_bytes

    def call_tokenizer_state(self) -> dict | None:
        """What the client needs to tokenize and render chat templates itself, exactly as this process
        would (engine.frontend.client.EngineClient tokenizes off this loop): the backend's tokenizer.json, the
        special tokens, the chat templates, the EOS ids, and ``max_token_bytes`` (the most UTF-8 bytes one
        token stands for) when that bounds the token count of a text for certain (else None). None for a
        core whose tokenizer is not an engine.tokenizer.Tokenizer (a test stand-in)."""
        tok = self.core.tokenizer
        backend = getattr(tok, "backend", None)
        if backend is None or not hasattr(backend, "to_str") or not hasattr(tok, "chat_templates"):
            return None
        spec = backend.to_str()
        bound = None
        if length_bound_is_certain(json.loads(spec)):
            bound = max((len(b) for b in self.call_token_bytes()), default=0) or None
        return {"backend": spec, "bos_token": tok.bos_token, "eos_token": tok.eos_token,
                "unk_token": tok.unk_token, "pad_token": tok.pad_token, "chat_templates": dict(tok.chat_templates),
                "eos_token_ids": [int(i) for i in tok.eos_token_ids], "name_or_path": tok.name_or_path,
                "max_token_bytes": bound}

    def call_reset_prefix_cache(self) -> bool:
        self.core.blocks.reset_prefix_cache()
        return True

    # -- throughput over the last seconds ------------------------------------------------------
    def _now(self) -> float:
        return self.clock()

    def step(self) -> list:
        """One core step, its prompt and generated tokens counted for the rates."""
        start = self.clock()
        deltas = self.core.step()
        now = self.clock()
        p, g = int(self.core.prompt_tokens_total), int(self.core.generation_tokens_total)
        p0, g0 = self._counted
        self._counted = (p, g)
        self.prompt_rate.add(p - p0, now, start)
        self.generation_rate.add(g - g0, now, start)
        return deltas

    def _current_rates(self) -> tuple[float, float]:
        now = self.clock()
        return self.prompt_rate.rate(now), self.generation_rate.rate(now)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    boot = json.loads(argv[0])
    logging.basicConfig(level=boot.get("log_level", logging.WARNING),
                        format="%(levelname)s %(name)s [engine]: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(boot.get("ipc_dir"),), name="parent-watch", daemon=True).start()

    ctx = zmq.Context(1)
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.connect(boot["input"])
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 2000)
    push.setsockopt(zmq.SNDHWM, 0)
    push.connect(boot["output"])
    enc = wire.encoder()
    try:
        push.send(enc.encode(wire.Progress("loading", str(boot["config"].get("model") or "default model"))))
        from engine.config import EngineConfig

        config = EngineConfig(**boot["config"])
        t0 = time.monotonic()
        progress.set_listener(lambda stage, detail: push.send(enc.encode(wire.Progress(stage, detail))))
        core = _factory(boot.get("core_factory") or DEFAULT_CORE_FACTORY)(config)
        progress.set_listener(None)
        info = model_info(core, time.monotonic() - t0)
    except BaseException as e:
        log.debug("load failed", exc_info=True)
        push.send(enc.encode(wire.LoadFailed(wire.error_to_info(e, with_traceback=not isinstance(e, KestrelError)))))
        push.close()
        ctx.term()
        return 1
    global _core
    _core = core
    push.send(enc.encode(wire.Ready(info)))
    server = EngineServer(core, pull, push)
    heartbeat = Heartbeat(ctx, boot["output"], server.progress).start()
    code = 0
    try:
        server.run()
    except BaseException as e:  # tell the client why before dying
        log.exception("engine loop failed")
        try:
            push.send(enc.encode(wire.Fatal(wire.error_to_info(e, with_traceback=True))))
        except Exception:
            log.debug("could not report the failure", exc_info=True)
        code = 1
    heartbeat.stop()
    _shutdown_core(core)
    pull.close()
    push.close()
    ctx.term()
    return code


if __name__ == "__main__":
    sys.exit(main())
