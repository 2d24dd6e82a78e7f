"""Drive the Kestrel app the way a user does, from an install made as the README makes it (installer/setup.sh,
no test extra): run with THAT virtualenv's python by tests/install/test_readme_install.py. It imports only
what the install provides (no pytest, no pytest-qt, no openai client: urllib for HTTP) and builds the real
main window as app/main.py does, on the embedded SmolLM2 model and the real engine process.

    python drive_app.py first  --shots DIR --work DIR   # every scenario; ends by closing the window mid-reply
    python drive_app.py reopen --shots DIR --work DIR   # the same data folder again: what the user finds

Each scenario prints one line ``KESTREL-OBS {"scenario": ..., ...}`` of what it saw (an "error" key when it
could not go on: the next scenario still runs); the test asserts on them. Screenshots of each scene at
1024x700 and 1600x1000, light and dark, go to --shots. The caller sets QT_QPA_PLATFORM=offscreen,
KESTREL_DATA_DIR and private HOME / XDG folders."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path

def _load_qt_checks():
    """tests/support/qt_checks.py by its path (shared with the app tests; pytest-free): the checkout's tests/ is not
    on this python's path, and putting the checkout there would shadow the installed app."""
    path = Path(__file__).resolve().parents[1] / "support" / "qt_checks.py"
    spec = importlib.util.spec_from_file_location("kestrel_qt_checks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


qt_checks = _load_qt_checks()
layout_problems, coloured_pixels = qt_checks.layout_problems, qt_checks.coloured_pixels

OBS_PREFIX = "KESTREL-OBS "
SIZES = ((1024, 700), (1600, 1000))
LONG_PROMPT = ("Write a long story, at least ten paragraphs, about a kestrel that learns to fly over the "
               "sea. Give every paragraph several sentences.")
SHOTS: Path
WORK: Path


def emit(scenario: str, obs: dict) -> None:
    print(OBS_PREFIX + json.dumps({"scenario": scenario, **obs}, default=str), flush=True)


class Scenario:
    """``with Scenario("name") as obs: obs["x"] = ...``: prints the observations at the end, with the error
    (and its traceback) when the scenario could not finish; the driver goes on with the next one."""

    def __init__(self, name: str):
        self.name = name
        self.obs: dict = {}

    def __enter__(self) -> dict:
        self.t0 = time.monotonic()
        print(f"--- {self.name}", flush=True)
        return self.obs

    def __exit__(self, et, ev, tb) -> bool:
        if ev is not None:
            self.obs["error"] = "".join(traceback.format_exception(et, ev, tb))[-6000:]
        self.obs["seconds"] = round(time.monotonic() - self.t0, 1)
        emit(self.name, self.obs)
        return True


# ---- waiting without pytest-qt -----------------------------------------------------------------------------

def pump(ms: int = 0) -> None:
    """Run Qt's events for ``ms`` milliseconds (at least one pass)."""
    from PySide6.QtCore import QEventLoop
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    end = time.monotonic() + ms / 1000
    while True:
        app.processEvents(QEventLoop.AllEvents, 20)
        if time.monotonic() >= end:
            break
        time.sleep(0.005)


def wait_until(cond, timeout: float, what: str) -> None:
    """Process Qt events until ``cond()`` is true; TimeoutError saying ``what`` after ``timeout`` seconds.
    Then the signals already queued are delivered (a worker posts one queued call per connected slot)."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError(f"not within {timeout:.0f} s: {what}")
        pump(20)
    pump(0)
    pump(0)


def in_thread(fn, timeout: float = 180.0, what: str = "a request"):
    """``fn()`` on a thread of its own while the GUI thread keeps processing events (a blocking HTTP call here
    would hold up the queued signals the server's work posts to the window); its result, or its exception."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001  (handed back to the caller)
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    wait_until(lambda: not t.is_alive(), timeout, what)
    if "error" in box:
        raise box["error"]
    return box["value"]


# ---- HTTP with the standard library ------------------------------------------------------------------------

def http(method: str, url: str, body: dict | None = None, timeout: float = 120.0) -> tuple[int, object]:
    """(status, JSON body or text); a connection that fails gives (0, the error's words)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    except (urllib.error.URLError, OSError) as e:
        return 0, f"{type(e).__name__}: {e}"
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")[:500]


def chat_completion(base: str, model: str, text: str, max_tokens: int = 8) -> tuple[int, object]:
    return http("POST", base + "/chat/completions",
                {"model": model, "max_tokens": max_tokens, "temperature": 0,
                 "messages": [{"role": "user", "content": text}]})


# ---- the window --------------------------------------------------------------------------------------------

def build_window():
    """As app/main.py: the QApplication (Fusion, the theme), the main window with its workers, shown, then
    start() (library scan, the last model or the embedded one loaded)."""
    from app.main import create_app, create_window
    from app.qt_check import check_display, check_pyside, check_xcb

    problem = check_pyside() or check_display() or check_xcb()
    if problem:
        raise RuntimeError(f"the app says it cannot open a window: {problem}")
    create_app()
    w = create_window()
    resize(w, (1600, 1000))
    w.show()
    w.start(autoload=True)
    return w


def resize(w, size: tuple[int, int]) -> None:
    qt_checks.resize_window(w, size, pump)


def wait_loaded(w, timeout: float = 300.0) -> None:
    wait_until(lambda: w.ctx.engine.state in ("ready", "failed"), timeout, "the model loaded (or failed)")
    if w.ctx.engine.state != "ready":
        raise RuntimeError("the model did not load: " + w.panels["load"].message.text())
    wait_until(lambda: w.panels["load"].message.text().startswith("Loaded "), 60, "the Load panel's 'Loaded'")


def set_theme(w, key: str) -> None:
    """The sidebar's Theme setting, as a user picks it (the combo; folded away below 1200 px, still there)."""
    combo = w.theme_choice
    combo.setCurrentIndex(combo.findData(key))
    pump(100)


def shoot(w, name: str, prepare=None) -> list[str]:
    """The window at 1024x700 and 1600x1000, light and dark theme: SHOTS/<name>-<W>x<H>-<theme>.png.
    ``prepare()`` runs after each resize (e.g. scroll to what the picture is about). The theme chosen before
    is put back."""
    from app import theme as themes

    before = w.theme.choice
    paths = []
    for theme in (themes.LIGHT, themes.DARK):
        set_theme(w, theme)
        for size in SIZES:
            resize(w, size)
            if prepare is not None:
                prepare()
            pump(250)
            path = SHOTS / f"{name}-{size[0]}x{size[1]}-{theme}.png"
            if not w.grab().save(str(path)):
                raise RuntimeError(f"could not save {path}")
            paths.append(str(path))
    set_theme(w, before)
    resize(w, (1600, 1000))
    return paths


# ---- the chat ----------------------------------------------------------------------------------------------

def set_sampling(w, **values) -> None:
    form = w.chat.sampling
    for name, value in values.items():
        getattr(form, name).setValue(value)


def type_and_send(w, text: str) -> None:
    """Type into the composer and press Send (what a user does) once the model is ready; the turn must go
    ahead."""
    chat = w.chat
    chat.composer.setPlainText(text)
    wait_until(lambda: w.ctx.engine.state == "ready" and chat.send_button.isEnabled(), 240,
               "a loaded model and Send enabled")
    chat.send_button.click()
    wait_until(lambda: chat.pending is not None, 30, "the reply started")
    wait_until(lambda: chat.pending is None or chat.conversation is not None, 60, "the conversation exists")


def streamed(w, chars: int) -> None:
    """Wait until the streaming reply has ``chars`` characters (an error saying how it ended, if it did)."""
    chat = w.chat
    wait_until(lambda: chat.pending is None or len(chat.pending.text) >= chars, 180,
               f"{chars} characters streamed")
    if chat.pending is None:
        last = w.ctx.store.messages(chat.conversation.id)[-1] if chat.conversation is not None else None
        raise RuntimeError(f"the reply ended before {chars} characters: "
                           f"{stored_obs(last) if last is not None else 'nothing stored'}")


def wait_reply(w, timeout: float = 300.0) -> None:
    wait_until(lambda: w.chat.pending is None, timeout, "the reply finished")


def card_obs(card) -> dict:
    return {"role": card.role, "text": card.text, "error_visible": not card.error_label.isHidden(),
            "error": card.error_label.text(), "stats": card.stats_label.text()}


def stored_obs(m) -> dict:
    return {"role": m.role, "content": m.content, "finish_reason": m.finish_reason, "error": m.error,
            "num_tokens": m.num_tokens}


def bottom_in_view(chat, card) -> bool:
    """The card's last pixel row is inside the message list's viewport (the end of the reply on screen)."""
    from PySide6.QtCore import QPoint

    viewport = chat.messages.viewport()
    bottom = card.mapTo(viewport, QPoint(0, card.height() - 1)).y()
    return card.isVisible() and 0 <= bottom < viewport.height()


def shown_text(card) -> str:
    """What the card's body labels hold now (their rich text), top to bottom."""
    from PySide6.QtWidgets import QLabel

    return " ".join(lbl.text() for lbl in card.body.findChildren(QLabel) if not lbl.isHidden())


def last_words(text: str, n: int = 3) -> str:
    words = re.findall(r"[A-Za-z]{3,}", text)
    return " ".join(words[-n:])


def plain(html_text: str) -> str:
    """A label's rich text as words (tags out, entities and white space as single spaces)."""
    from html import unescape

    return " ".join(re.findall(r"[A-Za-z]{3,}", unescape(re.sub(r"<[^>]+>", " ", html_text))))


# ---- the scenarios -----------------------------------------------------------------------------------------

def startup(w) -> None:
    with Scenario("startup") as obs:
        t0 = time.monotonic()
        wait_loaded(w)
        engine = w.ctx.engine
        obs.update(load_seconds=round(time.monotonic() - t0, 1), name=engine.info.name,
                   dtype=engine.info.dtype, device=engine.info.device,
                   quantization=engine.config.quantization, status_bar=w.engine_label.text(),
                   load_message=w.panels["load"].message.text(), engine_pid=engine.info.engine_pid,
                   python=sys.executable)
        # what only the test extra brings (transformers comes with xgrammar, of the server extra)
        obs["test_packages_importable"] = [m for m in ("pytest", "pytestqt", "openai", "schemathesis")
                                           if importlib.util.find_spec(m) is not None]


def long_reply(w) -> None:
    """A long reply from the real model, shown whole at both window sizes: every word-wrapped label as high as
    its text needs at its width, no gaps between cards, the stored text's end in the card and the card's end
    on screen (the list follows the newest reply)."""
    with Scenario("long_reply") as obs:
        chat = w.chat
        w.show_panel("chat")
        chat.new_conversation()
        set_sampling(w, max_tokens=320, temperature=0.7, seed=3)
        t0 = time.monotonic()
        type_and_send(w, LONG_PROMPT)
        wait_reply(w)
        obs["reply_seconds"] = round(time.monotonic() - t0, 1)
        msgs = w.ctx.store.messages(chat.conversation.id)
        reply = msgs[-1]
        obs["stored"] = stored_obs(reply)
        cards = chat.message_widgets()
        card = cards[-1]
        obs["shown_text_equals_stored"] = card.text == reply.content
        obs["tail_words"] = last_words(reply.content)
        obs["tail_in_labels"] = obs["tail_words"] in plain(shown_text(card))
        spacing = chat.messages.widget().layout().spacing()
        sizes = {}
        for size in (*SIZES, (1300, 800), (1024, 700)):
            resize(w, size)
            problems = []
            end = time.monotonic() + 5
            while True:  # the layout settles over a few event passes after a resize
                pump(50)
                problems = layout_problems(chat.message_widgets(), spacing)
                if not problems or time.monotonic() > end:
                    break
            chat.messages.verticalScrollBar().setValue(chat.messages.verticalScrollBar().maximum())
            pump(100)
            sizes[f"{size[0]}x{size[1]}"] = {
                "window": [w.width(), w.height()], "problems": problems,
                "card": [card.width(), card.height(), card.heightForWidth(card.width())],
                "end_in_view_after_scrolling_down": bottom_in_view(chat, card),
                "lines_of_text": card.body.height() // max(1, card.body.fontMetrics().lineSpacing())}
        obs["sizes"] = sizes

        def to_end() -> None:
            pump(50)
            bar = chat.messages.verticalScrollBar()
            bar.setValue(bar.maximum())

        obs["shots"] = shoot(w, "chat-long-reply", to_end)


def bad_file(w) -> None:
    """A file that is not a GGUF file (as the issue met it: 'no: bad magic'): Load off in the Load panel and
    in the Library, Load reached anyway refused with the reason, and the loaded model still answers."""
    with Scenario("bad_file") as obs:
        from app.library import EMBEDDED_KEY

        engine = w.ctx.engine
        load = w.panels["load"]
        before = {"name": engine.info.name, "pid": engine.info.engine_pid, "client": id(engine.client)}
        junk = WORK / "notes.gguf"
        junk.write_bytes(b"FRP3" + bytes(range(256)) * 64)
        w.show_panel("load")
        load.select_path(junk)
        pump(200)
        obs["load_panel"] = {"load_enabled": load.load_button.isEnabled(),
                             "tooltip": load.load_button.toolTip(), "warning": load.model_warning.text()}
        # Load reached another way (a shortcut, a stale button)
        obs["load_selected_returned"] = load.load_selected()
        pump(300)
        obs["after_refusal"] = {"message": load.message.text(), "state": engine.state,
                                "name": engine.info.name,
                                "same_engine_process": engine.info.engine_pid == before["pid"],
                                "same_client": id(engine.client) == before["client"]}
        obs["shots_load"] = shoot(w, "load-refused")

        # the Library tab: the same file added by "Add GGUF file…"
        other = WORK / "holiday.gguf"
        other.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 4096)
        lib = w.ctx.library
        w.show_panel("models")
        lib.add_file(str(other))
        wait_until(lambda: lib.scanned and any(e.model_ref == str(other) for e in lib.entries), 60,
                   "the library lists the added file")
        tab = w.panels["models"].library_tab
        tab.select_key(str(other))
        pump(200)
        row = tab.table.currentRow()
        cell = tab.table.item(row, tab.table.columnCount() - 1) if row >= 0 else None
        obs["library"] = {"load_enabled": tab.load_button.isEnabled(), "tooltip": tab.load_button.toolTip(),
                          "reason_cell": cell.text() if cell is not None else None,
                          "reason_note": tab.reason_note.text() if tab.reason_note.isVisible() else None}
        obs["shots_library"] = shoot(w, "library-refused", lambda: tab.select_key(str(other)))
        tab.select_key(EMBEDDED_KEY)

        # the model loaded before still answers in the chat
        w.show_panel("chat")
        w.chat.new_conversation()
        set_sampling(w, max_tokens=8, temperature=0.0)
        type_and_send(w, "Say hi")
        wait_reply(w)
        m = w.ctx.store.messages(w.chat.conversation.id)[-1]
        obs["reply_after"] = stored_obs(m)
        obs["model_after"] = engine.info.name
        obs["model_before"] = before["name"]
        load.select_key(EMBEDDED_KEY)


def start_endpoint(w) -> str:
    panel = w.panels["server"]
    w.show_panel("server")
    panel.port.setValue(0)  # any free port
    wait_until(panel.start_button.isEnabled, 30, "Start server enabled")
    panel.start_button.click()
    wait_until(lambda: panel.url is not None or "could not" in panel.status.text(), 60,
               "the endpoint started")
    if panel.url is None:
        raise RuntimeError("the endpoint did not start: " + panel.status.text())
    return panel.url_field.text()


def endpoint_before(w) -> str | None:
    with Scenario("endpoint_before") as obs:
        base = start_endpoint(w)
        obs["base"] = base
        obs["status_text"] = w.panels["server"].status.text()
        code, models = in_thread(lambda: http("GET", base + "/models"))
        obs["models"] = [code, [m["id"] for m in models["data"]] if code == 200 else models]
        name = obs["models"][1][0] if code == 200 else w.ctx.engine.info.name
        code, out = in_thread(lambda: chat_completion(base, name, "Say hi."))
        obs["chat"] = [code, out["choices"][0]["message"]["content"] if code == 200 else out]
        code, info = in_thread(lambda: http("GET", base + "/server_info"))
        obs["server_info"] = [code, server_info_obs(info) if code == 200 else info]
        return base
    return None


def server_info_obs(info: dict) -> dict:
    return {"model": info.get("model"), "dtype": info.get("dtype"), "quantization": info.get("quantization"),
            "load_quantization": (info.get("engine_config") or {}).get("quantization")}


def benchmark(w) -> None:
    """The Benchmark panel against the app's own endpoint (its default target once the Server panel runs): a
    small sweep from the form, Run pressed; the Live tab's plotted points, the pixels it drew, the results."""
    with Scenario("benchmark") as obs:
        from app import theme as themes

        panel = w.panels["benchmark"]
        w.show_panel("benchmark")
        wait_until(lambda: panel.local_url is not None, 30, "the Benchmark panel sees the local endpoint")
        obs["local_target_checked"] = panel.local_radio.isChecked()
        obs["default_preset"] = panel.preset.currentData()
        obs["estimate_before"] = panel.estimate_label.text()
        panel.local_radio.setChecked(True)
        panel.dataset.setCurrentIndex(panel.dataset.findData("random"))
        panel.input_len.setValue(32)
        panel.output_len.setValue(8)
        panel.num_prompts.setValue(4)
        panel.concurrencies.setText("1,2")
        panel.label.setText("install tier")
        wait_until(panel.run_button.isEnabled, 30, "Run enabled")
        panel.run_button.click()
        wait_until(lambda: not panel.worker.running and panel.run_button.isEnabled(), 300, "the run ended")
        pump(300)
        obs["message"] = panel.message.text()
        report = panel.report
        obs["report"] = None if report is None else {
            "points": len(report["points"]),
            "requests": sum(len(p["requests"]) for p in report["points"]),
            "completed": [p["metrics"]["completed"] for p in report["points"]],
            "failed": [p["metrics"]["failed"] for p in report["points"]],
            "setup_model": (report.get("setup") or {}).get("model")}
        live = panel.live
        panel.tabs.setCurrentWidget(panel.live_tab)
        pump(200)
        obs["live"] = {"plotted_points": live.plotted_points(), "scatter_count": live.scatter_count(),
                       "throughput_points": len(live.tps_curve.getData()[0] if live.tps_curve.getData()[0]
                                                is not None else []),
                       "coloured_pixels": coloured_pixels(live.view)}
        obs["results_curves"] = len(panel.charts.p_tput.listDataItems())
        obs["library_runs"] = panel.runs.count()
        obs["theme"] = themes.current().name
        obs["shots_live"] = shoot(w, "benchmark-live", lambda: panel.tabs.setCurrentWidget(panel.live_tab))
        obs["shots_results"] = shoot(w, "benchmark-results", lambda: panel.tabs.setCurrentIndex(1))


def bench_cli(w, base: str) -> None:
    """`kestrel bench serve` from the install's own command, against the app's endpoint."""
    with Scenario("bench_cli") as obs:
        kestrel = Path(sys.executable).with_name("kestrel")
        out = WORK / "cli-serve.json"
        argv = [str(kestrel), "bench", "serve", "--base-url", base.removesuffix("/v1"), "--num-prompts", "2",
                "--random-input-len", "16", "--random-output-len", "4", "--max-concurrency", "2",
                "--ignore-eos", "--num-warmups", "0", "--disable-tqdm", "--result-filename", str(out)]
        obs["argv"] = argv[1:]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_until(lambda: proc.poll() is not None, 240, "kestrel bench serve ended")
        text = proc.stdout.read()
        obs["rc"] = proc.returncode
        obs["output_tail"] = text[-1500:]
        if out.exists():
            rep = json.loads(out.read_text())
            pts = rep.get("points") or [rep]
            obs["completed"] = [(p.get("metrics") or p).get("completed") for p in pts]


def endpoint_across_load(w, base: str) -> None:
    """The model loaded again with other settings (Load panel: Data type float32) while the endpoint runs: the
    same address answers all along (503 while loading, never a refused connection), then serves the new load.
    """
    with Scenario("endpoint_across_load") as obs:
        from app.library import EMBEDDED_KEY

        engine = w.ctx.engine
        load, server = w.panels["load"], w.panels["server"]
        obs["dtype_before"] = engine.info.dtype
        seen: list = []
        stop = threading.Event()

        def poll() -> None:
            while not stop.is_set():
                code, body = http("GET", base + "/models", timeout=30)
                seen.append(code if code else f"0: {body}")
                time.sleep(0.2)

        poller = threading.Thread(target=poll, daemon=True)
        w.show_panel("load")
        load.select_key(EMBEDDED_KEY)
        load.form.set_value("dtype", "float32")
        pump(100)
        poller.start()
        old_pid = engine.info.engine_pid
        load.load_button.click()
        wait_until(lambda: engine.state == "loading" or (
            engine.state == "ready" and engine.info is not None and engine.info.engine_pid != old_pid),
                   60, "the load began")
        wait_loaded(w)
        wait_until(lambda: server.status.text().startswith("Serving "), 60, "the Server panel serves again")
        pump(500)
        stop.set()
        poller.join(30)
        obs["codes_seen_during_load"] = sorted({str(c) for c in seen})
        obs["polls"] = len(seen)
        obs["dtype_after"] = engine.info.dtype
        obs["base_after"] = server.url_field.text()
        obs["status_text"] = server.status.text()
        code, models = in_thread(lambda: http("GET", base + "/models"))
        obs["models"] = [code, [m["id"] for m in models["data"]] if code == 200 else models]
        name = obs["models"][1][0] if code == 200 else engine.info.name
        code, out = in_thread(lambda: chat_completion(base, name, "Say hi again."))
        obs["chat"] = [code, out["choices"][0]["message"]["content"] if code == 200 else out]
        code, info = in_thread(lambda: http("GET", base + "/server_info"))
        obs["server_info"] = [code, server_info_obs(info) if code == 200 else info]
        obs["log_events"] = [" | ".join(r) for r in server.log_rows() if "Model changed" in " ".join(r)]
        obs["shots"] = shoot(w, "server-after-load", lambda: w.show_panel("server"))


def kill_mid_reply(w, base: str | None) -> int | None:
    """The engine process killed (SIGKILL) while a reply streams: the partial reply stays in the view and the
    store, marked interrupted with the reason; the engine comes back by itself; the endpoint keeps its
    address."""
    with Scenario("kill_mid_reply") as obs:
        chat, engine = w.chat, w.ctx.engine
        w.show_panel("chat")
        chat.new_conversation()
        set_sampling(w, max_tokens=400, temperature=0.8, seed=1)
        type_and_send(w, LONG_PROMPT)
        streamed(w, 40)
        conv = chat.conversation.id
        obs["conversation"] = conv
        old = engine.info.engine_pid
        obs["streamed_before_kill"] = len(chat.pending.text)
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: chat.pending is None, 60, "the reply ended after the kill")
        pump(300)
        obs["shown"] = card_obs(chat.message_widgets()[-1])
        obs["stored"] = [stored_obs(m) for m in w.ctx.store.messages(conv)]
        obs["notice_after_kill"] = chat.notice.text()
        wait_until(lambda: engine.state == "ready" and engine.info is not None
                   and engine.info.engine_pid != old, 240, "the engine back")
        wait_until(lambda: "runs again" in chat.notice.text(), 30, "the chat says the engine runs again")
        obs["notice_after_restart"] = chat.notice.text()
        obs["new_pid"] = engine.info.engine_pid != old
        if base is not None:
            code, _ = in_thread(lambda: http("GET", base + "/models"))
            obs["endpoint_after_restart"] = code
        obs["shots"] = shoot(w, "chat-killed")
        return conv
    return None


def close_mid_reply(w) -> None:
    """The window closed while a reply streams (what a user does with the close button): afterwards the engine
    process is gone; the reopen phase reads what is left."""
    with Scenario("close_mid_reply") as obs:
        chat, engine = w.chat, w.ctx.engine
        chat.new_conversation()
        set_sampling(w, max_tokens=400, temperature=0.8, seed=2)
        type_and_send(w, LONG_PROMPT)
        streamed(w, 40)
        obs["conversation"] = chat.conversation.id
        obs["streamed_before_close"] = chat.pending.text
        pid = engine.info.engine_pid
        w.close()
        pump(200)

        def gone() -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            try:  # a zombie left to the parent counts as gone
                return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
            except OSError:
                return True

        wait_until(gone, 60, "the engine process ended after the window closed")
        obs["engine_process_ended"] = True


def reopen(w) -> None:
    """The app started again on the same data folder: the conversation closed mid-reply is the one shown, its
    partial reply there and marked interrupted; the one whose engine was killed too; the conversation goes on.
    """
    with Scenario("reopen") as obs:
        wait_loaded(w)
        chat, store = w.chat, w.ctx.store
        w.show_panel("chat")
        pump(300)
        convs = store.conversations() if hasattr(store, "conversations") else []
        obs["conversations"] = [(c.id, c.title) for c in convs]
        obs["open_conversation"] = chat.conversation.id if chat.conversation is not None else None
        obs["shown"] = [card_obs(c) for c in chat.message_widgets()]
        if chat.conversation is not None:
            obs["stored"] = [stored_obs(m) for m in store.messages(chat.conversation.id)]
        obs["shots_closed"] = shoot(w, "reopen-closed-reply")
        conv = obs["open_conversation"]
        # the conversation goes on: the next turn follows the interrupted reply (no two user turns in a row)
        if conv is not None:
            set_sampling(w, max_tokens=6, temperature=0.0)
            type_and_send(w, "Please go on.")
            wait_reply(w)
            obs["roles_after_next_turn"] = [m.role for m in store.messages(conv)]


def reopen_killed(w, conv: int) -> None:
    with Scenario("reopen_killed") as obs:
        chat, store = w.chat, w.ctx.store
        chat.open_conversation_force(conv)
        pump(300)
        obs["open_conversation"] = chat.conversation.id if chat.conversation is not None else None
        obs["shown"] = [card_obs(c) for c in chat.message_widgets()]
        obs["stored"] = [stored_obs(m) for m in store.messages(conv)]
        obs["shots"] = shoot(w, "reopen-killed-reply")


def main() -> int:
    global SHOTS, WORK
    p = argparse.ArgumentParser()
    p.add_argument("phase", choices=["first", "reopen"])
    p.add_argument("--shots", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--killed-conversation", type=int, default=None)
    args = p.parse_args()
    SHOTS, WORK = Path(args.shots), Path(args.work)
    SHOTS.mkdir(parents=True, exist_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    w = build_window()
    try:
        if args.phase == "first":
            startup(w)
            if w.ctx.engine.state != "ready":
                return 2
            long_reply(w)
            bad_file(w)
            base = endpoint_before(w)
            benchmark(w)
            if base is not None:
                bench_cli(w, base)
                endpoint_across_load(w, base)
            kill_mid_reply(w, base)
            close_mid_reply(w)  # last: it closes the window
        else:
            reopen(w)
            if args.killed_conversation is not None:
                reopen_killed(w, args.killed_conversation)
    finally:
        if not w.isHidden() or not getattr(w, "_closed", True):
            w.close()
        pump(100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
