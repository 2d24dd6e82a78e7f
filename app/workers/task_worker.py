"""Run short blocking jobs (Hub searches, library scans, deletions) off the GUI thread, one at a time, and
hand the result to a callback on the GUI thread."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, Signal, Slot

from app.workers import stop_thread, thread_for

log = logging.getLogger(__name__)


class _Worker(QObject):
    done = Signal(int, object)
    failed = Signal(int, str)

    @Slot(int, object)
    def run(self, token: int, fn: Callable[[], Any]) -> None:
        try:
            result = fn()
        except Exception as e:
            log.debug("task failed", exc_info=True)
            self.failed.emit(token, str(e) or type(e).__name__)
            return
        self.done.emit(token, result)


class TaskRunner(QObject):
    """``runner.submit(fn, on_done, on_error)``: ``fn()`` runs on the runner's thread; the callbacks run on
    the GUI thread."""

    _submit = Signal(int, object)

    def __init__(self, name: str = "tasks", parent: QObject | None = None):
        super().__init__(parent)
        self._worker = _Worker()
        self._thread = thread_for(self._worker, name)
        self._submit.connect(self._worker.run)
        self._worker.done.connect(self._on_done)
        self._worker.failed.connect(self._on_failed)
        self._callbacks: dict[int, tuple[Callable | None, Callable | None]] = {}
        self._ids = itertools.count(1)
        self._thread.start()

    def submit(self, fn: Callable[[], Any], on_done: Callable[[Any], None] | None = None,
               on_error: Callable[[str], None] | None = None) -> int:
        token = next(self._ids)
        self._callbacks[token] = (on_done, on_error)
        self._submit.emit(token, fn)
        return token

    @property
    def busy(self) -> bool:
        return bool(self._callbacks)

    @Slot(int, object)
    def _on_done(self, token: int, result: Any) -> None:
        on_done, _ = self._callbacks.pop(token, (None, None))
        if on_done is not None:
            on_done(result)

    @Slot(int, str)
    def _on_failed(self, token: int, message: str) -> None:
        _, on_error = self._callbacks.pop(token, (None, None))
        if on_error is not None:
            on_error(message)
        else:
            log.warning("background task failed: %s", message)

    def stop(self) -> None:
        stop_thread(self._thread, 30000)
