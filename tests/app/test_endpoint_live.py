"""On the real embedded model (SmolLM2, CPU): the local endpoint across a model load, driven with the official
openai client (issue 45 row 6), and the engine worker's account of its own restarts (row 13): the attempt it is
at ("Restarting engine... (attempt 1 of N)") and, when it gives up, why (the signal that killed the engine)."""

from __future__ import annotations

import dataclasses
import os
import signal

import httpx
import pytest

from tests.app.helpers import LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, click_when_enabled

pytestmark = pytest.mark.slow


def test_openai_client_keeps_working_across_a_model_load(make_window, qtbot):
    import openai

    w = make_window(fake=False, engine_settings={"dtype": "float32"})
    panel = w.panels["server"]
    panel.port.setValue(0)
    click_when_enabled(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: panel.url is not None or "could not" in panel.status.text(), timeout=30_000)
    assert panel.url, panel.status.text()
    base = panel.url_field.text()
    name = w.ctx.engine.info.name
    assert panel.status.text().startswith(f"Serving {name} at {base} ")
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=REPLY_TIMEOUT_MS / 1000)
    info = httpx.get(base + "/server_info", timeout=30).json()
    assert info["dtype"] == "float32"
    out = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Say hi."}],
                                         max_tokens=4, temperature=0)
    assert out.usage.completion_tokens >= 1

    # "another model": the same file loaded again in another dtype, the way the Load panel loads one
    config = dataclasses.replace(w.ctx.engine.config, dtype="bfloat16")
    w.ctx.load_model(w.ctx.model_key, config)
    qtbot.waitUntil(lambda: w.ctx.engine.state == "loading", timeout=30_000)
    qtbot.waitUntil(lambda: w.ctx.engine.state == "ready" and any("Model changed to" in r[1] for r in panel.log_rows()),
                    timeout=LOAD_TIMEOUT_MS)
    assert panel.url_field.text() == base and panel.status.text().startswith(f"Serving {name} at {base} ")
    event = next(r[1] for r in panel.log_rows() if "Model changed to" in r[1])
    assert name in event and "the same model, loaded again with other settings" in event

    # the same client, the same base URL: the new model answers
    assert [m.id for m in client.models.list().data] == [name]
    assert httpx.get(base + "/server_info", timeout=30).json()["dtype"] == "bfloat16"
    stream = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Say hi."}],
                                            max_tokens=4, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    click_when_enabled(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: panel.url is None, timeout=30_000)


@pytest.fixture
def worker(qtbot):
    from engine.frontend.client import RestartPolicy

    from app.workers.engine_worker import EngineWorker

    # one restart allowed (after 0.1 s): the first kill is survived, the second is not
    w = EngineWorker(restart_policy=RestartPolicy(delay_s=0.1, max_restarts=1))
    w.start()
    yield w
    w.shutdown()


def test_worker_counts_restart_attempts_and_says_why_it_gave_up(worker, qtbot):
    from engine.config import EngineConfig

    from app.workers.engine_worker import DEAD, READY, restart_text

    attempts: list[tuple[int, int, str]] = []
    gave_up: list[str] = []
    died: list[str] = []
    worker.restartAttempt.connect(lambda a, m, why: attempts.append((a, m, why)))
    worker.engineGaveUp.connect(gave_up.append)
    worker.engineDied.connect(died.append)
    worker.load(EngineConfig(dtype="float32"))
    qtbot.waitUntil(lambda: worker.state in (READY, "failed"), timeout=LOAD_TIMEOUT_MS)
    assert worker.state == READY

    first = worker.info.engine_pid
    os.kill(first, signal.SIGKILL)
    qtbot.waitUntil(lambda: bool(attempts), timeout=30_000)
    assert attempts[0][:2] == (1, 1) and "SIGKILL" in attempts[0][2]
    assert restart_text(*attempts[0][:2]) == "Restarting engine… (attempt 1 of 1)"
    qtbot.waitUntil(lambda: worker.state == READY and worker.info.engine_pid != first, timeout=LOAD_TIMEOUT_MS)
    assert worker.restart_attempt is None and not gave_up

    os.kill(worker.info.engine_pid, signal.SIGKILL)  # the limit is reached: no restart follows
    qtbot.waitUntil(lambda: bool(gave_up), timeout=30_000)
    assert worker.state == DEAD and len(attempts) == 1 and worker.restart_attempt is None
    reason = gave_up[0]
    assert "SIGKILL" in reason and "restarted 1 times" in reason, reason
    assert worker.dead_reason == reason and died[-1] == reason  # the Load panel's engineDied hears it too
    qtbot.wait(300)  # the stats poll also sees the death: it must not say it twice
    assert len(gave_up) == 1
