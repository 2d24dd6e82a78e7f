"""Resumable, verified downloads of Hub files into the Hugging Face cache, in its own layout
(``models--org--name/blobs/<etag>``, ``snapshots/<commit>/<path>`` -> the blob, ``refs/<revision>``), so
huggingface_hub, transformers and the engine find them, and a file already there is never fetched again.

Why not ``hf_hub_download``: it writes each attempt to a process-unique temporary file that it deletes
on failure, so a cancelled or interrupted download cannot be resumed. Here a partial download stays in
``blobs/<etag>.incomplete`` and continues with an HTTP Range request. huggingface_hub still does what it
is good at: the file metadata (size, sha256 of LFS files, git blob id of small files), the resolve URL,
the HEAD call with its redirects and errors, and the auth headers.

Every file is checked after download: its size, and its sha256 (LFS files) or git blob sha1 (small files)
against what the Hub publishes. A mismatch deletes the partial file and raises VerificationError.
Cancellation is cooperative: set the ``cancel`` event; the download stops within one chunk and keeps its
partial file for a later resume. Plain Python (no Qt), run on a worker thread.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.paths import hf_endpoint

CHUNK = 1 << 20


class DownloadError(Exception):
    """A download failed; the message says why in plain words."""


class VerificationError(DownloadError):
    pass


class Cancelled(DownloadError):
    pass


@dataclass
class HubFile:
    path: str  # in the repo
    size: int | None
    sha256: str | None = None  # LFS files
    blob_id: str | None = None  # git blob sha1 (small files)


@dataclass
class Progress:
    filename: str
    done: int  # bytes of the whole job present (including files already in the cache)
    total: int
    speed: float  # bytes/s over the last seconds
    file_index: int
    num_files: int
    fetched: int = 0  # bytes received over the network in this run (not those already in the cache or partial)


ProgressFn = Callable[[Progress], None]


def download_files(repo_id: str, files: list[HubFile], cache_dir: Path, *, revision: str = "main",
                   token: str | None = None, cancel: threading.Event | None = None,
                   on_progress: ProgressFn | None = None, commit: str | None = None) -> Path:
    """Download ``files`` of ``repo_id`` at ``revision`` into the cache; returns the snapshot folder.
    Raises Cancelled, VerificationError or DownloadError."""
    cancel = cancel or threading.Event()
    repo_dir = cache_dir / ("models--" + repo_id.replace("/", "--"))
    total = sum(f.size or 0 for f in files)
    meter = _Meter(total, len(files), on_progress)
    snapshot: Path | None = None
    for i, f in enumerate(files):
        if cancel.is_set():
            raise Cancelled("Download cancelled.")
        meta = _file_metadata(repo_id, f.path, commit or revision, token)
        commit = commit or meta.commit_hash
        snapshot = repo_dir / "snapshots" / meta.commit_hash
        _write_ref(repo_dir, revision, meta.commit_hash)
        meter.start_file(f.path, i)
        blob = repo_dir / "blobs" / _normalize_etag(meta.etag)
        pointer = snapshot / f.path
        if not blob.is_file():
            expected = f.size if f.size is not None else meta.size
            _fetch(meta.location, blob, expected, f, token, cancel, meter)
        else:
            meter.add(blob.stat().st_size, force=True, fetched=False)
        _link(blob, pointer)
    meter.finish()
    if snapshot is None:
        raise DownloadError("Nothing to download.")
    return snapshot


def partial_bytes(repo_id: str, files: list[HubFile], cache_dir: Path) -> int:
    """Bytes already present for these files: complete blobs and partial downloads (for the UI)."""
    repo_dir = cache_dir / ("models--" + repo_id.replace("/", "--"))
    blobs = repo_dir / "blobs"
    done = 0
    for f in files:
        key = f.sha256 or f.blob_id
        if key and (blobs / key).is_file():
            done += (blobs / key).stat().st_size
        elif key and (blobs / (key + ".incomplete")).is_file():
            done += (blobs / (key + ".incomplete")).stat().st_size
    return done


# ------------------------------------------------------------------------------------------------


@dataclass
class _Meta:
    location: str
    etag: str
    commit_hash: str
    size: int | None


def _file_metadata(repo_id: str, filename: str, revision: str, token: str | None) -> _Meta:
    # Hub access only when a download runs
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    url = hf_hub_url(repo_id, filename, revision=revision, endpoint=hf_endpoint())
    try:
        meta = get_hf_file_metadata(url, token=token or None)
    except GatedRepoError:
        raise DownloadError(f"{repo_id} is gated: accept its terms on the Hub, then set your Hugging Face "
                            "token (Models → Hugging Face token).") from None
    except RepositoryNotFoundError:
        raise DownloadError(f"{repo_id} was not found on the Hub (or it is private: set your token).") from None
    except HfHubHTTPError as e:
        raise DownloadError(f"The Hub refused {filename}: {_first_line(e)}") from None
    except OSError as e:
        raise DownloadError(f"Cannot reach the Hub ({_first_line(e)}). Check the connection and retry.") from None
    if not meta.etag or not meta.commit_hash:
        raise DownloadError(f"The Hub's answer for {filename} lacks an ETag or commit; cannot cache it safely.")
    return _Meta(meta.location, meta.etag, meta.commit_hash, meta.size)


def _fetch(url: str, blob: Path, expected: int | None, f: HubFile, token: str | None, cancel: threading.Event,
           meter: _Meter) -> None:
    blob.parent.mkdir(parents=True, exist_ok=True)
    part = blob.with_name(blob.name + ".incomplete")
    digest = _Digest(f, expected)
    have = part.stat().st_size if part.is_file() else 0
    if expected is not None and have > expected:
        part.unlink()
        have = 0
    if have:
        with open(part, "rb") as fh:
            for chunk in iter(lambda: fh.read(CHUNK), b""):
                digest.update(chunk)
    meter.add(have, force=True, fetched=False)
    if expected is None or have < expected:
        _stream(url, part, have, digest, token, cancel, meter)
    size = part.stat().st_size
    if expected is not None and size != expected:
        part.unlink(missing_ok=True)
        raise VerificationError(f"{f.path}: got {size} bytes, the Hub says {expected}. The partial file was "
                                "removed; download it again.")
    problem = digest.check()
    if problem:
        part.unlink(missing_ok=True)
        raise VerificationError(f"{f.path} is corrupt: {problem}. The file was removed; download it again.")
    os.chmod(part, 0o644)
    os.replace(part, blob)


class _Digest:
    """sha256 for LFS files, git's blob sha1 for small files, nothing when the Hub publishes neither."""

    def __init__(self, f: HubFile, size: int | None):
        self.want = f.sha256 or (f.blob_id if size is not None else None)
        self.kind = "sha256" if f.sha256 else "git blob hash"
        self.size = size
        self.reset()

    def reset(self) -> None:
        self.h = hashlib.sha256() if self.kind == "sha256" else hashlib.sha1()
        if self.kind != "sha256" and self.size is not None:
            self.h.update(f"blob {self.size}\0".encode())

    def update(self, data: bytes) -> None:
        if self.want:
            self.h.update(data)

    def check(self) -> str | None:
        if not self.want:
            return None
        got = self.h.hexdigest()
        if got == self.want:
            return None
        return f"its {self.kind} is {got[:12]}…, the Hub publishes {self.want[:12]}…"


def _stream(url: str, part: Path, have: int, digest: _Digest, token: str | None, cancel: threading.Event,
            meter: _Meter) -> None:
    from huggingface_hub.utils import build_hf_headers

    headers = build_hf_headers(token=token or None)
    headers["Accept-Encoding"] = "identity"
    if not _same_host(url, hf_endpoint() or "https://huggingface.co"):
        headers.pop("authorization", None)  # a signed CDN URL: no token to third parties
    if have:
        headers["Range"] = f"bytes={have}-"
    req = urllib.request.Request(url, headers=headers)
    try:
        resp = urllib.request.urlopen(req, timeout=30)
    except urllib.error.HTTPError as e:
        if e.code == 416:  # nothing left to send: the size check decides
            return
        raise DownloadError(f"The download server answered {e.code} {e.reason}.") from None
    except (urllib.error.URLError, OSError) as e:
        raise DownloadError(f"Cannot reach the download server ({_first_line(e)}); retry to resume.") from None
    with resp:
        mode = "ab"
        if have and resp.status != 206:  # the server ignored the range: start over
            mode, have = "wb", 0
            meter.restart_file()
            digest.reset()
        with open(part, mode) as out:
            while True:
                if cancel.is_set():
                    raise Cancelled("Download cancelled; it resumes where it stopped.")
                try:
                    chunk = resp.read(CHUNK if meter.total > 64 * CHUNK else 64 * 1024)
                except OSError as e:
                    raise DownloadError(f"The connection broke ({_first_line(e)}); retry to resume.") from None
                if not chunk:
                    break
                out.write(chunk)
                digest.update(chunk)
                meter.add(len(chunk))


def _link(blob: Path, pointer: Path) -> None:
    pointer.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(pointer):
        if pointer.resolve() == blob.resolve():
            return
        pointer.unlink()
    try:
        os.symlink(os.path.relpath(blob, pointer.parent), pointer)
    except OSError:  # no symlinks (Windows without developer mode): a copy, as huggingface_hub does
        shutil.copyfile(blob, pointer)


def _write_ref(repo_dir: Path, revision: str, commit: str) -> None:
    if revision == commit:
        return
    ref = repo_dir / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    if not ref.is_file() or ref.read_text() != commit:
        ref.write_text(commit)


def _normalize_etag(etag: str) -> str:
    return etag.removeprefix("W/").strip('"')


def _same_host(a: str, b: str) -> bool:
    return urllib.parse.urlsplit(a).netloc == urllib.parse.urlsplit(b).netloc


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


class DownloadEta:
    """Time left of a download: the bytes still to come over the speed of the last ``window`` seconds.

    ``update`` takes each progress report; ``seconds`` answers at any time (``now`` from ``clock``): the bytes
    received between the newest report at least ``window`` old (else the oldest) and the latest one, over the time
    from that report to now, so a stalled download's estimate grows and is unknown (None) once nothing came for
    ``window`` seconds. Unknown too before ``min_span`` seconds of reports or without a rate. Bytes found in the
    cache or in a partial file do not count as speed (``Progress.fetched``)."""

    def __init__(self, window: float = 10.0, min_span: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.window = window
        self.min_span = min_span
        self.clock = clock
        self.samples: list[tuple[float, int]] = []  # (time, bytes fetched)
        self.remaining: int | None = None

    def update(self, p: Progress) -> float | None:
        now = self.clock()
        self.samples.append((now, p.fetched))
        self.remaining = max(p.total - p.done, 0)
        self._prune(now)
        return self.seconds(now)

    def _prune(self, now: float) -> None:
        # keep one report at or before the window's start: the rate spans the whole window
        while len(self.samples) > 1 and self.samples[1][0] <= now - self.window:
            self.samples.pop(0)

    def speed(self, now: float | None = None) -> float | None:
        """Bytes/s over the window, None while unknown."""
        now = self.clock() if now is None else now
        self._prune(now)
        if not self.samples:
            return None
        t0, f0 = self.samples[0]
        if now - t0 < self.min_span:
            return None
        rate = (self.samples[-1][1] - f0) / (now - t0)
        return rate if rate > 0 else None

    def seconds(self, now: float | None = None) -> float | None:
        if self.remaining is None:
            return None
        if self.remaining == 0:
            return 0.0
        rate = self.speed(now)
        return self.remaining / rate if rate else None


class _Meter:
    """Progress of the whole job with a speed over the last ~3 s (of bytes received, not those found on disk),
    reported at most 10 times a second."""

    def __init__(self, total: int, num_files: int, on_progress: ProgressFn | None):
        self.total = total
        self.num_files = num_files
        self.on_progress = on_progress
        self.done = 0
        self.fetched = 0
        self.file_start = 0
        self.filename = ""
        self.index = 0
        self.samples: list[tuple[float, int]] = [(time.monotonic(), 0)]
        self.last_emit = 0.0

    def start_file(self, filename: str, index: int) -> None:
        self.filename, self.index, self.file_start = filename, index, self.done
        self._emit(force=True)

    def restart_file(self) -> None:
        self.done = self.file_start

    def add(self, n: int, force: bool = False, fetched: bool = True) -> None:
        self.done += n
        if fetched:
            self.fetched += n
        self._emit(force)

    def finish(self) -> None:
        self._emit(force=True)

    def _emit(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.on_progress is None or (not force and now - self.last_emit < 0.1):
            return
        self.last_emit = now
        self.samples.append((now, self.fetched))
        while len(self.samples) > 2 and self.samples[0][0] < now - 3:
            self.samples.pop(0)
        t0, f0 = self.samples[0]
        speed = (self.fetched - f0) / (now - t0) if now > t0 else 0.0
        self.on_progress(Progress(self.filename, self.done, max(self.total, self.done), speed, self.index,
                                  self.num_files, self.fetched))
