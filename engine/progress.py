"""Start-up progress from deep inside loading (CUDA-graph capture, ...) to whoever listens. The engine process
listens and forwards each report to its client as wire.Progress (the GUI shows it in the Load panel's status); with
no listener a report goes to the log only."""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

_listener: Callable[[str, str], None] | None = None


def set_listener(listener: Callable[[str, str], None] | None) -> None:
    global _listener
    _listener = listener


def report(stage: str, detail: str) -> None:
    """stage: one word ("loading", "capturing"); detail: what, in plain words."""
    log.debug("%s: %s", stage, detail)
    if _listener is not None:
        try:
            _listener(stage, detail)
        except Exception:  # a listener that fails must not fail the load
            log.debug("progress listener failed", exc_info=True)
