"""Issue 45, "Done when": the app driven from an install made exactly as the README makes it. A fresh
virtualenv set up by ``installer/setup.sh`` (what ``bash installer/run-app.sh`` runs: the server and gui
extras, no test extra), then tests/install/drive_app.py run by THAT virtualenv's python on the real window,
the real engine process and the embedded SmolLM2 model: a Benchmark run with live plots (and ``kestrel bench
serve``), a long reply shown whole, a bad file refused while the loaded model keeps working, the endpoint
across a model load, a reply interrupted by an engine kill and by closing the window still there on reopen,
and screenshots of each scene at 1024x700 and 1600x1000 in light and dark (the folder is printed at the end of
the run).

The install takes a few minutes (PyTorch from pip's cache, the native kernels built): the tier runs by default
(``bash installer/run-tests.sh``, CI); ``-m "not install"`` leaves it out. Environment:
    KESTREL_INSTALL_VENV    an existing virtualenv to set up again with setup.sh (only what changed) and
                            use, kept afterwards; without it a fresh one in pytest's temporary folder,
                            removed after the run
    KESTREL_INSTALL_SHOTS   where the screenshots go (default /tmp/shots/install)
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.xdist_plan import add_summary

pytestmark = [pytest.mark.install, pytest.mark.slow(seconds=170), pytest.mark.timeout(3600)]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DRIVER = HERE / "drive_app.py"
OBS_PREFIX = "KESTREL-OBS "  # drive_app.OBS_PREFIX (the driver runs under the install's python, not imported)
MODEL = "SmolLM2-135M-Instruct.Q4_1"
SIZES = ("1024x700", "1600x1000")
THEMES = ("light", "dark")
CLOSED_REASON = "The app was closed during this reply."  # app.panels.chat.CLOSED_REASON


def summary(config, line: str) -> None:
    """A line for the end of the run, in its "install tier" section (also under xdist)."""
    add_summary(config, "install tier", line)


@dataclass
class Install:
    venv: Path
    python: Path
    seconds: float
    steps: list[tuple[str, float]] = field(default_factory=list)


def _clean_env() -> dict:
    """This process's environment without what ties it to the test virtualenv or to the test run."""
    env = dict(os.environ)
    for key in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "TRITON_INTERPRET", "PYTEST_ADDOPTS"):
        env.pop(key, None)
    test_bin = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != test_bin)
    return env


@pytest.fixture(scope="session")
def readme_install(tmp_path_factory, request) -> Install:
    """``KESTREL_VENV=<venv> bash installer/setup.sh``, as the README's set-up (no --test), each step's time
    taken from the script's own lines as they come."""
    reuse = os.environ.get("KESTREL_INSTALL_VENV")
    venv = Path(reuse) if reuse else tmp_path_factory.mktemp("readme-install") / "venv"
    env = _clean_env()
    for key in list(env):
        if key.startswith("KESTREL_") and key not in ("KESTREL_TORCH_INDEX", "KESTREL_CUDA_ARCHS",
                                                      "KESTREL_DISABLE_CUDA"):
            env.pop(key)
    env["KESTREL_VENV"] = str(venv)
    t0 = time.monotonic()
    steps: list[tuple[str, float]] = []
    lines: list[str] = []
    proc = subprocess.Popen(["bash", str(ROOT / "installer" / "setup.sh")], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if "[kestrel setup]" in line:
            steps.append((line.split("[kestrel setup]", 1)[1].replace("\x1b[0m", "").strip(),
                          time.monotonic() - t0))
    rc = proc.wait()
    seconds = time.monotonic() - t0
    log = "\n".join(x for x in lines if "is ignored: it is neither a file nor a directory" not in x)
    (venv.parent / "setup.log").write_text(log + "\n")
    assert rc == 0, f"installer/setup.sh failed (exit {rc}):\n{log[-4000:]}"
    python = venv / "bin" / "python"
    assert python.exists() and (venv / "bin" / "kestrel").exists(), log[-2000:]
    durations = [f"{what}: {(end - start):.0f} s" for (what, start), (_, end)
                 in zip(steps, [*steps[1:], ("end", seconds)]) if not what.startswith(("ready", "to add"))]
    summary(request.config, f"README install (installer/setup.sh, no --test) in {venv}: {seconds:.0f} s")
    for d in durations:
        summary(request.config, f"  {d}")
    yield Install(venv, python, seconds, steps)
    if not reuse:
        shutil.rmtree(venv, ignore_errors=True)


@pytest.fixture(scope="session")
def shots_dir(request) -> Path:
    path = Path(os.environ.get("KESTREL_INSTALL_SHOTS", "/tmp/shots/install"))
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.png"):
        old.unlink()
    summary(request.config, f"screenshots (1024x700 and 1600x1000, light and dark): {path}")
    return path


@pytest.fixture(scope="session")
def app_home(tmp_path_factory) -> Path:
    """The user's side of the driven app: its data folder (conversations, settings), an empty HF cache, its
    own HOME and XDG folders; shared by the two runs (the second one reopens what the first left)."""
    return tmp_path_factory.mktemp("install-user")


def run_driver(install: Install, phase: str, home: Path, shots: Path, *extra: str, timeout: float) -> dict:
    """drive_app.py ``phase`` under the install's python: {scenario: observations}."""
    env = {k: v for k, v in _clean_env().items() if not k.startswith(("KESTREL_", "PYTEST_", "QT_"))}
    user = home / "home"
    env.update(QT_QPA_PLATFORM="offscreen", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1",
               KESTREL_DATA_DIR=str(home / "data"), HF_HUB_CACHE=str(home / "hf-cache"), HOME=str(user),
               XDG_CONFIG_HOME=str(user / ".config"), XDG_DATA_HOME=str(user / ".local" / "share"),
               XDG_CACHE_HOME=str(user / ".cache"))
    user.mkdir(parents=True, exist_ok=True)
    work = home / f"work-{phase}"
    cmd = [str(install.python), str(DRIVER), phase, "--shots", str(shots), "--work", str(work), *extra]
    try:
        proc = subprocess.run(cmd, cwd=home, env=env, text=True, capture_output=True, timeout=timeout)
        out, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc = f"killed after {timeout:.0f} s"
    (home / f"driver-{phase}.log").write_text(out)
    seen = {}
    for line in out.splitlines():
        if line.startswith(OBS_PREFIX):
            obs = json.loads(line[len(OBS_PREFIX):])
            seen[obs.pop("scenario")] = obs
    if rc != 0 or not seen:
        seen["_driver"] = {"error": f"drive_app.py {phase} exited {rc}:\n{out[-6000:]}"}
    return seen


@pytest.fixture(scope="module")
def first(readme_install, app_home, shots_dir) -> dict:
    return run_driver(readme_install, "first", app_home, shots_dir, timeout=1500)


@pytest.fixture(scope="module")
def reopened(first, readme_install, app_home, shots_dir) -> dict:
    killed = (first.get("kill_mid_reply") or {}).get("conversation")
    extra = ("--killed-conversation", str(killed)) if killed is not None else ()
    return run_driver(readme_install, "reopen", app_home, shots_dir, *extra, timeout=600)


def scenario(seen: dict, name: str) -> dict:
    """The observations of one scenario; it must have run to its end."""
    driver = seen.get("_driver", {}).get("error", seen)
    assert name in seen, f"the driver printed nothing for {name}: {driver}"
    obs = seen[name]
    assert "error" not in obs, f"{name} stopped: {obs['error']}\nobserved so far: {json.dumps(obs)[:3000]}"
    return obs


# ---- the tests ---------------------------------------------------------------------------------------------

def test_the_install_has_no_test_extra_and_starts_on_the_embedded_model(first):
    obs = scenario(first, "startup")
    assert obs["test_packages_importable"] == [], "the README install must not have the test extra"
    assert obs["name"] == MODEL and obs["device"] == "cpu", obs
    assert obs["load_message"].startswith(f"Loaded {MODEL}"), obs["load_message"]
    assert MODEL in obs["status_bar"]


def test_a_long_reply_is_shown_whole_at_every_size(first):
    obs = scenario(first, "long_reply")
    stored = obs["stored"]
    assert stored["role"] == "assistant" and stored["finish_reason"] in ("length", "stop"), stored
    # a reply long enough to wrap over many lines at every width (else this checks nothing)
    assert stored["num_tokens"] >= 120 and len(stored["content"]) >= 500, stored
    assert obs["shown_text_equals_stored"]
    assert obs["tail_in_labels"], f"the reply's last words {obs['tail_words']!r} are not in the card's labels"
    for size in (*SIZES, "1300x800"):
        at = obs["sizes"][size]
        assert at["window"] == [int(v) for v in size.split("x")], at
        assert at["problems"] == [], f"at {size}: {at['problems']}"
        assert at["end_in_view_after_scrolling_down"], f"at {size} the reply's end is not on screen: {at}"
        assert at["card"][1] >= at["card"][2], at  # the card as high as its height for its width


def test_a_bad_file_is_refused_and_the_loaded_model_keeps_working(first):
    obs = scenario(first, "bad_file")
    panel = obs["load_panel"]
    assert not panel["load_enabled"], panel
    assert "not a GGUF file" in panel["warning"] and "bad magic" not in panel["warning"], panel
    assert obs["load_selected_returned"] is False
    after = obs["after_refusal"]
    assert after["state"] == "ready" and after["name"] == obs["model_before"], after
    assert after["same_engine_process"] and after["same_client"], after
    assert after["message"].startswith("Not loaded.") and after["message"].endswith("is still loaded."), after
    lib = obs["library"]
    assert not lib["load_enabled"] and lib["reason_cell"].startswith("no: not a GGUF file"), lib
    assert lib["reason_note"] and "cannot load holiday" in lib["reason_note"], lib
    reply = obs["reply_after"]
    assert reply["role"] == "assistant" and reply["content"].strip(), reply
    assert reply["finish_reason"] in ("length", "stop"), reply
    assert obs["model_after"] == obs["model_before"] == MODEL


def test_the_benchmark_panel_runs_and_draws_live_plots(first):
    obs = scenario(first, "benchmark")
    assert obs["local_target_checked"], "the app's own endpoint is the Benchmark panel's target"
    assert obs["default_preset"] == "cpu", obs  # the preset for the device the model runs on
    assert obs["report"] is not None, f"no report; the panel says: {obs['message']}"
    assert obs["message"].startswith("Done"), obs["message"]
    report = obs["report"]
    assert report["points"] == 2 and report["requests"] == 8, report
    assert report["completed"] == [4, 4] and report["failed"] == [0, 0], report
    assert report["setup_model"] == MODEL, report
    live = obs["live"]
    assert live["plotted_points"] == live["scatter_count"] == 8, live  # every request drawn in the Live tab
    assert live["throughput_points"] == 8, live
    assert live["coloured_pixels"] > 30, live  # and drawn on screen, not only held by the plot
    assert obs["results_curves"] >= 1 and obs["library_runs"] == 1, obs


def test_kestrel_bench_serve_runs_from_the_install(first):
    obs = scenario(first, "bench_cli")
    assert obs["rc"] == 0, obs["output_tail"]
    assert obs["completed"] == [2], obs


def test_the_endpoint_follows_a_model_load(first):
    before = scenario(first, "endpoint_before")
    assert before["models"] == [200, [MODEL]], before
    assert before["chat"][0] == 200 and before["chat"][1].strip(), before
    obs = scenario(first, "endpoint_across_load")
    assert obs["dtype_after"] == "float32" and obs["dtype_before"] != "float32", obs
    assert obs["base_after"] == before["base"], "the endpoint moved"
    # polled all through the load: it answered (200, or 503 while loading), never refused the connection
    codes = obs["codes_seen_during_load"]
    assert obs["polls"] > 0 and set(codes) <= {"200", "503"}, codes
    assert obs["status_text"].startswith(f"Serving {MODEL} at {before['base']}"), obs["status_text"]
    assert obs["models"] == [200, [MODEL]], obs
    assert obs["chat"][0] == 200 and obs["chat"][1].strip(), obs
    assert obs["server_info"][0] == 200 and obs["server_info"][1]["dtype"] == "float32", obs["server_info"]
    assert obs["log_events"], "the Server panel's log does not say the model changed"


def test_a_reply_interrupted_by_an_engine_kill_is_kept_and_there_on_reopen(first, reopened):
    obs = scenario(first, "kill_mid_reply")
    stored = obs["stored"]
    assert [m["role"] for m in stored] == ["user", "assistant"], stored
    reply = stored[-1]
    assert reply["finish_reason"] == "interrupted" and "SIGKILL" in (reply["error"] or ""), reply
    assert len(reply["content"]) >= 40, reply  # at least what had streamed before the kill
    shown = obs["shown"]
    assert shown["text"] == reply["content"] and shown["error_visible"], shown
    assert shown["error"].startswith("Interrupted:") and "retry shortly" not in shown["error"], shown
    assert "runs again" in obs["notice_after_restart"] and obs["new_pid"], obs
    assert obs["endpoint_after_restart"] == 200, obs

    again = scenario(reopened, "reopen_killed")
    assert again["open_conversation"] == obs["conversation"]
    assert again["stored"] == stored, "the stored conversation changed across the restart of the app"
    assert [c["text"] for c in again["shown"]][-1] == reply["content"]
    assert again["shown"][-1]["error_visible"] and again["shown"][-1]["error"].startswith("Interrupted:")


def test_a_reply_interrupted_by_closing_the_window_is_there_on_reopen(first, reopened):
    closed = scenario(first, "close_mid_reply")
    assert closed["engine_process_ended"]
    obs = scenario(reopened, "reopen")
    assert obs["open_conversation"] == closed["conversation"], "the app reopens on another conversation"
    stored = obs["stored"]
    assert [m["role"] for m in stored] == ["user", "assistant"], stored
    reply = stored[-1]
    assert reply["finish_reason"] == "interrupted" and reply["error"] == CLOSED_REASON, reply
    before = closed["streamed_before_close"]
    assert reply["content"].startswith(before), (reply, before)
    shown = obs["shown"][-1]
    assert shown["text"] == reply["content"] and shown["error_visible"], shown
    assert shown["error"].startswith("Interrupted: The app was closed"), shown
    assert "interrupted" in shown["stats"], shown
    assert obs["roles_after_next_turn"] == ["user", "assistant", "user", "assistant"], obs


def _png_size(path: Path) -> tuple[int, int]:
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_screenshots_of_every_scene_at_both_sizes_light_and_dark(first, reopened, shots_dir):
    for seen in (first, reopened):
        assert "_driver" not in seen, seen["_driver"]["error"]
    scenes = ("chat-long-reply", "load-refused", "library-refused", "benchmark-live", "benchmark-results",
              "server-after-load", "chat-killed", "reopen-closed-reply", "reopen-killed-reply")
    missing = []
    for scene in scenes:
        for size in SIZES:
            want = tuple(int(v) for v in size.split("x"))
            pair = []
            for theme in THEMES:
                path = shots_dir / f"{scene}-{size}-{theme}.png"
                if not path.exists():
                    missing.append(path.name)
                    continue
                assert _png_size(path) == want, f"{path.name} is {_png_size(path)}"
                pair.append(path.read_bytes())
            if len(pair) == 2:
                assert pair[0] != pair[1], f"{scene} at {size}: the light and dark pictures are the same"
    assert not missing, f"screenshots missing: {missing}"
