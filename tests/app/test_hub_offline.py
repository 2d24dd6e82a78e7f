"""The Hub tab without a network: the error comes at once (one short probe, not huggingface_hub's five
retries), offline mode is honoured without touching the network, and the banner does not follow to the
other tabs."""

from __future__ import annotations

import socket
import time

import pytest


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: a connect is refused
    return port


@pytest.fixture
def no_network(app_env, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def _search(qtbot, models) -> float:
    from PySide6.QtCore import Qt

    hub = models.hub_tab
    hub.query.setText("qwen")
    start = time.monotonic()
    qtbot.mouseClick(hub.search_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: hub.search_button.isEnabled() and models.status.objectName() == "errorBox",
                    timeout=10_000)
    return time.monotonic() - start


def test_search_fails_fast_without_a_network_and_the_banner_stays_on_its_tab(no_network, make_window, qtbot):
    from app.panels.models import DOWNLOADS, HUB, LIBRARY

    w = make_window(autoload=False)
    models = w.panels["models"]
    w.show_panel("models")
    models.tabs.setCurrentIndex(HUB)
    elapsed = _search(qtbot, models)
    assert elapsed < 3.0, elapsed
    assert "the Hub is not reachable" in models.status.text() and models.status.isVisible()
    models.tabs.setCurrentIndex(LIBRARY)
    assert not models.status.isVisible() and models.status.text() == ""
    models.tabs.setCurrentIndex(DOWNLOADS)
    assert not models.status.isVisible()
    models.tabs.setCurrentIndex(HUB)  # the error was cleared on leaving; a new search brings it back
    assert not models.status.isVisible()
    assert _search(qtbot, models) < 3.0


def test_offline_mode_answers_at_once_without_a_connection(app_env, monkeypatch):
    import huggingface_hub.constants

    from app import hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: pytest.fail("probed the network"))
    start = time.monotonic()
    with pytest.raises(hub.HubError, match="offline mode is on"):
        hub.search_models("qwen")
    with pytest.raises(hub.HubError, match="offline mode is on"):
        hub.repo_details("Qwen/Qwen2.5-0.5B-Instruct")
    assert time.monotonic() - start < 1.0


def test_probe_gives_up_after_its_timeout_when_nothing_answers(no_network, monkeypatch):
    from app import hub

    def hang(*_a, **_k):  # a name lookup or connect that never returns
        time.sleep(30)

    monkeypatch.setattr(socket, "create_connection", hang)
    start = time.monotonic()
    with pytest.raises(hub.HubError, match="not reachable"):
        hub.probe("search the Hub", timeout=0.5)
    assert time.monotonic() - start < 1.5


def test_an_error_from_a_tab_not_shown_waits_for_that_tab(make_window, qtbot):
    from app.panels.models import HUB, LIBRARY

    w = make_window(autoload=False)
    models = w.panels["models"]
    w.show_panel("models")
    models.tabs.setCurrentIndex(LIBRARY)
    models.hub_tab.status("Cannot search the Hub: boom", error=True)
    assert not models.status.isVisible() and "boom" not in models.status.text()
    models.tabs.setCurrentIndex(HUB)
    assert "boom" in models.status.text()
    models.tabs.setCurrentIndex(LIBRARY)
    assert models.status.text() == ""
