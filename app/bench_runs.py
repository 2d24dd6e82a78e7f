"""The library of saved benchmark runs: one JSON report per run (the structure of `kestrel bench sweep`'s
report) in a folder under the app's data directory, so a run made in the app can be reopened, overlaid and
compared later; a report written by the command line is imported (``RunLibrary.import_file``, the panel's
"Import report…") or dropped in the folder, and shows up too."""

from __future__ import annotations

import datetime
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from app import paths
from app.bench_report import label, setup, setup_line
from engine.bench.serve import json_safe  # as the command line writes its reports


def runs_dir() -> Path:
    path = paths.data_dir() / "bench-runs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_report(report: dict, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(json_safe(report), indent=2, default=str))
    return path


def read_report(path: str | Path) -> dict:
    """A report from disk; ValueError (in words) when it is not a sweep or serve report."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{Path(path).name}: not a readable JSON report ({e})") from None
    if not isinstance(data, dict) or "command" not in data:
        raise ValueError(f"{Path(path).name}: not a Kestrel benchmark report")
    if "points" not in data and "metrics" in data:  # a single `bench serve` run: one point
        conc = data.get("arrivals", {}).get("max_concurrency")
        point = {k: data[k] for k in ("dataset", "arrivals", "metrics", "requests") if k in data}
        data = {**data, "points": [{"params": {"max_concurrency": conc}, **point}]}
    return data


@dataclass(frozen=True)
class RunEntry:
    path: Path
    label: str
    date: str
    command: str
    points: int
    base_url: str = ""
    model: str = ""
    device: str = ""  # as the server said ("cpu", "cuda:0"), "" when it did not
    setup: str = ""  # what was measured in one line (app.bench_report.setup_line)
    details: dict | None = None  # app.bench_report.setup(): model, file type, load options, device, versions


class RunLibrary:
    """Saved runs in ``folder`` (default: runs_dir()), newest first."""

    def __init__(self, folder: Path | None = None):
        self.folder = Path(folder) if folder is not None else runs_dir()
        self.folder.mkdir(parents=True, exist_ok=True)

    def _new_path(self, report: dict) -> Path:
        """A path in the folder not taken yet, named after the time now and ``report``'s label."""
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", label(report)).strip("-")[:60] or "run"
        path = self.folder / f"{stamp}-{slug}.json"
        n = 1
        while path.exists():
            n += 1
            path = self.folder / f"{stamp}-{slug}-{n}.json"
        return path

    def save(self, report: dict) -> Path:
        """Write ``report`` under a new name made of its date and label; returns the path."""
        return write_report(report, self._new_path(report))

    def import_file(self, path: str | Path) -> Path:
        """Copy a report written elsewhere (`kestrel bench serve` / `sweep --result-filename`) into the library,
        unchanged; returns its path there. ValueError (in words) when it is not a report."""
        src = Path(path)
        report = read_report(src)
        if src.parent.resolve() == self.folder.resolve():
            return src
        dest = self._new_path(report)
        shutil.copyfile(src, dest)
        return dest

    def entries(self) -> list[RunEntry]:
        out = []
        for p in self.folder.glob("*.json"):
            try:
                r = read_report(p)
            except ValueError:
                continue  # not a report: left alone, not listed
            server = r.get("server") or {}
            out.append(RunEntry(p, label(r), str(r.get("date", "")), str(r.get("command", "")),
                                len(r.get("points", [])), str(server.get("base_url", "")),
                                str(server.get("model") or ""),
                                str((server.get("kestrel") or {}).get("device") or (r.get("load") or {}).get("device")
                                    or ""), setup_line(r), setup(r)))
        return sorted(out, key=lambda e: (e.date, e.path.name), reverse=True)

    def load(self, path: str | Path) -> dict:
        return read_report(path)

    def delete(self, path: str | Path) -> None:
        p = Path(path)
        if p.parent.resolve() == self.folder.resolve():
            p.unlink(missing_ok=True)
