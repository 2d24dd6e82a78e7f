"""What EngineClient waits on from the engine: its open requests (StreamTable) and its calls awaiting their reply
(CallTable).

StreamTable maps each sample's child id to its RequestStream, routes the engine's step outputs into the streams
and hands every finished sample's RequestRecord to the listeners. It is the streams' owner (request_stream.StreamOwner): a stream that ends on the consumer's side (abort) or fails
tells the table to forget it, to abort its unfinished samples in the engine (through the ``send_abort`` the client
gives) and to record them. CallTable numbers the request/reply calls (stats, tokenize, ...) and resolves each
with its Reply. The client holds one of each; they know nothing of sockets or processes: the client gives them
its way of sending.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
from collections.abc import Callable, Iterable
from typing import Any

from engine import wire
from engine.errors import InvalidRequestError
from engine.frontend.request_stream import RequestStream
from engine.metrics import RequestRecord

log = logging.getLogger(__name__)

__all__ = ["CallTable", "StreamTable"]


class StreamTable:
    def __init__(self, send_abort: Callable[[list[str]], None]):
        self.active: dict[str, tuple[RequestStream, int]] = {}  # child id -> (stream, sample index)
        self._send_abort = send_abort
        self._listeners: list[Callable[[RequestRecord], None]] = []
        self._recent: collections.deque[RequestRecord] = collections.deque(maxlen=512)

    # -- requests -------------------------------------------------------------------------------
    def check_free(self, rid: str, child_ids: list[str]) -> None:
        if any(c in self.active for c in child_ids):
            raise InvalidRequestError(f"A request with id {rid!r} is already running.", param="request_id")

    def open(self, rid: str, child_ids: list[str], arrival: float) -> RequestStream:
        """A new stream for these samples, registered (before the engine can answer)."""
        stream = RequestStream(self, rid, child_ids, arrival)
        for i, cid in enumerate(child_ids):
            self.active[cid] = (stream, i)
        return stream

    def find(self, request_id: str) -> RequestStream | None:
        """The open stream of a request, by the id given to (or returned by) add_request."""
        return next((s for s, _ in self.active.values() if s.request_id == request_id), None)

    def route(self, msg: wire.StepOutput) -> None:
        """One engine step's news: requests accepted or refused, and the deltas, each stamped with the step's time
        and its sample's index."""
        active = self.active
        for cid, n_prompt in msg.accepted:
            entry = active.get(cid)
            if entry is not None:
                entry[0].on_accepted(n_prompt)
        for cid, info in msg.errors:
            entry = active.pop(cid, None)
            if entry is not None:
                entry[0].fail(wire.error_from_info(info))
        t = msg.time
        for d in msg.deltas:
            entry = active.get(d.request_id)
            if entry is None:
                continue  # aborted here already
            d.time = t
            rec = entry[0].push(d, entry[1])
            if d.finished:
                del active[d.request_id]
                if rec is not None:
                    self.record((rec,))

    def fail_all(self, err: BaseException) -> None:
        streams = {id(s): s for s, _ in self.active.values()}
        self.active.clear()
        for s in streams.values():
            s.fail(err)

    # -- StreamOwner: what a stream tells its owner -----------------------------------------------
    def forget(self, stream: RequestStream) -> None:
        for cid in stream.child_ids:
            entry = self.active.get(cid)
            if entry is not None and entry[0] is stream:
                del self.active[cid]

    def abort(self, child_ids: list[str]) -> None:
        self._send_abort(child_ids)

    def record(self, records: Iterable[RequestRecord]) -> None:
        """Hand finished samples' records to the listeners (on the loop): once per sample, when the engine
        finishes it (any finish reason, "abort" included), when ``abort()`` stops it here ("abort") and when it
        fails ("error")."""
        for rec in records:
            self._recent.append(rec)
            for fn in self._listeners:
                try:
                    fn(rec)
                except Exception:
                    log.exception("request listener failed")

    # -- listeners ------------------------------------------------------------------------------
    def add_listener(self, fn: Callable[[RequestRecord], None]) -> None:
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[RequestRecord], None]) -> None:
        self._listeners.remove(fn)

    def recent_requests(self) -> list[RequestRecord]:
        return list(self._recent)


class CallTable:
    def __init__(self) -> None:
        self.waiting: dict[int, asyncio.Future] = {}  # call id -> the future its Reply resolves
        self._ids = itertools.count()

    async def call(self, method: str, args: dict[str, Any], send: Callable[[wire.Call], None]) -> Any:
        """Send one call with ``send`` and wait for its reply (the engine's typed error raised here)."""
        call_id = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self.waiting[call_id] = fut
        try:
            send(wire.Call(call_id, method, args))
            return await fut
        finally:
            self.waiting.pop(call_id, None)

    def resolve(self, msg: wire.Reply) -> None:
        fut = self.waiting.pop(msg.call_id, None)
        if fut is not None and not fut.done():
            if msg.error is not None:
                fut.set_exception(wire.error_from_info(msg.error))
            else:
                fut.set_result(msg.result)

    def fail_all(self, err: BaseException) -> None:
        calls = list(self.waiting.values())
        self.waiting.clear()
        for fut in calls:
            if not fut.done():
                fut.set_exception(err)
