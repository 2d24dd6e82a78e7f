"""engine/__init__.py sets OMP_WAIT_POLICY=PASSIVE for an engine process (OpenMP workers sleep after a region
instead of spinning on the cores the decode step's pool threads need), unless the user chose a policy or
KESTREL_OMP_PASSIVE=0; the bench's llama.cpp peer runs without the engine's choice."""

from __future__ import annotations

import os
import subprocess
import sys

from engine.bench import llamacpp_peer


def _policy_in_child(env: dict) -> str:
    code = "import engine, os; print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('KESTREL_OMP_WAIT_POLICY_SET'))"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def _clean_env() -> dict:
    env = dict(os.environ)
    for k in ("OMP_WAIT_POLICY", "KESTREL_OMP_WAIT_POLICY_SET", "KESTREL_OMP_PASSIVE"):
        env.pop(k, None)
    return env


def test_engine_sets_passive_unless_told_otherwise():
    env = _clean_env()
    assert _policy_in_child(env) == "PASSIVE 1"
    assert _policy_in_child({**env, "OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE None"
    assert _policy_in_child({**env, "KESTREL_OMP_PASSIVE": "0"}) == "None None"


def test_llamacpp_peer_child_gets_no_engine_policy(monkeypatch):
    seen = {}

    def fake_run(cmd, **kw):
        seen.update(kw["env"])
        return subprocess.CompletedProcess(cmd, 3, "", "")

    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("KESTREL_OMP_WAIT_POLICY_SET", "1")
    monkeypatch.setattr(llamacpp_peer.subprocess, "run", fake_run)
    assert llamacpp_peer.run_in_child("m.gguf", [1], 2, 2, 1).startswith("skipped")
    assert "OMP_WAIT_POLICY" not in seen and seen["KESTREL_OMP_PASSIVE"] == "0"
    # a policy the user set is the user's: it reaches llama.cpp as it did before
    monkeypatch.delenv("KESTREL_OMP_WAIT_POLICY_SET")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    llamacpp_peer.run_in_child("m.gguf", [1], 2, 2, 1)
    assert seen["OMP_WAIT_POLICY"] == "ACTIVE"
