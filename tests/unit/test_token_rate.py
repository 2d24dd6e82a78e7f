"""Tokens/s figures (issue 14 item 2): counted over a sliding window from the tokens each engine step produced,
with a fake clock. A stream that starts after an idle spell reads its true rate at once, parallel streams add up,
an idle engine reads 0 within the window; /metrics exposes token counters for Prometheus' rate()."""

from __future__ import annotations

import pytest

from engine.metrics import RATE_WINDOW_S, TokenRate
from tests.support.fake_clock import Clock, engine_server_on_fake_clock


def test_known_tokens_over_known_time():
    clock = Clock()
    r = TokenRate(window=5.0, clock=clock)
    assert r.rate() == 0.0
    for _ in range(100):  # 21 tokens/s: one token every 1/21 s
        start = clock()
        clock.advance(1 / 21)
        r.add(1, clock(), start)
    assert r.rate() == pytest.approx(21.0, rel=0.02)
    assert r.total == 100


def test_fresh_stream_after_idle_reads_its_own_rate():
    clock = Clock()
    r = TokenRate(window=5.0, clock=clock)
    for _ in range(20):  # an earlier burst ...
        start = clock()
        clock.advance(0.1)
        r.add(1, clock(), start)
    clock.advance(60.0)  # ... then a minute idle
    assert r.rate() == 0.0
    start = clock()
    clock.advance(1 / 21)  # the first token of a new stream at 21 tokens/s
    r.add(1, clock(), start)
    assert r.rate() == pytest.approx(21.0, rel=0.01)  # not 1 token over the minute (the old 1.2 tokens/s)
    for _ in range(20):  # one second in
        start = clock()
        clock.advance(1 / 21)
        r.add(1, clock(), start)
    assert r.rate() == pytest.approx(21.0, rel=0.02)


def test_a_long_prefill_does_not_hide_the_decode_rate():
    """The first token comes after a 2 s prefill; the stream then decodes 20 tokens/s: that is the figure from
    its second token on, not 1 + 20 t tokens over 2 + t seconds."""
    clock = Clock()
    r = TokenRate(window=5.0, clock=clock)
    start = clock()
    clock.advance(2.0)
    r.add(1, clock(), start)
    assert r.rate() == pytest.approx(0.5)  # the first token alone: one token in its 2 s step
    for _ in range(10):
        start = clock()
        clock.advance(0.05)
        r.add(1, clock(), start)
    assert r.rate() == pytest.approx(20.0, rel=0.01)


def test_idle_decays_to_zero_within_the_window():
    clock = Clock()
    r = TokenRate(window=5.0, clock=clock)
    for _ in range(50):  # 10 s at 20 tokens/s
        start = clock()
        clock.advance(0.05)
        r.add(1, clock(), start)
    assert r.rate() == pytest.approx(20.0, rel=0.02)
    clock.advance(2.5)  # half a window after the last token: half the tokens are still in it
    assert r.rate() == pytest.approx(10.0, rel=0.05)
    clock.advance(2.5)
    assert r.rate() == 0.0
    clock.advance(600.0)
    assert r.rate() == 0.0


def test_parallel_streams_add_up():
    """Four streams at 52 tokens/s each, decoded in the same steps: 208 tokens/s."""
    clock = Clock()
    r = TokenRate(window=5.0, clock=clock)
    clock.advance(100.0)
    for _ in range(200):
        start = clock()
        clock.advance(1 / 52)
        r.add(4, clock(), start)
    assert r.rate() == pytest.approx(208.0, rel=0.01)


# -- the engine loop's figures (what the GUI's Performance panel and /metrics show) ---------------------------

@pytest.fixture
def server():
    with engine_server_on_fake_clock(1 / 52) as srv:
        yield srv


def _rates(srv) -> tuple[float, float]:
    return srv._current_rates()


def _run(srv) -> None:
    while srv.core.has_unfinished():
        srv.step()


def test_engine_rates_after_idle_and_parallel(server):
    core, clock = server.core, server.clock
    assert _rates(server) == (0.0, 0.0)
    core.add("warm-up", 30)
    _run(server)
    clock.advance(120.0)  # two minutes idle
    assert _rates(server) == (0.0, 0.0)
    core.add("solo", 500)
    for _ in range(10):  # 0.2 s into a fresh stream at 52 tokens/s
        server.step()
    assert _rates(server)[1] == pytest.approx(52.0, rel=0.01)
    _run(server)
    clock.advance(RATE_WINDOW_S)
    assert _rates(server) == (0.0, 0.0)  # idle reads 0 after one window, not minutes later
    for i in range(4):  # four parallel streams, one token each per step of 1/52 s: 208 tokens/s
        core.add(f"p{i}", 400)
    for _ in range(300):
        server.step()
    assert _rates(server)[1] == pytest.approx(208.0, rel=0.01)
    # the prompt tokens of the step that took them: 40 in the first step of the window (long gone) -> 0 now
    assert _rates(server)[0] == 0.0


def test_engine_rate_mid_step_snapshot(server):
    """A stats call between steps of a fresh stream: tokens over the time of the steps that made them."""
    core, clock = server.core, server.clock
    core.add("a", 3)
    server.step()
    clock.advance(1 / 52)  # the stats call comes in half-way to the next step's end
    assert _rates(server)[1] == pytest.approx(26.0, rel=0.01)


# -- Prometheus -------------------------------------------------------------------------------------------------

def test_prometheus_counters_and_gauge():
    pytest.importorskip("prometheus_client")
    from engine.wire import EngineStats
    from engine.metrics import PrometheusMetrics

    m = PrometheusMetrics("tiny")
    m.update(EngineStats(prompt_tokens_total=100, generation_tokens_total=2080, generation_tokens_per_s=208.0,
                         prompt_tokens_per_s=10.0))
    m.update(EngineStats(prompt_tokens_total=150, generation_tokens_total=3120, generation_tokens_per_s=0.0))
    text = m.render()[0].decode()
    values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert values["kestrel_generation_tokens_total"] == 3120  # counters: Prometheus derives rates from them
    assert values["kestrel_prompt_tokens_total"] == 150
    assert values["kestrel_generation_tokens_per_second"] == 0.0  # the gauge follows the engine's window
    assert "# TYPE kestrel_generation_tokens counter" in text or "# TYPE kestrel_generation_tokens_total counter" in text
