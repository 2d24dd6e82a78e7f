"""Open each panel of the app in a real X11 window and save a screenshot of it to docs/screenshots/.

    python scripts/screenshots.py            # starts Xvfb itself when there is no DISPLAY
    xvfb-run -s "-screen 0 1400x900x24" python scripts/screenshots.py

It loads the embedded model (float32), chats, serves a few requests through the endpoint, and, for the
Models panel's Hub view, searches a local stand-in Hub (tests/app/fake_hub.py) since this needs no network.
Everything lives in a temporary data folder and HF cache: your own conversations and models are not shown.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def start_xvfb() -> subprocess.Popen | None:
    if os.environ.get("DISPLAY"):
        return None
    xvfb = shutil.which("Xvfb")
    if xvfb is None:
        sys.exit("No DISPLAY and no Xvfb: apt-get install xvfb (see /work/shared/ENVIRONMENT.md)")
    display = ":97"
    proc = subprocess.Popen([xvfb, display, "-screen", "0", "1400x900x24", "-nolisten", "tcp"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    os.environ["DISPLAY"] = display
    return proc


def tiny_repo(folder: Path) -> Path:
    """A small Llama-shaped repo (config, tokenizer stand-in, random safetensors) for the stand-in Hub."""
    import numpy as np
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
           "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
           "vocab_size": 128256, "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.9}))
    (folder / "tokenizer.json").write_text("{}")
    rng = np.random.default_rng(0)
    save_file({"model.embed_tokens.weight": rng.standard_normal((512, 256), dtype=np.float32)},
              str(folder / "model.safetensors"))
    return folder


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    xvfb = start_xvfb()
    tmp = Path(tempfile.mkdtemp(prefix="kestrel-shots-"))
    os.environ["KESTREL_DATA_DIR"] = str(tmp / "data")
    os.environ["HF_HUB_CACHE"] = str(tmp / "hf-cache")
    os.environ.pop("QT_QPA_PLATFORM", None)
    from tests.app.fake_hub import FakeHub

    repo = "example-org/Llama-3.2-1B-Instruct-lookalike"
    hub = FakeHub({repo: tiny_repo(tmp / "repo")},
                  {repo: {"safetensors": {"parameters": {"BF16": 1_235_814_400}, "total": 1_235_814_400}}})
    os.environ["HF_ENDPOINT"] = hub.url
    try:
        return shoot(out)
    finally:
        hub.close()
        if xvfb is not None:
            xvfb.terminate()
        shutil.rmtree(tmp, ignore_errors=True)


def shoot(out: Path) -> int:
    from app.qt_check import check_xcb

    problem = check_xcb()
    if problem:
        print(problem, file=sys.stderr)
        return 1
    from PySide6.QtCore import QEventLoop
    from PySide6.QtWidgets import QApplication

    from app import paths
    from app.library import EMBEDDED_KEY
    from app.main import create_app, create_window
    from app.store import Store

    app = create_app()
    store = Store(paths.db_path())
    store.update_model_settings(EMBEDDED_KEY, engine={"dtype": "float32"})
    window = create_window(store=store)
    window.resize(1360, 860)
    window.show()
    window.start(autoload=True)

    def pump(seconds: float = 0.3) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            app.processEvents(QEventLoop.AllEvents, 30)

    def wait(cond, timeout: float = 300) -> None:
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end:
                raise TimeoutError("the app did not get there in time")
            pump(0.1)

    def save(name: str) -> None:
        pump(0.8)
        screen = QApplication.primaryScreen()
        pix = screen.grabWindow(window.winId())
        path = out / f"{name}.png"
        pix.save(str(path))
        print(path)

    try:
        wait(lambda: window.ctx.engine.state in ("ready", "failed"))
        if window.ctx.engine.state != "ready":
            print(window.panels["load"].message.text(), file=sys.stderr)
            return 1
        chat = window.chat
        chat.new_conversation()
        chat.system_prompt.setPlainText("You are a concise assistant for Python programmers.")
        form = chat.sampling
        form.temperature.setValue(0.0)
        form.max_tokens.setValue(160)
        for question in ("How do I reverse a list in Python? Show a short code example.",):
            chat.send(question)
            wait(lambda: chat.pending is None)
        form.max_tokens.setValue(60)
        chat.send("And how do I sort it in reverse order?")
        wait(lambda: chat.pending is None)
        window.show_panel("chat")
        save("chat")

        import openai

        server = window.panels["server"]
        window.show_panel("server")
        server.port.setValue(0)
        server.generate_key.click()
        server.start_button.click()
        wait(lambda: server.url is not None, 60)
        client = openai.OpenAI(base_url=server.url_field.text(), api_key=server.api_key.text(), max_retries=0)
        name = window.ctx.engine.info.name
        client.models.list()
        for prompt in ("Say hello.", "Name three colors.", "What is 2 + 2?"):
            stream = client.chat.completions.create(model=name, messages=[{"role": "user", "content": prompt}],
                                                    max_tokens=24, temperature=0, stream=True)
            for _ in stream:
                pump(0.0)
        wait(lambda: len(server.log_rows()) >= 4, 60)
        save("server")

        window.show_panel("performance")
        pump(2.5)
        save("performance")

        window.show_panel("load")
        save("load")

        window.show_panel("hardware")
        pump(1.5)
        save("hardware")

        models = window.panels["models"]
        window.show_panel("models")
        models.tabs.setCurrentIndex(1)
        models.hub_tab.query.setText("Llama")
        models.hub_tab.search()
        wait(lambda: models.hub_tab.results_table.rowCount() > 0, 60)
        models.hub_tab.results_table.selectRow(0)
        wait(lambda: models.hub_tab.details is not None and models.hub_tab.fit_table.rowCount() > 0, 60)
        save("models-hub")
        job = models.hub_tab.download_selected_variant()
        wait(lambda: "verified" in models.downloads_tab.state_text(job.id), 120)
        os.link(window.ctx.library.entries[0].facts.path, paths.models_dir() / "SmolLM2-135M-Instruct.Q4_1.gguf")
        window.ctx.library.refresh()
        wait(lambda: len(window.ctx.library.entries) >= 3, 60)
        models.tabs.setCurrentIndex(0)
        models.library_tab.select_key(EMBEDDED_KEY)
        save("models")
        return 0
    finally:
        window.shutdown()
        window.close()


if __name__ == "__main__":
    sys.exit(main())
