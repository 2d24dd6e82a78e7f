"""Worker objects, each on a thread of its own: the engine (and the HTTP server on the engine's event loop),
downloads, Hub/library tasks, the hardware probe. Results reach widgets only as queued signals.

Connect worker signals to bound methods of GUI-thread QObjects (never to a lambda or a plain function):
PySide runs a callable without a receiver object on the emitting thread, i.e. the worker's.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QThread


def thread_for(obj: QObject, name: str) -> QThread:
    """A started QThread that ``obj`` now lives on."""
    thread = QThread()
    thread.setObjectName(name)
    obj.moveToThread(thread)
    return thread


def stop_thread(thread: QThread, timeout_ms: int = 10000) -> None:
    if thread.isRunning():
        thread.quit()
        thread.wait(timeout_ms)
