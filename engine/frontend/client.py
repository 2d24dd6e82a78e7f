"""EngineClient: the asyncio face of the engine process. The GUI and the OpenAI server both use it, so one
loaded model serves both. No server or Qt imports here; torch is not imported in the client's process.

The API, in short: engine/frontend/__init__.py.

Errors are engine.errors types: the engine's own (InvalidRequestError, PromptTooLongError, CheckpointError
from a failed load, ...) are rebuilt on this side with their message. A dead engine (crash, kill, OOM) is
noticed at once (engine.frontend.supervisor's thread waiting on the process); every pending and later call then
raises EngineDeadError (EngineShuttingDownError after shutdown()) instead of hanging.

Prompts are tokenized here, not in the engine process: after loading, the engine hands over its tokenizer
(``tokenizer_state``), and add_request renders the chat template and tokenizes on a worker thread, so the
engine's step loop never stalls on a huge prompt; a prompt longer than the context is refused here, by its
UTF-8 length alone where that proves it (PromptTooLongError, "at least N tokens"). That tokenizer and those
checks are engine.frontend.tokenizer's (LocalTokenizer, check_prompt_length).

The engine process itself (starting it, its sockets, watching it, stopping it and cleaning up, also at
interpreter exit) is supervisor.EngineSupervisor's (this package), and so are RestartPolicy and the restart loop
(Restarter). What the client does when the engine is lost (a crash, a hang, a broken connection: every
pending request and call fails, then the restart) is crash_recovery.CrashRecovery's, a base class of
EngineClient. A request's deltas arrive in a request_stream.RequestStream, which pending.StreamTable routes
them to; calls wait on pending.CallTable. This module is the request API on top: requests, calls, the reader,
the client's state. RequestStream and RestartPolicy are importable from here too.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from engine import wire
from engine.frontend.tokenizer import LocalTokenizer, check_prompt_length
from engine.config import EngineConfig
from engine.core.embedding import check_embedding_input
from engine.frontend.crash_recovery import CrashRecovery, cancel_task
from engine.frontend.supervisor import EngineSupervisor, Restarter, RestartPolicy
from engine.frontend.watchdog import WatchdogPolicy
from engine.errors import (
    EngineDeadError,
    EngineShuttingDownError,
    InvalidRequestError,
    KestrelError,
    PromptTooLongError,
)
from engine.wire import EngineStats, ModelInfo, RequestDelta
from engine.metrics import RequestRecord
from engine.outputs import EmbeddingOutput
from engine.frontend.request_stream import RequestStream
from engine.frontend.pending import CallTable, StreamTable
from engine.sampling_params import SamplingParams, fan_out

log = logging.getLogger(__name__)

__all__ = ["EngineClient", "EngineStats", "ModelInfo", "RequestDelta", "RequestRecord", "RequestStream",
           "RestartPolicy"]

_ids = itertools.count()


class EngineClient(CrashRecovery):
    def __init__(self) -> None:  # use `await EngineClient.start(...)`
        self.info: ModelInfo | None = None
        self.config: EngineConfig | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._engine: EngineSupervisor | None = None  # the process and its sockets
        self._in: zmq.Socket | None = None  # plain socket: sends never wait
        self._out: zmq.asyncio.Socket | None = None
        self._enc = wire.encoder()
        self._dec = wire.client_decoder()
        self._requests = StreamTable(self._abort_nowait)  # the open requests' streams, the records' listeners
        self._calls = CallTable()  # calls awaiting their reply
        self._dead: EngineDeadError | None = None
        self._closing = False
        self._closed = False
        self._fatal: wire.ErrorInfo | None = None
        self._reader: asyncio.Task | None = None
        self._token_bytes: list[bytes] | None = None
        self._tokenizer: LocalTokenizer | None = None
        # how the engine was started (a restart repeats it)
        self._core_factory: str | None = None
        self._log_level: int | None = None
        self._on_progress: Callable[[str, str], None] | None = None
        self._restarter = Restarter(None)  # the restart policy and the restarts made under it
        self.restarts = 0  # restarts that succeeded
        self._restart_task: asyncio.Task | None = None
        self._watchdog_policy: WatchdogPolicy | None = None
        self.hangs = 0  # engine processes killed for not answering (the supervisor's watchdog)
        self.state = "starting"
        self.state_detail = ""
        self._state_listeners: list[Callable[[str, str], None]] = []

    # ------------------------------------------------------------------------------------------------
    # start

    @classmethod
    async def start(cls, config: EngineConfig | None = None, *, core_factory: str | None = None,
                    on_progress: Callable[[str, str], None] | None = None, log_level: int | None = None,
                    startup_timeout: float | None = None, restart: RestartPolicy | None = None,
                    watchdog: WatchdogPolicy | None = WatchdogPolicy()) -> EngineClient:
        """Start the engine process and wait until its model is loaded. A load failure raises its typed
        error (ModelNotFoundError, CheckpointError, ...); a process that dies while loading raises
        EngineDeadError with the end of its error output. ``core_factory`` ("module:callable", taking the
        EngineConfig) replaces EngineCore, for tests. ``restart``: restart the engine if it dies later.
        ``watchdog``: when an engine that stops answering is killed and handled as a crash (None: never).
        An invalid ``speculative_config`` raises InvalidRequestError here, before any process starts."""
        from engine.spec.config import parse_speculative_config

        self = cls()
        self.config = config or EngineConfig()
        parse_speculative_config(self.config.speculative_config)
        self.loop = asyncio.get_running_loop()
        self._core_factory, self._log_level, self._on_progress = core_factory, log_level, on_progress
        self._restarter = Restarter(restart)
        self._watchdog_policy = watchdog
        try:
            await asyncio.wait_for(self._launch(on_progress), startup_timeout)
        except BaseException:
            await self._cleanup(kill=True)
            raise
        self._set_state("ready", "")
        return self

    async def _launch(self, on_progress) -> None:
        """Spawn an engine process, wait until it is ready, start reading, take over its tokenizer (prompts are
        then tokenized here, off the engine's loop; an engine with none to give tokenizes for itself)."""
        self._engine = EngineSupervisor(self.loop, on_exit=self._on_exit)
        self._engine.spawn(self.config, self._core_factory, self._log_level)
        self._in, self._out = self._engine.input, self._engine.output
        self.info = await self._engine.wait_ready(on_progress)
        self._reader = self.loop.create_task(self._read_loop(), name="engine-client-reader")
        self._engine.watch_answers(self._watchdog_policy, self._on_hang)
        old, self._tokenizer = self._tokenizer, None
        if old is not None:
            old.close()
        self._tokenizer = await LocalTokenizer.take_over(await self._call("tokenizer_state", _launching=True))

    # ------------------------------------------------------------------------------------------------
    # state

    @property
    def is_alive(self) -> bool:
        return self._dead is None and not self._closing and self._engine is not None and self._engine.running

    @property
    def dead_reason(self) -> str | None:
        return None if self._dead is None else str(self._dead)

    @property
    def restarting(self) -> bool:
        return self.state == "restarting"

    @property
    def restart_policy(self) -> RestartPolicy | None:
        return self._restarter.policy

    @property
    def heartbeat_age(self) -> float | None:
        """Seconds since the engine process's last heartbeat (None: not watched)."""
        return None if self._engine is None else self._engine.heartbeat_age()

    @property
    def engine_pid(self) -> int | None:
        return None if self._engine is None else self._engine.pid

    @property
    def tokenizer(self):
        """The engine.tokenizer.Tokenizer this client tokenizes with (None: the engine tokenizes)."""
        return None if self._tokenizer is None else self._tokenizer.tok

    @property
    def _proc(self):  # the engine's subprocess.Popen (tests look at it)
        return None if self._engine is None else self._engine.proc

    @property
    def _ipc_dir(self) -> str | None:  # the sockets' directory (tests check that it is removed)
        return None if self._engine is None else self._engine.ipc_dir

    def add_state_listener(self, fn: Callable[[str, str], None]) -> None:
        """Call ``fn(state, detail)`` (on the loop) on every change of ``state``: "restarting" (the engine
        died; detail: why), "ready" (started or restarted), "dead" (for good; detail: why), "closed"."""
        self._state_listeners.append(fn)

    def remove_state_listener(self, fn: Callable[[str, str], None]) -> None:
        self._state_listeners.remove(fn)

    def _set_state(self, state: str, detail: str) -> None:
        self.state, self.state_detail = state, detail
        for fn in list(self._state_listeners):
            try:
                fn(state, detail)
            except Exception:
                log.exception("engine state listener failed")

    def _check(self) -> None:
        if self._dead is not None:
            raise self._dead
        if self._closing:
            raise EngineShuttingDownError("The engine is shutting down.")

    async def health(self) -> None:
        """Raises EngineDeadError (saying why) unless the engine process is running."""
        self._check()
        if not self._engine.running:  # exited, the watcher's news not yet handled: handle it now, as it will
            self._on_exit(self._engine.returncode)
            self._check()

    # ------------------------------------------------------------------------------------------------
    # requests

    async def add_request(self, prompt: str | list[int] | None = None, params: SamplingParams | None = None, *,
                          messages: list[dict] | None = None, prompt_token_ids: list[int] | None = None,
                          request_id: str | None = None) -> RequestStream:
        """Queue one request (n samples as params.n says) and return its stream. Give a prompt (text or
        token ids), ``prompt_token_ids`` or chat ``messages``. The chat template and tokenizing happen here,
        off the engine's loop (on a worker thread when large); a prompt longer than the context raises
        PromptTooLongError at once, without reaching the engine."""
        self._check()
        params = params or SamplingParams()
        if isinstance(prompt, (list, tuple)):
            prompt_token_ids, prompt = list(prompt), None
        if prompt is None and prompt_token_ids is None and messages is None:
            raise InvalidRequestError("Give a prompt, prompt token ids or chat messages.", param="prompt")
        rid = request_id or f"req-{next(_ids)}"
        children = fan_out(params)
        child_ids = [f"{rid}#{i}" if len(children) > 1 else rid for i in range(len(children))]
        self._requests.check_free(rid, child_ids)
        arrival = time.monotonic()
        tok = self._tokenizer
        if prompt_token_ids is None and tok is not None:
            prompt_token_ids = await tok.prompt_ids(prompt, messages, params, self.info.max_model_len)
            prompt = messages = None
            self._check()  # the engine may have died (or the id been taken) meanwhile
            self._requests.check_free(rid, child_ids)
        elif prompt_token_ids is not None:
            check_prompt_length(len(prompt_token_ids), params, self.info.max_model_len)
        msg = wire.AddRequest(child_ids, children, prompt, prompt_token_ids, messages)
        del prompt_token_ids
        return self._send_request(rid, msg, arrival)

    def _send_request(self, rid: str, msg: wire.AddRequest, arrival: float) -> RequestStream:
        """Encode and send one AddRequest; its stream, registered before the engine can answer."""
        child_ids = msg.child_ids
        try:
            data = self._enc.encode(msg)
        except (UnicodeEncodeError, OverflowError, TypeError) as e:
            raise InvalidRequestError(f"The request cannot be sent to the engine: {e}.") from None
        del msg
        stream = self._requests.open(rid, child_ids, arrival)
        try:
            self._send_raw(data)
        except BaseException:
            self._requests.forget(stream)
            raise
        return stream

    async def embed(self, inputs: list[str | list[int]], *, request_id: str | None = None
                    ) -> list[EmbeddingOutput]:
        """The embedding of each input (a text, tokenized here with the tokenizer's special tokens, or token
        ids), in order. Each input is one prefill-only engine request, batched by the engine's scheduler with
        everything else; an input that is empty, out of the vocabulary or longer than the context raises
        InvalidRequestError naming it (``input[i]`` when there are several), before anything is sent."""
        self._check()
        rid = request_id or f"emb-{next(_ids)}"
        ids_of: list[list[int] | None] = []
        for i, x in enumerate(inputs):
            where = "input" if len(inputs) == 1 else f"input[{i}]"
            ids = list(x) if not isinstance(x, str) else (  # chunked: a text surely over the context stops early
                await self._tokenizer.encode_bounded(x, True, self.info.max_model_len)
                if self._tokenizer is not None else None)
            if isinstance(ids, int):
                err = PromptTooLongError(ids, self.info.max_model_len, at_least=True)
                err.param = "input"
                raise err
            if ids is not None:
                check_embedding_input(ids, self.info.vocab_size, self.info.max_model_len, where)
            elif not x:
                raise InvalidRequestError(f"'{where}' is empty: an embedding needs at least one token.", param="input")
            ids_of.append(ids)
        self._check()
        arrival = time.monotonic()
        params = [SamplingParams(max_tokens=1)]
        streams: list[RequestStream] = []
        try:
            for i, (x, ids) in enumerate(zip(inputs, ids_of)):
                cid = f"{rid}#{i}"
                self._requests.check_free(cid, [cid])
                msg = wire.AddRequest([cid], params, x if ids is None else None, ids, embed=True)
                streams.append(self._send_request(cid, msg, arrival))
            out = []
            for s in streams:
                await s.accepted()
            for s in streams:
                last = None
                while batch := await s.next_batch():
                    last = batch[-1]
                if last is None or last.embedding is None:
                    raise KestrelError(f"The engine ended embedding request {s.request_id} without a vector "
                                       f"({last.finish_reason if last else 'no output'}).")
                out.append(EmbeddingOutput(last.embedding, last.num_prompt_tokens))
            return out
        finally:
            for s in streams:
                s.abort()

    async def generate(self, prompt: str | list[int] | None = None, params: SamplingParams | None = None, *,
                       messages: list[dict] | None = None, prompt_token_ids: list[int] | None = None,
                       request_id: str | None = None) -> AsyncIterator[RequestDelta]:
        """The request's deltas as they come (``d.index`` tells the sample). Leaving the loop early (break,
        cancellation, an exception) aborts the request: at once inside ``contextlib.aclosing(...)``,
        otherwise when asyncio finalizes the abandoned generator (the next loop iteration or so)."""
        stream = await self.add_request(prompt, params, messages=messages, prompt_token_ids=prompt_token_ids,
                                        request_id=request_id)
        try:
            while batch := await stream.next_batch():
                for d in batch:
                    yield d
        finally:
            stream.abort()

    async def abort(self, request_id: str) -> None:
        """Abort a request by the id given to (or returned by) add_request."""
        stream = self._requests.find(request_id)
        if stream is not None:
            stream.abort()

    def _abort_nowait(self, child_ids: list[str]) -> None:
        if self._dead is None and not self._closed and self._in is not None:
            try:
                self._send_raw(self._enc.encode(wire.Abort(child_ids)))
            except KestrelError:
                pass

    def _send_raw(self, data: bytes, check: bool = True) -> None:
        if check:
            self._check()
        try:
            self._in.send(data, zmq.NOBLOCK, copy=False)
        except zmq.ZMQError as e:  # no peer: the engine is gone
            raise EngineDeadError(f"The engine is not reachable ({e}).") from None

    # ------------------------------------------------------------------------------------------------
    # calls

    async def _call(self, method: str, _launching: bool = False, **args: Any) -> Any:
        if not _launching:  # a restart's own calls go to the new engine before the client is open again
            self._check()
        return await self._calls.call(method, args, functools.partial(self._send_call, check=not _launching))

    def _send_call(self, msg: wire.Call, check: bool = True) -> None:
        try:
            data = self._enc.encode(msg)
        except (UnicodeEncodeError, OverflowError, TypeError) as e:
            raise InvalidRequestError(f"The request cannot be sent to the engine: {e}.") from None
        self._send_raw(data, check)

    async def stats(self, recent: int = 32) -> EngineStats:
        """Running / waiting requests, KV-cache use, prefix-cache hits, token rates, recent steps."""
        return msgspec.convert(await self._call("stats", recent=recent), EngineStats)

    async def ping(self) -> float:
        """Round trip to the engine loop (waits for the current step to finish); returns seconds."""
        t0 = time.monotonic()
        await self._call("ping")
        return time.monotonic() - t0

    async def tokenize(self, prompt: str | None = None, *, messages: list[dict] | None = None,
                       add_special_tokens: bool = True, add_generation_prompt: bool = True,
                       most: int | None = None) -> list[int]:
        """The ids; with ``most``, PromptTooLongError for a text surely longer, after bounded work (chunks)."""
        tok = self._tokenizer
        if tok is None:
            return await self._call("tokenize", prompt=prompt, messages=messages,
                                    add_special_tokens=add_special_tokens, add_generation_prompt=add_generation_prompt)
        self._check()
        ids = await tok.tokenize(prompt, messages, add_special_tokens, add_generation_prompt, most)
        if isinstance(ids, int) or (most is not None and len(ids) > most):
            n = ids if isinstance(ids, int) else len(ids)
            raise PromptTooLongError(n, self.info.max_model_len, at_least=isinstance(ids, int))
        return ids

    async def detokenize(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        tok = self._tokenizer
        if tok is None:
            return await self._call("detokenize", token_ids=list(token_ids), skip_special_tokens=skip_special_tokens)
        self._check()
        return await tok.detokenize(token_ids, skip_special_tokens)

    async def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        tok = self._tokenizer
        if tok is None:
            return await self._call("apply_chat_template", messages=messages,
                                    add_generation_prompt=add_generation_prompt)
        self._check()
        return await tok.render(messages, add_generation_prompt)

    def prompt_lower_bound(self, text: str) -> int:
        """At least this many tokens in ``text`` (0 when the tokenizer gives no certain bound)."""
        return 0 if self._tokenizer is None else self._tokenizer.lower_bound(text)

    async def token_bytes(self) -> list[bytes]:
        """The UTF-8 bytes of every token id (fetched once, then cached)."""
        if self._token_bytes is None:
            self._token_bytes = await self._call("token_bytes")
        return self._token_bytes

    async def reset_prefix_cache(self) -> None:
        await self._call("reset_prefix_cache")

    # ------------------------------------------------------------------------------------------------
    # metrics hooks

    def add_listener(self, fn: Callable[[RequestRecord], None]) -> None:
        """Call ``fn(record)`` (on the loop) once for every sequence, however it ends: its ``finish_reason``
        is the engine's ("stop", "length", "abort"), "abort" when stopped here, "error" when it failed (a
        refusal, the engine's death); ``first_token`` is None when no token came."""
        self._requests.add_listener(fn)

    def remove_listener(self, fn: Callable[[RequestRecord], None]) -> None:
        self._requests.remove_listener(fn)

    def recent_requests(self) -> list[RequestRecord]:
        return self._requests.recent_requests()

    # ------------------------------------------------------------------------------------------------
    # the reader

    async def _read_loop(self) -> None:
        sock = self._out
        dec = self._dec
        try:
            while True:
                frame = await sock.recv(copy=False)
                self._dispatch(dec.decode(frame.buffer))
        except asyncio.CancelledError:
            raise
        except zmq.ZMQError:
            if not self._closing and self._dead is None:
                self._mark_dead(EngineDeadError("The connection to the engine process broke."))
                self._set_state("dead", str(self._dead))
        except Exception as e:
            log.exception("engine client reader failed")
            self._mark_dead(EngineDeadError(f"The engine client failed ({type(e).__name__}: {e})."))
            self._set_state("dead", str(self._dead))

    def _dispatch(self, msg) -> None:
        if isinstance(msg, wire.StepOutput):
            self._requests.route(msg)
        elif isinstance(msg, wire.Heartbeat):
            self._engine.heartbeat(msg)
        elif isinstance(msg, wire.Reply):
            self._calls.resolve(msg)
        elif isinstance(msg, wire.Fatal):
            self._fatal = msg.error

    # ------------------------------------------------------------------------------------------------
    # shutdown

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine (pending requests fail with EngineShuttingDownError) and release everything:
        the process, its sockets and their directory. Safe to call twice and after a crash."""
        if self._closed:
            return
        self._closing = True
        task, self._restart_task = self._restart_task, None
        await cancel_task(task)
        self._fail_all(EngineShuttingDownError("The engine is shutting down."))
        engine = self._engine
        if engine is not None and engine.running and self._dead is None and self._in is not None:
            try:
                self._in.send(self._enc.encode(wire.Shutdown()), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
            if not await engine.wait_exit(timeout):
                log.warning("the engine did not stop within %.0f s; terminating it", timeout)
        await self._cleanup(kill=True)

    async def _cleanup(self, kill: bool) -> None:
        self._closing = True
        if self._engine is not None:
            await self._engine.stop(kill)
        await cancel_task(self._reader)
        self._closed = True
        if self._engine is not None:
            self._engine.close()
        if self._tokenizer is not None:
            self._tokenizer.close()
        if self.state != "closed":
            self._set_state("closed", "")

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.shutdown()

