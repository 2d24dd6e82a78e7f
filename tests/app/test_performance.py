"""The Performance panel (issue 14 items 2 and 5): the tokens/s figure against a known number of tokens over a known
time (the engine loop on a fake clock, its stats shown by the panel), parallel streams summed, 0 soon after the
engine goes idle; stopped and failed requests in the TTFT / TPOT plots."""

from __future__ import annotations

import re

import pytest
from PySide6.QtCore import Qt

from tests.app.helpers import REPLY_TIMEOUT_MS, click_when_enabled, drop_a_stream_mid_reply, set_sampling
from tests.support.fake_clock import engine_server_on_fake_clock


def _shown_rate(perf) -> float:
    return float(re.match(r"([\d.]+) tokens/s", perf.summary.text()).group(1))


@pytest.fixture
def engine_loop():
    """The engine loop around a stand-in core whose steps take 1/52 s on a fake clock (no sleeps)."""
    with engine_server_on_fake_clock(1 / 52) as srv:
        yield srv


def test_tokens_per_second_figure(make_window, qtbot, engine_loop):
    from engine import wire
    from engine.metrics import RATE_WINDOW_S

    w = make_window(autoload=False)
    perf = w.panels["performance"]
    srv, core, clock = engine_loop, engine_loop.core, engine_loop.clock

    def sample() -> float:
        perf.add_stats(wire.EngineStats(**{k: v for k, v in srv.call_stats().items()
                                          if k in wire.EngineStats.__struct_fields__}))
        return _shown_rate(perf)

    core.add("warm-up", 20)
    while core.has_unfinished():
        srv.step()
    clock.advance(90.0)  # idle for a minute and a half
    assert sample() == 0.0
    core.add("solo", 1000)  # one stream at 52 tokens/s (one token a step): right from its first second
    for _ in range(26):
        srv.step()
    assert sample() == pytest.approx(52.0, abs=0.1)
    for i in range(3):  # three more streams join: four in parallel, 208 tokens/s (the case)
        core.add(f"p{i}", 1000)
    for _ in range(int(52 * RATE_WINDOW_S) + 5):
        srv.step()
    # within one step's tokens over the window (the count's granularity: 4 tokens / 5 s)
    assert sample() == pytest.approx(208.0, abs=0.81)
    assert perf.gen_tps.y[-1] == pytest.approx(208.0, abs=0.81)  # the plot's point too
    core.left.clear()  # every stream ends; the engine sits idle
    clock.advance(RATE_WINDOW_S / 2)
    assert 0 < sample() < 208.0
    clock.advance(RATE_WINDOW_S / 2)
    assert sample() == 0.0  # a window after the last token, not minutes
    assert list(perf.gen_tps.y)[-1] == 0.0


def test_stopped_and_failed_requests_are_plotted(make_window, qtbot, monkeypatch):
    monkeypatch.setenv("KESTREL_FAKE", "slow")
    w = make_window()
    perf = w.panels["performance"]
    chat = w.chat
    set_sampling(w, max_tokens=400)
    assert chat.send("first")
    qtbot.waitUntil(lambda: chat.pending is not None and len(chat.pending.text) >= 3, timeout=REPLY_TIMEOUT_MS)
    qtbot.mouseClick(chat.stop_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: chat.pending is None, timeout=REPLY_TIMEOUT_MS)
    qtbot.waitUntil(lambda: len(perf.ttft.x) == 1, timeout=30_000)
    assert perf.num_requests == 1 and perf.num_stopped == 1
    assert len(perf.ttft_stopped_points.getData()[0]) == 1  # drawn as a cross
    assert len(perf.tpot.x) == 1 and perf.tpot.y[0] > 0  # >= 3 tokens: it has a TPOT too
    qtbot.waitUntil(lambda: "1 request (1 stopped or failed)" in perf.summary.text(), timeout=30_000)
    set_sampling(w, max_tokens=3)
    assert chat.send("second")
    qtbot.waitUntil(lambda: len(perf.ttft.x) == 2, timeout=REPLY_TIMEOUT_MS)
    assert perf.num_stopped == 1 and len(perf.ttft_stopped.x) == 1  # a finished one is no cross

    # a failure: counted; and an engine record of an aborted request (HTTP) is not counted twice
    perf.add_failure("gone", "The engine process exited")
    assert perf.num_requests == 3 and perf.num_stopped == 2

    class Rec:
        request_id, finish_reason, ttft, tpot = "http-1", "abort", 0.25, 0.05

    class Stats:
        finish_reason, ttft, tokens_per_s = "abort", 0.25, 20.0

    perf.add_record(Rec())
    perf.add_reply("http-1", Stats())
    perf.add_failure("http-1", "late")
    assert perf.num_requests == 4 and perf.ttft_stopped.y[-1] == 250.0 and perf.tpot_stopped.y[-1] == 50.0


def test_a_server_request_the_client_dropped_is_plotted(make_window, qtbot, monkeypatch):
    """Issue 14 item 5: an HTTP stream whose client goes away mid-stream is aborted by the server; the engine
    client's "abort" record puts it in the TTFT / TPOT plots, as a cross, once."""
    monkeypatch.setenv("KESTREL_FAKE", "slow")  # 50 ms a token: the client leaves mid-stream
    w = make_window()
    perf = w.panels["performance"]
    panel = drop_a_stream_mid_reply(w, qtbot)
    qtbot.waitUntil(lambda: perf.num_requests == 1, timeout=30_000)
    assert perf.num_stopped == 1 and "1 request (1 stopped or failed)" in perf.summary.text()
    assert len(perf.ttft.x) == 1 and len(perf.ttft_stopped.x) == 1 and perf.ttft_stopped.y[0] > 0
    assert len(perf.ttft_stopped_points.getData()[0]) == 1  # drawn as a cross
    assert len(perf.tpot_stopped.x) == 1 and perf.tpot_stopped.y[0] > 0  # >= 3 tokens: a TPOT too
    qtbot.wait(300)
    assert perf.num_requests == 1  # not counted twice
    click_when_enabled(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: panel.url is None, timeout=30_000)
