"""The local model library: the embedded default model, the Hugging Face cache, the app's models folder and
loose GGUF files the user added. Each entry carries what the engine needs to load it (``model_ref``), a
stable key for its settings, and its facts (app.model_inspect). Deleting frees disk space and says how much.
Plain Python (runs on a worker thread)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from app.model_inspect import ModelFacts, inspect_model
from engine.constants import DEFAULT_MODEL_FILE, embedded_model_path

# The embedded default model (engine.constants: the loader locates it the same way, torch-free).
EMBEDDED_KEY = "embedded:" + DEFAULT_MODEL_FILE


@dataclass
class LibraryEntry:
    facts: ModelFacts
    source: str  # "embedded" | "hf-cache" | "models-folder" | "added"
    model_ref: str  # EngineConfig.model ("" = the embedded default)
    key: str  # stable key for per-model settings
    repo_id: str | None = None

    @property
    def name(self) -> str:
        if self.repo_id:
            if self.facts.format == "gguf":
                return f"{self.repo_id} · {self.facts.path.name}"
            return self.repo_id
        return self.facts.name

    @property
    def deletable(self) -> bool:
        return self.source in ("hf-cache", "models-folder")

    @property
    def source_label(self) -> str:
        return {"embedded": "Embedded", "hf-cache": "HF cache", "models-folder": "Models folder",
                "added": "Added file"}[self.source]


def scan_library(hf_cache: Path, models_dir: Path, added: list[str] | None = None) -> list[LibraryEntry]:
    entries: list[LibraryEntry] = []
    embedded = embedded_model_path()
    if embedded is not None:
        entries.append(LibraryEntry(inspect_model(embedded), "embedded", "", EMBEDDED_KEY))
    entries.extend(_scan_hf_cache(hf_cache))
    entries.extend(_scan_models_dir(models_dir))
    seen = {e.facts.path.resolve() for e in entries}
    for item in added or []:
        path = Path(item)
        if path.exists() and path.resolve() not in seen:
            seen.add(path.resolve())
            entries.append(LibraryEntry(inspect_model(path), "added", str(path), str(path)))
    return entries


def missing_added(added: list[str]) -> list[str]:
    """The added files (Browse in the Load panel, "Add GGUF file") that are no longer there: the library does
    not show them, so the panel offers to forget them."""
    return [item for item in added if not os.path.exists(item)]


def entry_for_path(path: Path, entries: list[LibraryEntry]) -> LibraryEntry | None:
    target = path.resolve()
    return next((e for e in entries if e.facts.path.resolve() == target), None)


# ------------------------------------------------------------------------------------------------
# the Hugging Face cache (models--org--name/{blobs,snapshots/<commit>/...,refs/main})


def repo_folder(hf_cache: Path, repo_id: str) -> Path:
    return hf_cache / ("models--" + repo_id.replace("/", "--"))


def _current_snapshot(repo_dir: Path) -> Path | None:
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        snap = repo_dir / "snapshots" / ref.read_text().strip()
        if snap.is_dir():
            return snap
    snaps = [p for p in (repo_dir / "snapshots").glob("*") if p.is_dir()]
    return max(snaps, key=lambda p: p.stat().st_mtime) if snaps else None


def _scan_hf_cache(hf_cache: Path) -> list[LibraryEntry]:
    out: list[LibraryEntry] = []
    if not hf_cache.is_dir():
        return out
    for repo_dir in sorted(hf_cache.glob("models--*")):
        snap = _current_snapshot(repo_dir)
        if snap is None:
            continue
        repo_id = repo_dir.name.removeprefix("models--").replace("--", "/", 1)
        if (snap / "config.json").is_file() and any(snap.glob("*.safetensors")):
            out.append(LibraryEntry(inspect_model(snap), "hf-cache", str(snap), f"hf:{repo_id}", repo_id))
        for gguf in sorted(p for p in snap.rglob("*.gguf") if p.exists()):
            rel = gguf.relative_to(snap).as_posix()
            out.append(LibraryEntry(inspect_model(gguf), "hf-cache", str(gguf), f"hf:{repo_id}/{rel}", repo_id))
    return out


def _scan_models_dir(models_dir: Path) -> list[LibraryEntry]:
    out: list[LibraryEntry] = []
    if not models_dir.is_dir():
        return out
    for item in sorted(models_dir.iterdir()):
        if item.is_file() and item.suffix == ".gguf" or item.is_dir() and ((item / "config.json").is_file() or any(item.glob("*.gguf"))):
            out.append(LibraryEntry(inspect_model(item), "models-folder", str(item), str(item)))
    return out


# ------------------------------------------------------------------------------------------------
# deleting


def deletion_size(entry: LibraryEntry, hf_cache: Path) -> int:
    """Bytes that deleting ``entry`` frees."""
    if entry.source == "hf-cache":
        return sum(_blob_sizes(_hf_paths_to_delete(entry, hf_cache)[1]).values())
    return entry.facts.size_bytes


def delete_entry(entry: LibraryEntry, hf_cache: Path) -> int:
    """Delete the model from disk; returns the bytes freed. Loose files the user added are never deleted
    (remove them from the library instead)."""
    if not entry.deletable:
        raise PermissionError(f"{entry.name} is not deletable from the app ({entry.source_label}).")
    if entry.source == "hf-cache":
        whole_repo, blobs, pointers = _hf_paths_to_delete(entry, hf_cache)
        freed = sum(_blob_sizes(blobs).values())
        if whole_repo is not None:
            shutil.rmtree(whole_repo, ignore_errors=True)
        else:
            for p in pointers:
                p.unlink(missing_ok=True)
            for b in blobs:
                b.unlink(missing_ok=True)
        return freed
    freed = entry.facts.size_bytes
    path = entry.facts.path
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    return freed


def _hf_paths_to_delete(entry: LibraryEntry, hf_cache: Path) -> tuple[Path | None, set[Path], list[Path]]:
    """(the repo folder when the whole repo goes, the blobs freed, the snapshot pointers to remove)."""
    repo_dir = repo_folder(hf_cache, entry.repo_id)
    all_blobs = {p for p in (repo_dir / "blobs").glob("*") if p.is_file()}
    if entry.facts.format != "gguf":
        return repo_dir, all_blobs, []
    # one GGUF of a repo: its pointers in every snapshot, and its blob unless something else points to it
    rel = Path(entry.model_ref).relative_to(_snapshot_of(Path(entry.model_ref), repo_dir))
    pointers = [s / rel for s in (repo_dir / "snapshots").glob("*") if os.path.lexists(s / rel)]
    targets = {p.resolve() for p in pointers}
    others = {p.resolve() for p in (repo_dir / "snapshots").rglob("*")
              if (p.is_symlink() or p.is_file()) and p not in pointers}
    blobs = {t for t in targets if t in all_blobs and t not in others}
    remaining_ggufs = [p for p in (repo_dir / "snapshots").rglob("*.gguf") if p not in pointers]
    if not remaining_ggufs and not any((repo_dir / "snapshots").glob("*/config.json")):
        return repo_dir, all_blobs, pointers
    return None, blobs, pointers


def _snapshot_of(path: Path, repo_dir: Path) -> Path:
    snaps = repo_dir / "snapshots"
    rel = path.relative_to(snaps)
    return snaps / rel.parts[0]


def _blob_sizes(blobs: set[Path]) -> dict[Path, int]:
    out = {}
    for b in blobs:
        try:
            out[b] = b.stat().st_size
        except OSError:
            pass
    return out
