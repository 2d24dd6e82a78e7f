"""The engine's worker: a QObject on its own QThread running an asyncio event loop that owns the
EngineClient (which spawns the engine process). The GUI calls its methods (they only schedule work on the
loop, never wait) and hears back through queued signals. The HTTP server runs on this same loop, around the
same client (app.workers.server_worker), so one loaded model serves the chat and the endpoint.

An engine process that dies is restarted with the same model and options (engine.frontend.client.RestartPolicy,
``restart_policy``): the state goes to DEAD with ``engineDied`` and ``engineRestarting`` (the notice, saying
when it restarts), then back to READY with ``engineRestarted`` (the notice); the endpoint keeps its port and
answers 503 meanwhile. Past the policy's limit it stays DEAD (``engineDied``): Reload starts it again.

For one clear state in the chat while that happens (the state stays DEAD throughout, as before):
``restartAttempt(attempt, most, why)`` before each attempt (1-based; ``most`` is the policy's limit;
``restart_text(attempt, most)`` words it "Restarting engine… (attempt 1 of 3)"; ``restart_attempt`` holds the
pair while it lasts, None otherwise), then either ``engineRestarted`` or ``engineGaveUp(reason)``: the engine
is dead for good (restarts spent, or none allowed) and ``reason`` says why (the exit code or signal, the
engine's last error or output line), also kept in ``dead_reason``.

Loading another model over a loaded one tells the model listeners (``add_model_listener``: the endpoint,
which keeps its address and follows the new model) instead of the unload hooks. When that model fails inside the
engine (a file that passed the app's checks: truncated tensor data, an architecture the engine refuses), the
model it replaced is loaded again with its settings: ``loadReverted("<new> could not be loaded: <why>. <old> is
loaded again.")``, then ``loaded`` as for any load (the endpoint follows it back). Only when that fails too (or
nothing was loaded) does ``loadFailed`` leave no model."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal, Slot

from app.workers import stop_thread, thread_for

if TYPE_CHECKING:
    from engine.frontend.client import EngineClient
    from engine.config import EngineConfig
    from engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)

EMPTY, LOADING, READY, FAILED, DEAD = "empty", "loading", "ready", "failed", "dead"


@dataclass
class ReplyStats:
    finish_reason: str | None  # "stop" | "length" | "abort"
    num_tokens: int
    num_prompt_tokens: int
    ttft: float | None  # seconds, request handed over -> first token
    tokens_per_s: float | None  # decode speed after the first token


class EngineWorker(QObject):
    stateChanged = Signal(str)
    loadProgress = Signal(str)
    loaded = Signal(object)  # engine.wire.ModelInfo
    loadFailed = Signal(str)  # what went wrong, in plain words
    loadReverted = Signal(str)  # the new model failed and the one before is loaded again (then `loaded`): words
    loadCancelled = Signal()
    unloaded = Signal()
    engineDied = Signal(str)
    engineRestarting = Signal(str)  # the engine died and is being restarted: the notice, in words
    engineRestarted = Signal(str)  # ... and is back: the notice
    delta = Signal(str, str)  # request id, new text
    replyFinished = Signal(str, object)  # request id, ReplyStats
    replyFailed = Signal(str, str)  # request id, message
    statsUpdated = Signal(object)  # engine.wire.EngineStats
    requestRecorded = Signal(object)  # engine.metrics.RequestRecord of every finished request (chat and HTTP)
    restartAttempt = Signal(int, int, str)  # attempt (1-based), the most attempts allowed, why (the notice)
    engineGaveUp = Signal(str)  # the engine is dead for good (no restart follows): why, in words
    loadRequested = Signal()  # load() was called (on the GUI thread, at once): see load_pending
    fitted = Signal(str, object)  # tag (a send's request id, a count's tag), app.chat_context.Fit | None | Exception

    def __init__(self, stats_interval: float = 0.5, parent: QObject | None = None, restart_policy=None):
        super().__init__(parent)
        self.stats_interval = stats_interval
        self.restart_policy = restart_policy  # None: engine.frontend.client.RestartPolicy(delay_s=2.0, max_restarts=3)
        self.loop = asyncio.new_event_loop()
        self.client: EngineClient | None = None  # touched on the loop's thread only
        self.info = None  # the loaded model's ModelInfo (read anywhere)
        self.tool_mode: dict | None = None  # what tool_choice "auto" does on it (client_tool_mode; read anywhere)
        self.config: EngineConfig | None = None
        self._core_factory: str | None = None  # the loaded config's core_factory (tests' stand-in cores)
        self.state = EMPTY
        # True from load() (the click on Load) until the loop's _load reaches LOADING: the model before may still
        # be READY meanwhile (its endpoint stopped, its engine unloaded first), and a chat turn sent then would
        # be cut by the unload ("No model is loaded"). ``accepting`` is what the chat asks. Loads are counted
        # (asked on the GUI thread, begun on the loop) so that a load ending does not clear a later one's.
        self._loads_asked = 0
        self._loads_begun = 0
        self._load_task: asyncio.Task | None = None
        self._stats_task: asyncio.Task | None = None
        self._streams: dict[str, Any] = {}
        self._aborted: set[str] = set()
        self._unload_hooks: list[Callable[[], Awaitable[None]]] = []
        self._model_listeners: list[tuple[Callable[[Any], Awaitable[None]],
                                          Callable[[Any, str], Awaitable[None]]]] = []
        self._attempts: list[float] = []  # when each restart attempt of the current client was announced
        self.restart_attempt: tuple[int, int] | None = None  # (attempt, most) while a restart is under way
        self.dead_reason = ""  # why the engine is dead for good (engineGaveUp's reason)
        self._thread = thread_for(self, "engine")
        self._thread.started.connect(self._run)

    # ------------------------------------------------------------------------------------------------
    # GUI side: each call schedules a coroutine and returns at once

    def start(self) -> None:
        self._thread.start()

    def submit(self, coro) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def load(self, config: EngineConfig, core_factory: str | None = None) -> None:
        self._loads_asked += 1
        n = self._loads_asked
        self.loadRequested.emit()
        self.submit(self._load(config, core_factory, n))

    @property
    def load_pending(self) -> bool:
        """A load was asked for and has not reached LOADING (nor ended) yet."""
        return self._loads_asked > self._loads_begun

    @property
    def accepting(self) -> bool:
        """Whether a chat turn can be sent now: a model is READY and no load has been asked for since."""
        return self.state == READY and not self.load_pending

    def cancel_load(self) -> None:
        self.loop.call_soon_threadsafe(self._cancel_load)

    def unload(self) -> None:
        self.submit(self._unload(emit=True))

    def send(self, request_id: str, conversation: list[dict], params: SamplingParams, policy: str) -> None:
        """A chat turn, the one call a send makes: on the loop, ``conversation`` is fitted to the context under
        the overflow ``policy`` (app.chat_context; counted with the model's tokenizer), ``fitted(request_id,
        fit)`` says how, and a fit that leaves room for a reply goes to the engine with its token ids (tokenized
        once) and ``params.max_tokens`` clamped to the room: ``delta`` ... ``replyFinished`` / ``replyFailed``.
        A fit that refuses the turn (``fit.ok`` false) sends nothing. No model: ``fitted(request_id, None)``,
        then ``replyFailed``."""
        self.submit(self._send(request_id, conversation, params, policy))

    def count(self, tag: str, conversation: list[dict], max_tokens: int, policy: str) -> None:
        """The context meter's count of the next turn (as ``send`` would fit it, nothing sent): ``fitted(tag,
        fit)``, or ``fitted(tag, None)`` without a model."""
        self.submit(self._count(tag, conversation, max_tokens, policy))

    def abort(self, request_id: str) -> None:
        self.loop.call_soon_threadsafe(self._abort, request_id)

    def add_unload_hook(self, hook: Callable[[], Awaitable[None]]) -> None:
        """``await hook()`` runs on the loop before the model is unloaded or replaced (the server stops)."""
        self._unload_hooks.append(hook)

    def add_model_listener(self, replacing: Callable[[Any], Awaitable[None]],
                           done: Callable[[Any, str], Awaitable[None]]) -> None:
        """For a load over a loaded model (another model, or the same one with other settings): ``await
        replacing(config)`` runs on the loop before the current model is unloaded (instead of the unload
        hooks), and ``await done(client, "")`` once the new one is loaded, or ``await done(None, why)`` when
        that load failed or was cancelled (no model is loaded then; ``why``: "the load was cancelled", ...)."""
        self._model_listeners.append((replacing, done))

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop everything (blocking; for the app's exit): the server, the engine process, the loop, the thread."""
        if not self._thread.isRunning():
            return
        try:
            self.submit(self._unload(emit=False)).result(timeout)
        except Exception:
            log.warning("engine shutdown did not finish cleanly", exc_info=True)
        self.loop.call_soon_threadsafe(self.loop.stop)
        stop_thread(self._thread, int(timeout * 1000))

    # ------------------------------------------------------------------------------------------------
    # the loop's side

    @Slot()
    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.close()

    def _set_state(self, state: str, load: int = 0) -> None:
        """``load``: the number of the load that reached this state (no longer pending, with those before)."""
        self.state = state
        self._loads_begun = max(self._loads_begun, load)
        self.stateChanged.emit(state)

    async def _load(self, config: EngineConfig, core_factory: str | None, n: int = 0) -> None:
        try:
            await self._load_now(config, core_factory, n)
        finally:
            if self._loads_begun < n:  # it ended before LOADING (an error, a cancel): the chat asks again
                self._set_state(self.state, n)

    async def _load_now(self, config: EngineConfig, core_factory: str | None, n: int) -> None:
        if self._load_task is not None and not self._load_task.done():
            self._load_task.cancel()
        replacing = self.client is not None
        # the model that works now, brought back if the new one fails inside the engine (loadReverted)
        previous = (self.config, self._core_factory, self.info.name) \
            if replacing and self.state == READY and self.config is not None and self.info is not None else None
        if replacing:
            for on_replacing, _ in self._model_listeners:
                try:
                    await on_replacing(config)
                except Exception:
                    log.exception("model listener failed")
        await self._unload(emit=False, hooks=not replacing)
        self.config, self._core_factory = config, core_factory
        self.restart_attempt, self._attempts, self.dead_reason = None, [], ""
        self._set_state(LOADING, n)
        self.loadProgress.emit("Starting the engine process…")
        try:
            client = await self._start_client(config, core_factory)
        except asyncio.CancelledError:
            await self._cancelled()
            return
        except Exception as e:  # noqa: BLE001 - said in words: the load failed
            why = _load_error(e, config)
            if previous is None:
                await self._failed(why)
            else:
                await self._revert(previous, f"{model_words(config)} could not be loaded: {why}")
            return
        await self._adopt(client)

    async def _start_client(self, config: EngineConfig, core_factory: str | None) -> EngineClient:
        from engine.frontend.client import EngineClient

        def progress(stage: str, detail: str) -> None:
            self.loadProgress.emit(f"{stage.capitalize()} {detail}…")

        self._load_task = asyncio.ensure_future(
            EngineClient.start(config, core_factory=core_factory, on_progress=progress,
                               restart=self._restart_policy()))
        try:
            return await self._load_task
        finally:
            self._load_task = None

    async def _revert(self, previous: tuple, failure: str) -> None:
        """The new model failed inside the engine (after the app's checks passed: corrupt tensor data, an
        architecture the engine refuses, ...): load the model it replaced again, with its settings, so a failed
        load leaves the model that worked. ``loadReverted`` says so before ``loaded``; a second failure is a
        plain ``loadFailed`` naming both."""
        config, core_factory, name = previous
        self.config, self._core_factory = config, core_factory
        self.loadProgress.emit(f"{failure}. Loading {name} again…")
        try:
            client = await self._start_client(config, core_factory)
        except asyncio.CancelledError:
            await self._cancelled()
            return
        except Exception as e:  # noqa: BLE001
            await self._failed(f"{failure}. {name} could not be loaded again either: {_load_error(e, config)}")
            return
        self.loadReverted.emit(f"{failure}. {name} is loaded again.")
        await self._adopt(client)

    async def _adopt(self, client: EngineClient) -> None:
        """A started client becomes the loaded model: READY, ``loaded``, the model listeners told."""
        self.client = client
        self.info = client.info
        from engine.server.openai.tools import client_tool_mode

        self.tool_mode = client_tool_mode(client)
        client.add_listener(self.requestRecorded.emit)
        client.add_state_listener(functools.partial(self._on_client_state, client))
        self._stats_task = asyncio.ensure_future(self._poll_stats(client))
        self._set_state(READY)
        self.loaded.emit(client.info)
        await self._tell_loaded(client, "")

    async def _failed(self, why: str) -> None:
        self._set_state(FAILED)
        self.loadFailed.emit(why)
        await self._tell_loaded(None, "the model could not be loaded")

    async def _cancelled(self) -> None:
        self._set_state(EMPTY)
        self.loadCancelled.emit()
        await self._tell_loaded(None, "the load was cancelled")

    async def _tell_loaded(self, client, why: str) -> None:
        for _, done in self._model_listeners:
            try:
                await done(client, why)
            except Exception:
                log.exception("model listener failed")

    def _cancel_load(self) -> None:
        if self._load_task is not None and not self._load_task.done():
            self._load_task.cancel()

    async def _unload(self, emit: bool, hooks: bool = True) -> None:
        for hook in self._unload_hooks if hooks else ():
            try:
                await hook()
            except Exception:
                log.exception("unload hook failed")
        if self._load_task is not None and not self._load_task.done():
            self._load_task.cancel()
        client, self.client = self.client, None
        if self._stats_task is not None:
            self._stats_task.cancel()
            self._stats_task = None
        for stream in list(self._streams.values()):
            stream.abort()
        self.restart_attempt = None
        if client is not None:
            self.info = None
            await client.shutdown()
            if emit:
                self._set_state(EMPTY)
                self.unloaded.emit()

    async def _fit(self, conversation: list[dict], max_tokens: int, policy: str):
        """(the Fit of ``conversation`` under ``policy``, the fitted messages' token ids) on the loop; (None,
        None) without a model. Each distinct message list is tokenized once."""
        from app.chat_context import fit_messages

        client = self.client
        if client is None or client.info is None:
            return None, None
        ids: dict[str, list[int]] = {}

        async def count(msgs: list[dict]) -> int:
            if not msgs:
                return 0
            key = json.dumps(msgs, sort_keys=True)
            if key not in ids:
                ids[key] = await client.tokenize(messages=msgs, add_generation_prompt=True)
            return len(ids[key])

        fit = await fit_messages(conversation, count, int(client.info.max_model_len), max_tokens, policy)
        return fit, ids.get(json.dumps(fit.messages, sort_keys=True))

    async def _count(self, tag: str, conversation: list[dict], max_tokens: int, policy: str) -> None:
        try:
            fit, _ = await self._fit(conversation, max_tokens, policy)
        except Exception as e:  # noqa: BLE001 - reported to the GUI
            fit = e
        self.fitted.emit(tag, fit)

    async def _send(self, rid: str, conversation: list[dict], params: SamplingParams, policy: str) -> None:
        messages, prompt_ids = conversation, None
        try:
            fit, prompt_ids = await self._fit(conversation, params.max_tokens, policy)
        except Exception as e:  # noqa: BLE001 - the turn goes as it is: the engine says what is wrong with it
            fit = e
        self.fitted.emit(rid, fit)
        if fit is not None and not isinstance(fit, Exception):
            if not fit.ok:
                self._aborted.discard(rid)
                return
            messages = fit.messages
            params = dataclasses.replace(params, max_tokens=fit.max_tokens)
        await self._generate(rid, messages, params, prompt_ids)

    async def _generate(self, rid: str, messages: list[dict], params: SamplingParams,
                        prompt_ids: list[int] | None = None) -> None:
        """The request of a turn (``prompt_ids``: ``messages`` already tokenized), streamed back as signals."""
        from engine.errors import KestrelError

        client = self.client
        if client is None:
            self.replyFailed.emit(rid, "No model is loaded. Load one in the Load panel.")
            return
        try:
            if prompt_ids is not None:
                stream = await client.add_request(prompt_token_ids=prompt_ids, params=params, request_id=rid)
            else:
                stream = await client.add_request(messages=messages, params=params, request_id=rid)
        except KestrelError as e:
            self.replyFailed.emit(rid, _plain(e))
            return
        self._streams[rid] = stream
        if rid in self._aborted:
            stream.abort()
        first = last = None
        n_out = n_prompt = 0
        reason = None
        try:
            while batch := await stream.next_batch():
                text = "".join(d.text for d in batch)
                for d in batch:
                    if d.token_ids:
                        first = first if first is not None else d.time
                        last = d.time
                    n_out = max(n_out, d.num_output_tokens)
                    if d.finished:
                        reason = d.finish_reason
                        n_prompt = d.num_prompt_tokens
                if text:
                    self.delta.emit(rid, text)
        except KestrelError as e:
            self.replyFailed.emit(rid, _plain(e))
            return
        finally:
            self._streams.pop(rid, None)
            self._aborted.discard(rid)
        if stream.aborted:
            reason = "abort"
        ttft = first - stream.arrival if first is not None else None
        tps = (n_out - 1) / (last - first) if first is not None and last is not None and last > first else None
        self.replyFinished.emit(rid, ReplyStats(reason, n_out, n_prompt or (stream.num_prompt_tokens or 0),
                                                ttft, tps))

    def _abort(self, rid: str) -> None:
        stream = self._streams.get(rid)
        if stream is not None:
            stream.abort()
        else:
            self._aborted.add(rid)

    def _restart_policy(self):
        from engine.frontend.client import RestartPolicy

        return self.restart_policy if self.restart_policy is not None else RestartPolicy(delay_s=2.0, max_restarts=3)

    def _on_client_state(self, client: EngineClient, state: str, detail: str) -> None:
        """The client's news (on the loop): its engine died and restarts, came back, or is dead for good."""
        if client is not self.client:
            return
        if state == "restarting":
            if self.state != DEAD:
                self._set_state(DEAD)
                self.engineDied.emit(detail)
            attempt, most = self._count_attempt(client)
            self.restart_attempt = (attempt, most)
            self.engineRestarting.emit(detail)
            self.restartAttempt.emit(attempt, most, detail)
            self.loadProgress.emit(restart_text(attempt, most))
        elif state == "ready":
            self.info = client.info
            self.restart_attempt = None
            self._set_state(READY)
            self.engineRestarted.emit(f"{detail} It runs again (restart {client.restarts}); the chat and the "
                                      "endpoint work as before.")
        elif state == "dead":
            self._gave_up(detail or client.dead_reason or "The engine process stopped.")

    def _count_attempt(self, client: EngineClient) -> tuple[int, int]:
        """The restart about to be made: its number among those the policy counts (within its window), and
        the most it allows."""
        policy = client.restart_policy or self._restart_policy()
        now = time.monotonic()
        self._attempts = [t for t in self._attempts if t >= now - policy.window_s] + [now]
        return len(self._attempts), max(policy.max_restarts, len(self._attempts))

    def _gave_up(self, reason: str) -> None:
        """The engine is dead and stays so: say why once (the state DEAD, engineDied, engineGaveUp)."""
        if self.dead_reason:
            return
        self.restart_attempt = None
        self.dead_reason = reason
        if self.state != DEAD:
            self._set_state(DEAD)
        self.engineDied.emit(reason)
        self.engineGaveUp.emit(reason)

    async def _poll_stats(self, client: EngineClient) -> None:
        from engine.errors import EngineDeadError

        while True:
            if client is not self.client:
                return
            if not client.is_alive:
                if client.state not in ("dead", "closed"):  # restarting (or about to): the listener says so
                    await asyncio.sleep(self.stats_interval)
                    continue
                self._gave_up(client.state_detail or client.dead_reason or "The engine process stopped.")
                return
            try:
                stats = await asyncio.wait_for(client.stats(), 30)
            except (EngineDeadError, asyncio.TimeoutError):
                await asyncio.sleep(0.2)
                continue
            except Exception:
                log.debug("stats failed", exc_info=True)
            else:
                self.statsUpdated.emit(stats)
            await asyncio.sleep(self.stats_interval)


def restart_text(attempt: int, most: int) -> str:
    """The one line the app shows while the engine restarts by itself."""
    return f"Restarting engine… (attempt {attempt} of {most})"


def model_words(config) -> str:
    """The model a config loads, as the messages name it: the file or folder's name ("x.Q4_1.gguf")."""
    from pathlib import Path

    model = str(getattr(config, "model", "") or "")
    return Path(model.rstrip("/")).name if model else "The embedded model"


def _load_error(e: BaseException, config) -> str:
    """Why a load failed, in words: an engine error's own message, with a file the error names given by its
    name, not its whole path ("the file is truncated: ..." when it is the model's own file)."""
    from pathlib import Path

    from engine.errors import KestrelError

    if not isinstance(e, KestrelError):
        log.error("load failed", exc_info=e)
        return f"{type(e).__name__}: {e}"
    path, problem = getattr(e, "path", None), getattr(e, "problem", None)
    if not path or not problem:
        return _plain(e)
    model = str(getattr(config, "model", "") or "")
    own = bool(model) and Path(path) == Path(model)
    subject = "the file" if own else Path(path).name
    return f"{subject} {problem}" if problem.split(" ", 1)[0] in ("is", "has", "cannot") else f"{subject}: {problem}"


def _plain(e: BaseException) -> str:
    """The error's own message (engine errors are written for people), without Python's type names."""
    text = str(e).strip()
    return text or type(e).__name__
