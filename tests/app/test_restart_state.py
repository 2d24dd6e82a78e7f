"""Issue 45 row 13: one state while the engine restarts by itself. The status bar says "Restarting engine…
(attempt 1 of 3)" and offers no Reload (there is nothing to press yet), the Load panel shows the attempt and why,
not "Press Load"; once the worker gives up, Reload is back and the reason is in the status bar and the Load
panel. On the gated stand-in core (tests/app/gated_core.py): its load waits for a gate file, so a restart can be
held on screen."""

from __future__ import annotations

import os
import signal

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
    yield w, gate
    w.shutdown()


def test_no_reload_while_the_engine_restarts_and_the_reason_when_it_gives_up(window, qtbot):
    from engine.frontend.client import RestartPolicy

    w, gate = window
    engine, load = w.ctx.engine, w.panels["load"]
    gate.unlink()  # the restarted engine waits at its load: the attempt stays on screen
    os.kill(engine.info.engine_pid, signal.SIGKILL)
    qtbot.waitUntil(lambda: load.message.text().startswith("Restarting engine… (attempt 1 of 3): "), timeout=30_000)
    assert engine.state == "dead" and engine.restart_attempt == (1, 3)
    assert "SIGKILL" in load.message.text() and "Press Load" not in load.message.text()
    assert w.engine_label.text() == "Restarting engine… (attempt 1 of 3)"
    assert "SIGKILL" in w.engine_label.toolTip()
    assert not w.reload_button.isVisible()
    qtbot.wait(500)  # the stats poll and the other slots of the death have run: still nothing to press
    assert not w.reload_button.isVisible()

    gate.touch()
    qtbot.waitUntil(lambda: engine.state == "ready", timeout=LOAD_TIMEOUT_MS)
    qtbot.waitUntil(lambda: "runs again" in load.message.text(), timeout=30_000)
    assert load.message.objectName() == "okBox"
    assert w.engine_label.text().startswith("● ") and not w.reload_button.isVisible()

    # no restarts allowed now: the first death is the last, and Reload comes back with the reason
    engine.restart_policy = RestartPolicy(max_restarts=0)
    w._reload()
    qtbot.waitUntil(lambda: engine.state == "loading", timeout=30_000)
    qtbot.waitUntil(lambda: engine.state == "ready", timeout=LOAD_TIMEOUT_MS)
    os.kill(engine.info.engine_pid, signal.SIGKILL)
    qtbot.waitUntil(lambda: bool(engine.dead_reason), timeout=30_000)
    qtbot.waitUntil(lambda: w.reload_button.isVisible(), timeout=30_000)
    reason = engine.dead_reason
    assert "SIGKILL" in reason
    assert w.engine_label.text().startswith("The engine stopped: ") and "SIGKILL" in w.engine_label.text()
    assert w.engine_label.toolTip() == reason
    assert load.message.objectName() == "errorBox"
    assert load.message.text() == f"The engine stopped: {reason}\nPress Load to start it again."

    w._reload()  # the status bar's Reload brings it back
    qtbot.waitUntil(lambda: engine.state == "ready", timeout=LOAD_TIMEOUT_MS)
    assert not w.reload_button.isVisible() and w.engine_label.text().startswith("● ")


def test_the_status_line_keeps_a_long_reason_to_one_line():
    from app.window import stopped_text

    reason = "The engine process ended (exit code 1).\nIts last error: " + "x" * 300
    assert stopped_text(reason) == "The engine stopped: The engine process ended (exit code 1)."
    reason = "The engine process exited unexpectedly (killed by signal SIGKILL). Reload the model to continue."
    assert stopped_text(reason) == ("The engine stopped: The engine process exited unexpectedly (killed by signal "
                                    "SIGKILL).")  # its first sentence
    long = stopped_text("y" * 300)
    assert long.endswith("…") and len(long) == len("The engine stopped: ") + 90


def test_the_load_panels_message_keeps_its_height_across_messages(make_window, qtbot):
    """Each message box takes its text's height: a restart's attempts, the restart and the give-up one after the
    other did not add 20 px each (heightForWidth never returns less than the minimum height set last time)."""
    w = make_window(autoload=False)
    w.show_panel("load")
    load = w.panels["load"]
    why = "The engine process exited unexpectedly (killed by signal SIGKILL). Reload the model to continue."
    load._on_restart_attempt(1, 3, why)
    first = load.message.minimumHeight()
    for attempt in (2, 3):
        load._on_restart_attempt(attempt, 3, why)
    assert load.message.minimumHeight() == first
    load._on_gave_up(why)
    assert load.message.minimumHeight() <= first + 20  # one more line at most
