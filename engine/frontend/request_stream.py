"""RequestStream: the deltas of one request made through engine.frontend.client.EngineClient (all its n samples),
in arrival order, and its RequestRecords (engine.metrics: TTFT, inter-token latencies, queue time) for the
client's listeners: exactly one per sample, however it ends (the engine's finish reason; "abort" when
``abort()`` stops it here, "error" when ``fail`` ends it), with the timings it has.

Its owner (the client's engine.frontend.pending.StreamTable) feeds it from the client's reader
(``on_accepted`` when the engine has queued the request, ``push`` per delta, ``fail`` with a typed error); the
consumer waits on ``accepted()`` and ``next_batch()`` or iterates it, and ``abort()`` tells the owner
(StreamOwner, below) to forget the stream, abort its unfinished samples in the engine and record them.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator, Iterable
from typing import Protocol

from engine.wire import RequestDelta
from engine.metrics import RequestRecord

__all__ = ["RequestStream", "StreamOwner"]


class StreamOwner(Protocol):
    """What a stream tells its owner when it ends on its own side (an abort, a failure)."""

    def forget(self, stream: RequestStream) -> None: ...  # route no more deltas to it

    def abort(self, child_ids: list[str]) -> None: ...  # abort these samples in the engine (no wait)

    def record(self, records: Iterable[RequestRecord]) -> None: ...  # samples ended: their records


class RequestStream:
    """The deltas of one request (all its n samples), in arrival order. Iterate it, or call next_batch()."""

    def __init__(self, owner: StreamOwner, request_id: str, child_ids: list[str], arrival: float):
        self.owner = owner
        self.request_id = request_id
        self.child_ids = child_ids
        self.n = len(child_ids)
        self.arrival = arrival  # time.monotonic() when the request was made
        self.num_prompt_tokens: int | None = None
        self._items: collections.deque[RequestDelta] = collections.deque()
        self._event = asyncio.Event()
        self._accepted = asyncio.Event()
        self._error: BaseException | None = None
        self._unfinished = set(child_ids)
        self._records = {cid: RequestRecord(request_id=cid, index=i, arrival=arrival)
                         for i, cid in enumerate(child_ids)}
        self.aborted = False

    # -- fed by the owner -------------------------------------------------------------------
    def on_accepted(self, num_prompt_tokens: int) -> None:
        self.num_prompt_tokens = num_prompt_tokens
        self._accepted.set()

    def push(self, d: RequestDelta, index: int) -> RequestRecord | None:
        d.index = index
        self._items.append(d)
        self._event.set()
        if d.request_id not in self._unfinished:
            return None  # ended here already (aborted or failed): its record is out
        rec = self._records[d.request_id]
        n = len(d.token_ids)
        if n:
            if rec.first_token is None:
                rec.first_token = d.time
            elif rec.last_token is not None:
                gap = (d.time - rec.last_token) / n
                rec.itl.extend([gap] * n)
            rec.last_token = d.time
        rec.num_output_tokens = d.num_output_tokens
        if d.finished:
            self._unfinished.discard(d.request_id)
            rec.num_prompt_tokens = d.num_prompt_tokens
            rec.num_cached_tokens = d.num_cached_tokens
            rec.finished = d.time
            rec.finish_reason = d.finish_reason
            m = d.metrics
            if m is not None:
                rec.queue_time = m.queue_time
                rec.engine_ttft = m.ttft
                rec.engine_e2e = m.e2e
            if not self._unfinished:
                self._accepted.set()
            return rec
        return None

    def fail(self, err: BaseException) -> None:
        if self._error is None:
            self._error = err
        records = self._end_records("error")
        self._unfinished.clear()
        self.owner.forget(self)
        self._accepted.set()
        self._event.set()
        self.owner.record(records)

    def _end_records(self, reason: str) -> list[RequestRecord]:
        """The records of the samples still unfinished, ended now with ``reason`` and the timings they have."""
        now = time.monotonic()
        records = []
        for cid in self.child_ids:
            if cid in self._unfinished:
                rec = self._records[cid]
                rec.finished = now
                rec.finish_reason = reason
                if not rec.num_prompt_tokens and self.num_prompt_tokens:
                    rec.num_prompt_tokens = self.num_prompt_tokens
                records.append(rec)
        return records

    # -- consumer side --------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return not self._unfinished and not self._items

    async def accepted(self) -> int:
        """Wait until the engine has validated and queued the request; returns the prompt's token count.
        Raises the engine's typed error (e.g. PromptTooLongError) if it refused it."""
        await self._accepted.wait()
        if self.num_prompt_tokens is None and self._error is not None:
            raise self._error
        return self.num_prompt_tokens or 0

    async def next_batch(self) -> list[RequestDelta]:
        """Every delta received so far (at least one); [] once all samples have finished. Raises
        EngineDeadError if the engine dies, or the engine's error if it refused the request."""
        while not self._items:
            if self._error is not None:
                raise self._error
            if not self._unfinished:
                return []
            self._event.clear()
            await self._event.wait()
        items = list(self._items)
        self._items.clear()
        return items

    def __aiter__(self) -> AsyncIterator[RequestDelta]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestDelta]:
        while batch := await self.next_batch():
            for d in batch:
                yield d

    def abort(self) -> None:
        """Stop the request's unfinished samples; the engine frees their KV blocks."""
        if self._unfinished and self._error is None:
            self.aborted = True
            records = self._end_records("abort")
            ids = [rec.request_id for rec in records]
            self._unfinished.clear()
            self.owner.forget(self)
            self.owner.abort(ids)
            self.owner.record(records)
        self._event.set()

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc) -> None:
        self.abort()
