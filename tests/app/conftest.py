"""Fixtures for the desktop app's tests (pytest-qt, offscreen): a private data folder and HF cache per test,
main windows on a stand-in engine core (fast) or on the real embedded model, and a fake Hub.

    def test_x(make_window, qtbot):
        window = make_window(fake=True)          # FakeCore engine (tests/server/fake_engine.py), loaded
        window = make_window(autoload=False)     # no model
"""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

from tests.app.helpers import FAKE_CORE, LOAD_TIMEOUT_MS, build_window


@pytest.fixture(autouse=True)
def settled_wait_until(qtbot, monkeypatch):
    """qtbot.waitUntil, then deliver the queued signals already posted. Workers change state on their own threads
    and then post one queued call per connected slot: a condition seen true (the engine's state, one panel's
    field) can come before the other slots of the same change have run; those are in the queue by then."""
    from PySide6.QtCore import QCoreApplication

    wait = qtbot.waitUntil

    def wait_until(*args, **kwargs):
        wait(*args, **kwargs)
        for _ in range(3):
            QCoreApplication.processEvents()

    monkeypatch.setattr(qtbot, "waitUntil", wait_until)


@pytest.fixture
def app_env(tmp_path, monkeypatch):
    """A fresh data folder (conversations, settings) and an empty HF cache."""
    monkeypatch.setenv("KESTREL_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    return tmp_path


@pytest.fixture
def make_window(app_env, qtbot):
    windows = []

    def make(fake: bool = True, autoload: bool = True, engine_settings: dict | None = None):
        w = build_window(FAKE_CORE if fake else None, engine_settings)
        qtbot.addWidget(w)
        windows.append(w)
        w.show()
        w.start(autoload=autoload)
        if autoload:
            qtbot.waitUntil(lambda: w.ctx.engine.state in ("ready", "failed"), timeout=LOAD_TIMEOUT_MS)
            assert w.ctx.engine.state == "ready", w.panels["load"].message.text()
            # the worker sets its state before the GUI thread runs the queued `loaded` slots (the chat applies the
            # model's sampling settings there): wait for them, or a setting changed now could be overwritten
            qtbot.waitUntil(lambda: w.panels["load"].message.text().startswith("Loaded "), timeout=LOAD_TIMEOUT_MS)
        return w

    yield make
    for w in windows:
        w.shutdown()
