"""Issue 47: an engine process that stops answering (SIGSTOP) is noticed by the client's watchdog in the app too
(the app's EngineWorker uses the same EngineClient and supervisor): the Load panel and the status bar say, in
words, that it stopped answering and is being restarted, and the app serves again afterwards. On the gated
stand-in core (tests/app/gated_core.py)."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from tests.app.gated_core import GATE_ENV
from tests.app.helpers import LOAD_TIMEOUT_MS, build_window

GATED_CORE = "tests.app.gated_core:GatedCore"


@pytest.fixture
def window(app_env, qtbot, monkeypatch):
    gate = app_env / "gate"
    gate.touch()
    monkeypatch.setenv(GATE_ENV, str(gate))
    w = build_window(GATED_CORE)
    qtbot.addWidget(w)
    w.show()
    w.start(autoload=True)
    qtbot.waitUntil(lambda: w.ctx.engine.state in ("ready", "failed"), timeout=LOAD_TIMEOUT_MS)
    assert w.ctx.engine.state == "ready", w.panels["load"].message.text()
    yield w
    w.shutdown()


def test_a_stopped_engine_is_reported_in_words_and_restarted(window, qtbot):
    w = window
    engine, load = w.ctx.engine, w.panels["load"]
    pid = engine.info.engine_pid
    os.kill(pid, signal.SIGSTOP)
    try:
        qtbot.waitUntil(lambda: load.message.text().startswith("Restarting engine… (attempt 1 of 3): "),
                        timeout=60_000)
        text = load.message.text()
        assert "The engine process stopped answering (no heartbeat for" in text, text
        assert "stopped answering" in w.engine_label.toolTip()
        qtbot.waitUntil(lambda: engine.state == "ready", timeout=LOAD_TIMEOUT_MS)
        assert engine.info.engine_pid != pid
        qtbot.waitUntil(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
                        timeout=30_000)
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
