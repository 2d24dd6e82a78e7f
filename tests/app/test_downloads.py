"""Downloads from a fake Hub on 127.0.0.1 (reached through HF_ENDPOINT) serving a tiny model the way the Hub
does: progress, the Hugging Face cache layout (found by huggingface_hub and the engine), nothing fetched
twice, cancel and resume with a Range request, a corrupted byte caught by the hash check; and the same
through the Models panel (search, details, fit, download, library, delete)."""

from __future__ import annotations

import hashlib
import json
import shutil
import threading

import pytest
from PySide6.QtCore import Qt

from app.downloader import Cancelled, VerificationError, download_files
from app.hub import repo_details, search_models
from tests.app.fake_hub import FakeHub

REPO = "kestrel-test/tiny-smollm2"


@pytest.fixture
def hub(tiny_model_dir, app_env, monkeypatch):
    import huggingface_hub.constants

    fake = FakeHub({REPO: tiny_model_dir("smollm2")})
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # tests/conftest.py sets offline
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(app_env / "hf-cache"))  # read at import
    yield fake
    fake.close()


def _cache(app_env):
    return app_env / "hf-cache"


def _weights(details):
    variant = next(v for v in details.variants if v.label.startswith("safetensors"))
    return variant.files


def test_details_and_search(hub):
    d = repo_details(REPO)
    assert d.architecture == "LlamaForCausalLM" and d.supported and d.sha
    names = {f.path for f in _weights(d)}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= names
    weights = next(f for f in d.files if f.path == "model.safetensors")
    assert weights.sha256 and weights.size > 1_000_000
    assert d.shape.num_layers == 2 and d.context_length == 2048
    found = search_models("tiny", "safetensors")
    assert [m.repo_id for m in found] == [REPO] and found[0].formats == ["safetensors"]
    assert search_models("tiny", "gguf") == []


def test_download_with_progress_into_the_shared_cache(hub, app_env):
    d = repo_details(REPO)
    files = _weights(d)
    progress = []
    snapshot = download_files(REPO, files, _cache(app_env), revision="main", on_progress=progress.append)
    total = sum(f.size for f in files)
    assert progress[-1].done == progress[-1].total == total
    assert [p.done for p in progress] == sorted(p.done for p in progress)
    assert len(progress) > 2
    weights = snapshot / "model.safetensors"
    assert weights.is_symlink()
    blob = weights.resolve()
    assert blob.parent.name == "blobs" and blob.name == hashlib.sha256(blob.read_bytes()).hexdigest()
    assert (snapshot.parent.parent / "refs" / "main").read_text() == snapshot.name

    # other tools find it: huggingface_hub's cache lookup and the engine's model resolution
    from huggingface_hub import try_to_load_from_cache

    assert try_to_load_from_cache(REPO, "config.json", cache_dir=str(_cache(app_env))) == str(snapshot / "config.json")
    from engine.loader.resolve import resolve_model

    assert resolve_model(REPO) == snapshot

    # a second download fetches nothing
    before = len([r for r in hub.requests if r[0] == "GET" and "/cdn/" in r[1]])
    download_files(REPO, files, _cache(app_env), revision="main")
    assert len([r for r in hub.requests if r[0] == "GET" and "/cdn/" in r[1]]) == before


def test_cancel_then_resume_continues_with_a_range_request(hub, app_env):
    files = [f for f in _weights(repo_details(REPO)) if f.path == "model.safetensors"]
    size = files[0].size
    hub.rate = 4_000_000  # bytes/s
    cancel = threading.Event()

    def on_progress(p):
        if p.done > size // 3:
            cancel.set()

    with pytest.raises(Cancelled):
        download_files(REPO, files, _cache(app_env), cancel=cancel, on_progress=on_progress)
    partial = next((_cache(app_env)).rglob("*.incomplete"))
    have = partial.stat().st_size
    assert size // 3 < have < size
    assert not any(p for p in _cache(app_env).rglob("model.safetensors"))

    hub.rate = 0
    hub.requests.clear()
    resumed = []
    snapshot = download_files(REPO, files, _cache(app_env), on_progress=resumed.append)
    ranges = [r[2] for r in hub.requests if "/cdn/" in r[1] and r[0] == "GET"]
    assert ranges == [f"bytes={have}-"]
    assert resumed[1].done == have  # progress starts from what was there
    data = (snapshot / "model.safetensors").read_bytes()
    assert len(data) == size and hashlib.sha256(data).hexdigest() == files[0].sha256
    assert not list(_cache(app_env).rglob("*.incomplete"))


def test_a_corrupted_byte_is_detected(hub, app_env):
    files = _weights(repo_details(REPO))
    hub.corrupt = {"model.safetensors"}
    with pytest.raises(VerificationError, match="model.safetensors is corrupt: its sha256"):
        download_files(REPO, files, _cache(app_env))
    assert not list(_cache(app_env).rglob("*.incomplete"))  # nothing corrupt stays behind
    assert not list(_cache(app_env).rglob("model.safetensors"))
    hub.corrupt = {"config.json"}  # a small (non-LFS) file: checked by its git blob id
    with pytest.raises(VerificationError, match="config.json is corrupt: its git blob hash"):
        download_files(REPO, files, _cache(app_env))
    hub.corrupt = set()
    download_files(REPO, files, _cache(app_env))  # and a clean retry succeeds


def test_models_panel_search_download_load_and_delete(hub, make_window, qtbot, app_env):
    w = make_window(autoload=False)
    models = w.panels["models"]
    w.show_panel("models")
    models.tabs.setCurrentIndex(1)
    models.hub_tab.query.setText("tiny")
    qtbot.mouseClick(models.hub_tab.search_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: models.hub_tab.results_table.rowCount() == 1, timeout=30_000)
    models.hub_tab.results_table.selectRow(0)
    qtbot.waitUntil(lambda: models.hub_tab.details is not None and models.hub_tab.variants_table.rowCount() == 1, timeout=30_000)
    assert "Kestrel can run this model" in models.hub_tab.repo_support.text()
    assert models.hub_tab.files_table.rowCount() >= 4
    assert models.hub_tab.fit_table.rowCount() == 1 and models.hub_tab.fit_table.columnCount() >= 1
    # a tiny model fits in RAM (no GPU here) or on any GPU (once the hardware probe has answered)
    qtbot.waitUntil(lambda: models.hub_tab.fit_table.item(0, 0).text().endswith("✓"), timeout=30_000)

    hub.rate = 3_000_000
    seen = []
    w.ctx.downloads.progress.connect(lambda _id, p: seen.append(p.done))
    qtbot.mouseClick(models.hub_tab.download_button, Qt.LeftButton)
    assert models.tabs.currentIndex() == 2 and models.downloads_tab.table.rowCount() == 1
    job_id = next(iter(models.downloads_tab.rows))
    qtbot.waitUntil(lambda: bool(seen) and seen[-1] > 1_000_000, timeout=30_000)
    models.downloads_tab.cancel(job_id)
    qtbot.waitUntil(lambda: "Cancelled" in models.downloads_tab.state_text(job_id), timeout=30_000)
    resume = models.downloads_tab.table.cellWidget(0, 5)
    assert resume.text() == "Resume"
    qtbot.waitUntil(lambda: resume.isVisible() and resume.width() >= resume.sizeHint().width()
                    and resume.height() >= resume.sizeHint().height(), timeout=5_000)  # not clipped
    hub.rate = 0
    models.downloads_tab.table.cellWidget(0, 5).click()  # Resume
    new_id = next(iter(models.downloads_tab.rows))
    qtbot.waitUntil(lambda: "verified" in models.downloads_tab.state_text(new_id), timeout=60_000)
    assert any((r[2] or "").startswith("bytes=") for r in hub.requests if "/cdn/" in r[1])  # resumed by range

    qtbot.waitUntil(lambda: any(e.repo_id == REPO for e in w.ctx.library.entries), timeout=30_000)
    models.tabs.setCurrentIndex(0)
    entry = next(e for e in w.ctx.library.entries if e.repo_id == REPO)
    assert entry.facts.supported and entry.facts.architecture == "LlamaForCausalLM"
    assert models.library_tab.select_key(entry.key)
    qtbot.mouseClick(models.library_tab.load_button, Qt.LeftButton)  # opens the Load panel on it
    assert w.stack.currentWidget() is w.panels["load"]
    assert w.panels["load"].current_key() == entry.key

    models.library_tab.delete_selected(confirm=False)
    qtbot.waitUntil(lambda: "freed" in models.status.text(), timeout=30_000)
    assert "MB" in models.status.text() or "KB" in models.status.text()
    qtbot.waitUntil(lambda: not any(e.repo_id == REPO for e in w.ctx.library.entries), timeout=30_000)
    assert not (_cache(app_env) / "models--kestrel-test--tiny-smollm2").exists()


@pytest.fixture
def quantized_hub(tiny_model_dir, app_env, monkeypatch, tmp_path):
    """A fake Hub of pre-quantized repos (the tiny model's files under another config.json): GPTQ int4 g128,
    the same with the Hub's summary of its config (only quant_method and bits), bitsandbytes, and bitsandbytes
    beside a GGUF file."""
    import huggingface_hub.constants

    src = tiny_model_dir("smollm2")
    cfg = json.loads((src / "config.json").read_text())
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
    bnb = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
    repos = {}
    for repo_id, qc, extra in (("q/gptq", gptq, {}), ("q/gptq-summary", gptq, {}), ("q/bnb", bnb, {}),
                               ("q/bnb-and-gguf", bnb, {"model-Q4_K_M.gguf": b"GGUF" + bytes(60)})):
        d = tmp_path / repo_id.replace("/", "--")
        shutil.copytree(src, d)
        (d / "config.json").write_text(json.dumps({**cfg, "quantization_config": qc}))
        for name, data in extra.items():
            (d / name).write_bytes(data)
        repos[repo_id] = d
    summary = {"architectures": cfg["architectures"], "model_type": cfg["model_type"],
               "quantization_config": {"bits": 4, "quant_method": "gptq"}}
    fake = FakeHub(repos, extra_info={"q/gptq-summary": {"config": summary}})
    monkeypatch.setenv("HF_ENDPOINT", fake.url)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield fake
    fake.close()


def test_a_gptq_repo_is_loadable_with_its_quantization_named(quantized_hub):
    d = repo_details("q/gptq")
    assert d.supported and d.reason == ""
    (v,) = d.variants
    assert v.label == "safetensors (GPTQ int4 g128)" and v.quantization == "GPTQ int4 g128"
    assert v.loadable and v.reason == "" and not v.is_gguf
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {f.path for f in v.files}
    # the Hub's summary of config.json (no group_size): named as far as it says, and loadable
    s = repo_details("q/gptq-summary")
    assert s.supported and [(v.label, v.loadable) for v in s.variants] == [("safetensors (GPTQ int4)", True)]


def test_an_unsupported_quantization_on_the_hub_is_refused_in_words(quantized_hub):
    d = repo_details("q/bnb")
    assert not d.supported
    (v,) = d.variants
    assert v.label == "safetensors (bitsandbytes)" and not v.loadable
    assert d.reason == v.reason == (
        "bitsandbytes-quantized checkpoints cannot be loaded. Kestrel loads GPTQ (4 or 8 bits), AWQ (4 bits, GEMM "
        "layout) and FP8 checkpoints (per tensor, per channel or 128x128 blocks, llm-compressor's compressed-tensors "
        "FP8 included); use the unquantized model or a GGUF file.")
    # a GGUF file beside them: the repo has something to run
    both = repo_details("q/bnb-and-gguf")
    assert both.supported and both.reason == ""
    assert [(v.label, v.loadable) for v in both.variants] == [("Q4_K_M", True), ("safetensors (bitsandbytes)", False)]
