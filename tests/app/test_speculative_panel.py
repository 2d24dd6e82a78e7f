"""Speculative decoding in the app (issue 49), on the real engine and the embedded SmolLM2: the Load panel's option
(an advanced field with its one-line explanation) reaches the engine process, an invalid value is explained in
place without starting an engine, and after a chat reply the Performance panel shows the acceptance and the tokens
per verify pass that the engine counted."""

from __future__ import annotations

import json
import re

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLineEdit

from app.library import EMBEDDED_KEY
from tests.app.helpers import LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, set_sampling

NGRAM = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1})
SHOWN = re.compile(r"speculative \(ngram k=4 lookup 1\.\.3\): (\d+)% accepted, ([\d.]+) tokens per step")
FRUIT = ("Repeat this list exactly, one item per line: apple, banana, cherry, date, elderberry, fig, grape, "
         "honeydew, kiwi, lemon, mango.")


def _type(qtbot, editor: QLineEdit, text: str) -> None:
    editor.selectAll()
    qtbot.keyClick(editor, Qt.Key_Delete)
    qtbot.keyClicks(editor, text)


def test_load_panel_option_reaches_the_engine_and_performance_shows_acceptance(make_window, qtbot):
    w = make_window(fake=False, autoload=False)
    load, perf = w.panels["load"], w.panels["performance"]
    qtbot.waitUntil(lambda: load.model_combo.findData(EMBEDDED_KEY) >= 0, timeout=30_000)
    load.select_key(EMBEDDED_KEY)
    w.show_panel("load")
    qtbot.mouseClick(load.advanced_toggle, Qt.LeftButton)
    editor = load.form.advanced.editors["speculative_config"]
    assert isinstance(editor, QLineEdit) and editor.isVisible()
    assert "guesses the next tokens" in editor.placeholderText()  # the one-line explanation
    assert load.form.values()["speculative_config"] is None  # off by default

    _type(qtbot, editor, '{"method": "ngram"}')  # no num_speculative_tokens: refused before any engine starts
    qtbot.mouseClick(load.load_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: bool(load.error_text()), timeout=LOAD_TIMEOUT_MS)
    assert "num_speculative_tokens must be an integer" in load.error_text(), load.error_text()
    assert w.ctx.engine.state == "failed" and load.load_button.isEnabled()

    _type(qtbot, editor, NGRAM)
    assert load.config().speculative_config == NGRAM
    qtbot.mouseClick(load.load_button, Qt.LeftButton)
    # the state stays "failed" (with the refused config's error) until the engine thread takes this load, later
    # on a busy machine: wait for this load's outcome, not for the last one's
    qtbot.waitUntil(lambda: w.ctx.engine.state == "ready" or (
        w.ctx.engine.state == "failed" and "num_speculative_tokens must be" not in load.error_text()),
        timeout=LOAD_TIMEOUT_MS)
    assert w.ctx.engine.state == "ready", load.error_text()
    assert w.ctx.store.model_settings(EMBEDDED_KEY)["engine"]["speculative_config"] == NGRAM  # kept for next time
    # the engine process reports the proposer it runs: the summary names it (0 proposals so far)
    qtbot.waitUntil(lambda: SHOWN.search(perf.summary.text()) is not None, timeout=30_000)
    assert SHOWN.search(perf.summary.text()).groups() == ("0", "0.00")

    set_sampling(w, max_tokens=32, temperature=0.0)
    assert w.chat.send(FRUIT)
    qtbot.waitUntil(lambda: w.chat.pending is None, timeout=REPLY_TIMEOUT_MS)
    reply = w.ctx.store.messages(w.chat.conversation.id)[-1]
    assert reply.role == "assistant" and "banana" in reply.content, reply.content

    def shown() -> tuple[int, float]:
        m = SHOWN.search(perf.summary.text())
        return (int(m.group(1)), float(m.group(2))) if m else (0, 0.0)

    qtbot.waitUntil(lambda: shown()[0] > 0, timeout=30_000)  # the next stats sample after the reply
    accepted_pct, per_step = shown()
    assert 0 < accepted_pct <= 100 and 1.0 < per_step <= 5.0, perf.summary.text()
