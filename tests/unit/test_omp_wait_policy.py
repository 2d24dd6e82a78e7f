"""engine/__init__.py sets OMP_WAIT_POLICY=PASSIVE for an engine process (OpenMP workers sleep after a region
instead of spinning on the cores the decode step's pool threads need), unless the user chose a policy (ACTIVE keeps
OpenMP's spinning: the KESTREL_OMP_PASSIVE switch went, issue 46); the bench's llama.cpp peer runs without the
engine's choice."""

from __future__ import annotations

import os
import subprocess
import sys

from engine.bench import llamacpp_peer


def _policy_in_child(env: dict) -> str:
    code = "import engine, os; print(os.environ.get('OMP_WAIT_POLICY'), engine.OMP_WAIT_POLICY_BY_ENGINE)"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def _clean_env() -> dict:
    env = dict(os.environ)
    for k in ("OMP_WAIT_POLICY",):
        env.pop(k, None)
    return env


def test_engine_sets_passive_unless_told_otherwise():
    env = _clean_env()
    assert _policy_in_child(env) == "PASSIVE True"
    assert _policy_in_child({**env, "OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE False"
    assert _policy_in_child({**env, "OMP_WAIT_POLICY": "PASSIVE"}) == "PASSIVE False"  # the user's, kept as theirs


def test_llamacpp_peer_child_gets_no_engine_policy(monkeypatch):
    seen = {}

    def fake_run(cmd, **kw):
        seen.update(kw["env"])
        return subprocess.CompletedProcess(cmd, 3, "", "")

    import engine

    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setattr(engine, "OMP_WAIT_POLICY_BY_ENGINE", True)
    monkeypatch.setattr(llamacpp_peer.subprocess, "run", fake_run)
    assert llamacpp_peer.run_in_child("m.gguf", [1], 2, 2, 1).startswith("skipped")
    assert "OMP_WAIT_POLICY" not in seen
    # a policy the user set is the user's: it reaches llama.cpp as it did before
    monkeypatch.setattr(engine, "OMP_WAIT_POLICY_BY_ENGINE", False)
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    llamacpp_peer.run_in_child("m.gguf", [1], 2, 2, 1)
    assert seen["OMP_WAIT_POLICY"] == "ACTIVE"


def test_the_peer_child_drops_the_policy_its_engine_import_set():
    """In the peer's own process the engine import sets PASSIVE again (the launcher dropped it); main() drops it
    before llama.cpp (and its OpenMP) loads; a user's policy stays."""
    code = ("import sys, io, os; sys.stdin = io.StringIO('{}'); from engine.bench import llamacpp_peer as p; "
            "import builtins; real = builtins.__import__; "
            "builtins.__import__ = lambda n, *a, **k: (_ for _ in ()).throw(ImportError()) if n == 'llama_cpp' "
            "else real(n, *a, **k); print(p.main(), os.environ.get('OMP_WAIT_POLICY'))")
    env = _clean_env()
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "3 None"
    run = subprocess.run([sys.executable, "-c", code], env={**env, "OMP_WAIT_POLICY": "ACTIVE"},
                         capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "3 ACTIVE"
