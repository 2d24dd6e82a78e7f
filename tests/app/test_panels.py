"""Server, Performance and Hardware panels on a stand-in engine: the endpoint's settings and snippets, LAN
warning and port errors; plots fed by the engine, pause / clear / export; the hardware view without a GPU."""

from __future__ import annotations

import csv
import socket

import pytest

from tests.app.helpers import REPLY_TIMEOUT_MS, click_when_enabled, set_sampling


def test_server_settings_snippets_and_lan_warning(make_window, qtbot):
    import openai

    w = make_window()
    panel = w.panels["server"]
    w.show_panel("server")
    assert not panel.lan.isChecked()  # LAN access is off by default
    assert panel.lan_warning.isHidden()
    panel.lan.setChecked(True)
    assert not panel.lan_warning.isHidden() and "network" in panel.lan_warning.text()
    assert panel.api_key.text().startswith("sk-kestrel-")  # turning LAN on without a key makes one
    panel.lan.setChecked(False)
    panel.api_key.clear()
    panel.cors.setText("http://localhost:3000")
    panel.port.setValue(0)
    click_when_enabled(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: panel.url is not None and "Endpoint: http://127.0.0.1:" in w.server_label.text(),
                    timeout=30_000)
    assert "this machine only" in panel.status.text()
    assert panel.start_button.text() == "Stop server" and not panel.port.isEnabled()
    base = panel.url_field.text()
    assert f"curl -s {base}/chat/completions" in panel.curl.toPlainText()
    assert "Authorization" not in panel.curl.toPlainText()
    assert f'base_url="{base}"' in panel.python.toPlainText()
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
    stream = client.chat.completions.create(model=w.ctx.engine.info.name, stream=True, max_tokens=5,
                                            messages=[{"role": "user", "content": "hi"}])
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "abcde"
    qtbot.waitUntil(lambda: any(r[2] == "/v1/chat/completions" for r in panel.log_rows()), timeout=30_000)
    row = next(r for r in panel.log_rows() if r[2] == "/v1/chat/completions")
    assert row[3] == "200" and row[4] == "5" and row[5].endswith(("ms", "s"))
    # the preference is kept (not the LAN opt-in)
    assert w.ctx.store.pref("server.options")["cors"] == "http://localhost:3000"
    click_when_enabled(qtbot, panel.start_button)
    # the panel and the status bar each get the queued `stopped` signal: wait for both
    qtbot.waitUntil(lambda: panel.url is None and w.server_label.text() == "Endpoint: off", timeout=30_000)


def test_server_port_in_use_is_explained(make_window, qtbot):
    w = make_window()
    panel = w.panels["server"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        panel.port.setValue(s.getsockname()[1])
        click_when_enabled(qtbot, panel.start_button)
        qtbot.waitUntil(lambda: panel.status.objectName() == "errorBox", timeout=30_000)
    assert "Port" in panel.status.text() and "another port" in panel.status.text()
    assert panel.start_button.isEnabled() and panel.url is None


def test_server_stops_when_the_model_is_unloaded(make_window, qtbot):
    w = make_window()
    panel = w.panels["server"]
    panel.port.setValue(0)
    click_when_enabled(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: panel.url is not None, timeout=30_000)
    w.panels["load"].unload()
    qtbot.waitUntil(lambda: panel.url is None and w.ctx.engine.state == "empty"
                    and w.server_label.text() == "Endpoint: off", timeout=30_000)
    assert not panel.start_button.isEnabled()
    assert "Load a model first" in panel.status.text()


def test_performance_plots_pause_clear_and_export(make_window, qtbot, tmp_path):
    w = make_window()
    perf = w.panels["performance"]
    set_sampling(w, max_tokens=8)
    for text in ("one", "two"):
        assert w.chat.send(text)
        qtbot.waitUntil(lambda: w.chat.pending is None, timeout=REPLY_TIMEOUT_MS)
    qtbot.waitUntil(lambda: len(perf.ttft.x) == 2 and len(perf.gen_tps.x) >= 2, timeout=30_000)
    assert len(perf.ttft_points.getData()[0]) == 2 and len(perf.ttft_median.getData()[0]) == 2
    assert len(perf.tpot_points.getData()[0]) == 2
    if w.ctx.num_gpus == 0:
        assert "No NVIDIA GPU" in perf.net_note.toPlainText()  # says why there is no PCIe line

    perf.pause_button.click()
    n = len(perf.tps_curve.getData()[0])
    qtbot.wait(1500)
    assert len(perf.tps_curve.getData()[0]) == n  # paused: the view holds still
    assert len(perf.gen_tps.x) > n  # while the data keeps coming
    perf.pause_button.click()
    assert len(perf.tps_curve.getData()[0]) > n

    png, table = tmp_path / "perf.png", tmp_path / "perf.csv"
    perf.export_png(png)
    perf.export_csv(table)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.reader(table.open()))
    assert rows[0] == ["series", "x", "y"]
    assert {r[0] for r in rows[1:]} >= {"ttft_ms", "tpot_ms", "generation_tokens_per_s", "running", "kv_cache_percent"}
    perf.clear()
    assert len(perf.ttft.x) == 0 and len(perf.gen_tps.x) == 0
    assert perf.ttft_points.getData()[0] is None or len(perf.ttft_points.getData()[0]) == 0


def test_hardware_panel_without_gpu(make_window, qtbot):
    w = make_window(autoload=False)
    hw = w.panels["hardware"]
    qtbot.waitUntil(lambda: bool(hw.cpu.text()) and hw.cpu.text() != "…", timeout=30_000)
    snap = w.ctx.hardware_snapshot
    assert snap.ram_total > 0 and "GiB" in hw.ram.format()
    if not snap.gpus:
        assert not hw.gpu_message.isHidden() and "No NVIDIA GPU" in hw.gpu_message.text()
        assert hw.gpu_table.isHidden() and hw.peer_table.isHidden()


def _two_h200() -> object:
    """What app.hardware measured on a 2 x H200 machine (NVLink, NV18)."""
    from app.hardware import GPUInfo, HardwareSnapshot

    gpus = [GPUInfo(index=i, name="NVIDIA H200", memory_used=644939776, memory_total=150754820096, utilization=3,
                    temperature=41, pcie_gen=5, pcie_width=16, pcie_gen_max=5, pcie_width_max=16,
                    pcie_tx=1.58e6 * (i + 1), pcie_rx=6.2e5, bus_id=f"00000000:00:0{6 + i}.0") for i in range(2)]
    return HardwareSnapshot(cpu_name="Intel(R) Xeon(R) Processor", cores_physical=32, cores_logical=32,
                            cpu_percent=2.6, ram_used=655294464, ram_total=270334464000, gpus=gpus,
                            peer_matrix=[["X", "P2P · NV18"], ["P2P · NV18", "X"]], driver="580.159.04")


def test_gpu_views_with_two_gpus(make_window, qtbot):
    w = make_window(autoload=False)
    w.ctx.hardware.stop()  # no more real (GPU-less) samples: feed the measured ones
    qtbot.waitUntil(lambda: w.panels["load"].model_combo.count() > 0, timeout=30_000)
    w.ctx.hardware.sampled.emit(_two_h200())
    hw, load, perf = w.panels["hardware"], w.panels["load"], w.panels["performance"]
    assert hw.gpu_message.isHidden() and hw.gpu_table.rowCount() == 2
    row = [hw.gpu_table.item(0, c).text() for c in range(hw.gpu_table.columnCount())]
    assert row[1] == "NVIDIA H200" and row[2] == "0.6 GiB / 140.4 GiB" and row[3] == "3%"
    assert row[5] == "Gen5 x16 / Gen5 x16" and row[6] == "2 / 1 MB/s"
    assert hw.peer_table.item(0, 1).text() == "P2P · NV18" and hw.peer_table.item(1, 1).text() == "X"
    assert hw.driver.text() == "580.159.04"

    main = load.form.main
    assert main.is_choice_enabled("device", "cuda")
    assert main.is_field_enabled("gpu_memory_utilization") and not main.is_field_enabled("kv_cache_memory_gib")
    # two GPUs, but the embedded SmolLM2-135M's 9 attention heads do not split in two: TP stays 1 (with the reason)
    assert not main.is_field_enabled("tensor_parallel_size")
    assert main.disabled_reason("tensor_parallel_size") == ("this model (9 attention heads, 3 KV heads) does not "
                                                            "split over 2 GPUs")
    # TP 1 on one of the two: the fit on one GPU, against the share of its memory the engine may use
    assert load.estimate.text().startswith("Fits on one 140\xa0GiB GPU with an 8k context")
    assert "the engine may use (90%)" in load.estimate.text()

    assert {"GPU0 TX", "GPU0 RX", "GPU1 TX", "GPU1 RX"} <= set(perf.pcie)
    perf.redraw()
    _, tx = perf.pcie_curves["GPU1 TX"].getData()
    assert tx[-1] == pytest.approx(3.16)  # MB/s
    assert perf.net_note.toPlainText() == ""


@pytest.fixture
def two_repo_hub(tiny_model_dir, app_env, monkeypatch):
    import huggingface_hub.constants

    from tests.app.fake_hub import FakeHub

    fake = FakeHub({"kestrel-test/tiny-smollm2": tiny_model_dir("smollm2"),
                    "kestrel-test/tiny-qwen2": tiny_model_dir("qwen2")})
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(app_env / "hf-cache"))
    yield fake
    fake.close()


def test_hub_shows_the_model_of_the_second_search_and_its_cache_state(two_repo_hub, make_window, qtbot):
    from PySide6.QtCore import Qt

    w = make_window(autoload=False)
    models = w.panels["models"]
    hub = models.hub_tab
    w.show_panel("models")
    models.tabs.setCurrentIndex(1)

    def search_and_pick(query: str, repo: str) -> None:
        hub.query.setText(query)
        qtbot.mouseClick(hub.search_button, Qt.LeftButton)
        qtbot.waitUntil(lambda: hub.search_button.isEnabled() and hub.results_table.rowCount() == 1
                        and hub.results_table.item(0, 0).data(Qt.UserRole) == repo, timeout=30_000)
        assert models.status.text() == "1 model found."  # not "1 models"
        assert hub.details is None and not hub.download_button.isEnabled()  # the last repo's details are gone
        rect = hub.results_table.visualItemRect(hub.results_table.item(0, 0))
        qtbot.mouseClick(hub.results_table.viewport(), Qt.LeftButton, pos=rect.center())
        qtbot.waitUntil(lambda: hub.details is not None and hub.details.repo_id == repo, timeout=30_000)

    search_and_pick("smollm2", "kestrel-test/tiny-smollm2")
    assert "tiny-smollm2" in hub.repo_title.text() and hub.variants_table.rowCount() == 1
    search_and_pick("qwen2", "kestrel-test/tiny-qwen2")
    assert "tiny-qwen2" in hub.repo_title.text() and "tiny-smollm2" not in hub.repo_title.text()
    assert hub.selected_variant() is hub.details.variants[0] and hub.download_button.isEnabled()
    assert hub.files_table.rowCount() == len(hub.details.variants[0].files)
    assert hub.variants_table.item(0, 3).text() == "no"
    done = []
    w.ctx.downloads.finished.connect(lambda job_id, _folder: done.append(job_id))
    job = hub.download_selected_variant()
    assert job.repo_id == "kestrel-test/tiny-qwen2"
    qtbot.waitUntil(lambda: bool(done), timeout=60_000)
    qtbot.waitUntil(lambda: hub.variants_table.item(0, 3).text() == "yes", timeout=10_000)


def test_load_panel_message_does_not_outlive_an_unload(make_window, qtbot):
    w = make_window()
    load = w.panels["load"]
    assert load.message.text().startswith("Loaded ")
    load.unload()
    qtbot.waitUntil(lambda: w.ctx.engine.state == "empty" and load.message.text() == "No model is loaded.",
                    timeout=30_000)
    assert load.message.objectName() == "hint" and not load.unload_button.isEnabled()
