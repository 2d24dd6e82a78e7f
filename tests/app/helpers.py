"""Helpers shared by the app tests."""

from __future__ import annotations

import time

FAKE_CORE = "tests.server.fake_engine:FakeCore"
LOAD_TIMEOUT_MS = 180_000
REPLY_TIMEOUT_MS = 180_000


def wait_until(cond, timeout: float = 180.0) -> None:
    """Process Qt events until ``cond()`` (for module-scoped fixtures, where qtbot is not available)."""
    from PySide6.QtCore import QEventLoop
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError("condition not met in time")
        app.processEvents(QEventLoop.AllEvents, 50)
        time.sleep(0.01)


def set_sampling(window, **values) -> None:
    """Set the chat's sampling form (e.g. max_tokens=16, temperature=0)."""
    form = window.chat.sampling
    for name, value in values.items():
        widget = getattr(form, name)
        if name == "stop":
            widget.setText(", ".join(value))
        elif name == "seed" and value is None:
            widget.setValue(-1)
        else:
            widget.setValue(value)


def build_window(core_factory: str | None = None, engine_settings: dict | None = None):
    from app import paths
    from app.library import EMBEDDED_KEY
    from app.main import create_app, create_window
    from app.store import Store

    create_app()
    store = Store(paths.db_path())
    if engine_settings is not None:
        store.update_model_settings(EMBEDDED_KEY, engine=engine_settings)
    return create_window(store=store, core_factory=core_factory, hardware_interval_ms=500)


def click_when_enabled(qtbot, button, timeout_ms: int = 30_000) -> None:
    """Click a button once it is enabled: panels enable theirs on queued state signals (the Server panel's
    Start follows the engine's READY), which can arrive just after the state the test waited for."""
    from PySide6.QtCore import Qt

    qtbot.waitUntil(button.isEnabled, timeout=timeout_ms)
    qtbot.mouseClick(button, Qt.LeftButton)


def drop_a_stream_mid_reply(window, qtbot, chunks: int = 3):
    """Start the Server panel's endpoint, stream a chat completion through it and leave after ``chunks`` text
    chunks (the server then aborts the engine request: run the window with KESTREL_FAKE=slow). Returns the
    Server panel."""
    import httpx

    panel = window.panels["server"]
    panel.port.setValue(0)
    click_when_enabled(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: panel.url is not None, timeout=30_000)
    body = {"model": window.ctx.engine.info.name, "stream": True, "max_tokens": 100,
            "messages": [{"role": "user", "content": "hi"}]}
    seen = 0
    with httpx.stream("POST", panel.url_field.text() + "/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and '"content":"' in line.replace(" ", "") and '"content":""' not in line:
                seen += 1
            if seen >= chunks:
                break  # closes the connection
    return panel


def spy_requests(engine, with_params: bool = False) -> list:
    """Record each request the engine worker makes for a chat turn (on its loop, after the overflow policy's
    fit): its messages, or (messages, params) ``with_params``."""
    sent: list = []
    original = engine._generate

    async def spy(rid, messages, params, prompt_ids=None):
        sent.append((messages, params) if with_params else messages)
        return await original(rid, messages, params, prompt_ids)

    engine._generate = spy
    return sent
