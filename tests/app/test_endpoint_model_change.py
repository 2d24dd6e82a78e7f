"""The local endpoint follows the loaded model (issue 45 row 6): loading another model keeps the endpoint at its
address, answers 503 (retry) while the new model loads, then serves the new one, and the Server panel says so
(its status and a line in its log). A load that fails, and the model before with it, leaves nothing to serve: the
endpoint stops, saying why (a load that fails alone brings the model before back: test_failed_load_keeps_model).
Also the setting "Start the local endpoint with the app", honoured once the model is loaded at start-up."""

from __future__ import annotations

import dataclasses

import httpx
import pytest

from tests.app.gated_core import GATE_ENV
from tests.app.helpers import LOAD_TIMEOUT_MS, build_window, click_when_enabled

GATED_CORE = "tests.app.gated_core:GatedCore"


@pytest.fixture
def gated_window(app_env, qtbot, monkeypatch):
    """A window on the gated stand-in core (its loads wait for the gate file), the first model loaded."""
    gate = app_env / "gate"
    gate.touch()
    monkeypatch.setenv(GATE_ENV, str(gate))
    windows = []

    def make():
        w = build_window(GATED_CORE)
        qtbot.addWidget(w)
        windows.append(w)
        w.show()
        w.start(autoload=True)
        qtbot.waitUntil(lambda: w.ctx.engine.state in ("ready", "failed"), timeout=LOAD_TIMEOUT_MS)
        assert w.ctx.engine.state == "ready", w.panels["load"].message.text()
        return w

    yield make, gate
    for w in windows:
        w.shutdown()


def _start_endpoint(qtbot, panel) -> str:
    panel.port.setValue(0)
    click_when_enabled(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: panel.url is not None or "could not" in panel.status.text(), timeout=30_000)
    assert panel.url, panel.status.text()
    return panel.url_field.text()


def _load_other(w, model: str, **changes) -> None:
    config = dataclasses.replace(w.ctx.engine.config, model=model, **changes)
    w.ctx.load_model(model, config)


def test_endpoint_answers_503_while_another_model_loads_then_serves_it(gated_window, qtbot):
    make, gate = gated_window
    w = make()
    panel = w.panels["server"]
    base = _start_endpoint(qtbot, panel)
    first = w.ctx.engine.info.name
    assert panel.status.text().startswith(f"Serving {first} at {base}")
    with httpx.Client(timeout=30) as http:
        assert [m["id"] for m in http.get(base + "/models").json()["data"]] == [first]

        gate.unlink()  # the next load waits in the engine process until the test lets it go on
        _load_other(w, "/models/Other-Model-7B.gguf")
        qtbot.waitUntil(lambda: panel.status.text().startswith("Loading Other-Model-7B.gguf"), timeout=30_000)
        assert panel.url_field.text() == base and panel.start_button.text() == "Stop server"
        r = http.get(base + "/models")
        assert r.status_code == 503 and r.headers["retry-after"] == "2"
        assert "loading a model" in r.json()["error"]["message"]
        health = http.get(base.removesuffix("/v1") + "/health")
        assert health.status_code == 503 and health.json()["status"] == "loading"

        gate.touch()
        qtbot.waitUntil(lambda: panel.status.text().startswith("Serving Other-Model-7B at"), timeout=LOAD_TIMEOUT_MS)
        assert panel.url_field.text() == base  # the same address
        assert [m["id"] for m in http.get(base + "/models").json()["data"]] == ["Other-Model-7B"]
        body = {"model": "Other-Model-7B", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
        r = http.post(base + "/chat/completions", json=body)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "abc"
        body["model"] = first  # the old name is not served any more, and the log says why
        assert http.post(base + "/chat/completions", json=body).status_code == 404
    qtbot.waitUntil(lambda: any(r[3] == "404" for r in panel.log_rows()), timeout=30_000)
    rows = panel.log_rows()
    assert any("Model changed to Other-Model-7B" in r[1] for r in rows), rows
    assert any(r[3] == "503" and "loading a model" in r[6] for r in rows), rows
    not_found = next(r for r in rows if r[3] == "404")
    assert f"`{first}` does not exist" in not_found[6] and "Other-Model-7B" in not_found[6]
    assert "Endpoint: " + base in w.server_label.text()  # the status bar heard `started` again
    assert w.panels["benchmark"].local_model == "Other-Model-7B"  # and so did the Benchmark panel


def test_endpoint_stops_and_says_why_when_the_new_model_fails_to_load(gated_window, qtbot, monkeypatch):
    make, _gate = gated_window
    w = make()
    panel = w.panels["server"]
    base = _start_endpoint(qtbot, panel)
    # read by each engine process as it loads: the new model fails, and so does the model before, loaded again
    monkeypatch.setenv("KESTREL_FAKE", "load_error")
    _load_other(w, "/models/broken.gguf")
    qtbot.waitUntil(lambda: panel.url is None, timeout=LOAD_TIMEOUT_MS)
    qtbot.waitUntil(lambda: "Load a model first" in panel.status.text(), timeout=30_000)
    assert panel.status.text().startswith("Stopped: the model could not be loaded, so there is no model to serve.")
    assert panel.start_button.text() == "Start server" and not panel.start_button.isEnabled()
    with pytest.raises(httpx.ConnectError):
        httpx.get(base + "/models", timeout=10)


def test_endpoint_starts_with_the_app_when_asked(app_env, qtbot):
    from app import paths
    from app.store import Store

    store = Store(paths.db_path())
    store.set_pref("server.options", {"port": 0, "autostart": True})
    w = build_window("tests.server.fake_engine:FakeCore")
    qtbot.addWidget(w)
    try:
        panel = w.panels["server"]
        assert panel.autostart.isChecked()
        w.show()
        w.start(autoload=True)
        qtbot.waitUntil(lambda: panel.url is not None, timeout=LOAD_TIMEOUT_MS)
        assert panel.status.text().startswith(f"Serving {w.ctx.engine.info.name} at http://127.0.0.1:")
        assert httpx.get(panel.url_field.text() + "/models", timeout=30).status_code == 200
        panel.autostart.setChecked(False)  # kept at once, like the panel's other settings
        assert w.ctx.store.pref("server.options")["autostart"] is False
    finally:
        w.shutdown()


def test_endpoint_does_not_start_with_the_app_by_default(make_window, qtbot):
    w = make_window()
    panel = w.panels["server"]
    assert not panel.autostart.isChecked()
    qtbot.waitUntil(lambda: panel.start_button.isEnabled(), timeout=30_000)
    assert panel.url is None and panel.start_button.text() == "Start server"


def test_server_panel_says_which_restart_attempt_the_engine_is_at(gated_window, qtbot):
    import os
    import signal

    make, gate = gated_window
    w = make()
    panel = w.panels["server"]
    base = _start_endpoint(qtbot, panel)
    gate.unlink()  # the restarted engine waits at its load: the attempt stays on screen until the test goes on
    os.kill(w.ctx.engine.info.engine_pid, signal.SIGKILL)
    qtbot.waitUntil(lambda: panel.status.text().startswith("Restarting engine… (attempt 1 of 3): "), timeout=30_000)
    assert "SIGKILL" in panel.status.text() and f"stays at {base}" in panel.status.text()
    assert w.ctx.engine.restart_attempt == (1, 3)
    gate.touch()
    qtbot.waitUntil(lambda: "runs again" in panel.status.text(), timeout=LOAD_TIMEOUT_MS)
    assert panel.status.text().startswith(f"Serving {w.ctx.engine.info.name} at {base}")
    assert w.ctx.engine.restart_attempt is None
