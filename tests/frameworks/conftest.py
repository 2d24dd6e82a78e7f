"""The frameworks tier: agent frameworks' own minimal examples (tests/frameworks/scripts/), unchanged but for the
server's URL, run in their scratch virtualenv (tests/frameworks/venv.py) as subprocesses against a real
``kestrel serve`` on the default model, started once for the tier.

``framework_python``: the venv's interpreter. Absent, the tier is skipped, except under CI=true, where it is built
(one ``pip install`` of the pinned packages, cached outside the repository, its time printed).
``kestrel_serve``: the server with its access log (``--log-level info``), read line by line, so a test can say
whether any request of its run was answered with a status >= 400."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.frameworks import venv
from tests.support.xdist_plan import add_summary

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
_ACCESS = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3})')
_DROPPED = re.compile(r"dropped|suppressed", re.I)


@pytest.fixture(scope="session")
def framework_python(pytestconfig) -> Path:
    if not venv.ready():
        if os.environ.get("CI", "").lower() != "true":
            pytest.skip(f"the frameworks venv is absent: python -m tests.frameworks.venv makes it ({venv.venv_dir()})")
        took = venv.build()
        add_summary(pytestconfig, "frameworks tier", f"venv built in {took:.0f} s (one pip install): {venv.venv_dir()}")
    return venv.python()


@dataclass
class Served:
    proc: subprocess.Popen
    url: str = ""
    model: str = ""
    lines: list[str] = field(default_factory=list)
    seen: threading.Condition = field(default_factory=threading.Condition)

    def requests(self, since: int = 0) -> list[tuple[str, str, int]]:
        """(method, path, status) of each request in the access log from line ``since`` on."""
        return [(m["method"], m["path"], int(m["status"])) for line in self.lines[since:]
                if (m := _ACCESS.search(line)) and "mark=" not in m["path"]]

    def run(self, script: str, timeout: float = 1800) -> tuple[dict, list[tuple[str, str, int]], str]:
        """Runs one example script in the venv; returns its JSON report, the requests it made (from the server's
        access log) and the server's log lines of its run."""
        start = len(self.lines)
        proc = subprocess.run([str(venv.python()), str(SCRIPTS / script), self.url, self.model],
                              capture_output=True, text=True, timeout=timeout)
        self._mark()
        log = "".join(self.lines[start:])
        assert proc.returncode == 0, proc.stderr[-3000:]
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"\n{script}: {json.dumps(report)[:4000]}")  # what each run did (-s shows it)
        return report, self.requests(start), log

    def _mark(self) -> None:
        """A request of its own, then until its access-log line is read: every earlier line is read by then."""
        mark = uuid.uuid4().hex
        httpx.get(self.url.removesuffix("/v1") + f"/version?mark={mark}")
        with self.seen:
            assert self.seen.wait_for(lambda: any(mark in line for line in self.lines[-50:]), 60)


@pytest.fixture(scope="session")
def kestrel_serve():
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", "--port", "0", "--log-level", "info"],
                            cwd=str(ROOT), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    served = Served(proc)
    ready = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            with served.seen:
                served.lines.append(line)
                served.seen.notify_all()
            if line.startswith("OpenAI base URL:"):
                served.url = line.split()[3]
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        ready.wait(600)
        assert served.url, "".join(served.lines)[-3000:]
        served.model = httpx.get(served.url + "/models").json()["data"][0]["id"]
        yield served
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def no_errors(requests: list[tuple[str, str, int]], log: str) -> None:
    """Every request of the run answered below 400, and the access log kept every line (its flood filter did not
    drop any)."""
    assert requests, log[-2000:]
    assert not _DROPPED.search(log), log[-2000:]
    bad = [r for r in requests if r[2] >= 400]
    assert not bad, (bad, log[-3000:])
