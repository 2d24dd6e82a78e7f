"""Downloads on a thread of their own, one after another (app.downloader does the work). Cancel is a flag the
download checks between chunks; a cancelled or failed download keeps its partial file, so starting it
again resumes it."""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from app.downloader import Cancelled, DownloadError, HubFile, download_files
from app.workers import stop_thread, thread_for

log = logging.getLogger(__name__)
_ids = itertools.count(1)


@dataclass
class DownloadJob:
    repo_id: str
    files: list[HubFile]
    label: str  # what the user picked, e.g. "Q4_K_M"
    revision: str = "main"
    id: int = field(default_factory=lambda: next(_ids))
    cancel: threading.Event = field(default_factory=threading.Event)

    @property
    def total(self) -> int:
        return sum(f.size or 0 for f in self.files)


class DownloadWorker(QObject):
    queued = Signal(object)  # DownloadJob
    progress = Signal(int, object)  # job id, app.downloader.Progress
    finished = Signal(int, str)  # job id, snapshot folder
    failed = Signal(int, str)  # job id, why
    cancelled = Signal(int)
    _run = Signal(object)

    def __init__(self, cache_dir: Callable[[], Path], token: Callable[[], str | None]):
        super().__init__()
        self._cache_dir = cache_dir
        self._token = token
        self.jobs: dict[int, DownloadJob] = {}
        self._thread = thread_for(self, "downloads")
        self._run.connect(self._download)
        self._thread.start()

    # GUI side
    def enqueue(self, job: DownloadJob) -> DownloadJob:
        self.jobs[job.id] = job
        self.queued.emit(job)
        self._run.emit(job)
        return job

    def cancel(self, job_id: int) -> None:
        job = self.jobs.get(job_id)
        if job is not None:
            job.cancel.set()

    def stop(self) -> None:
        for job in self.jobs.values():
            job.cancel.set()
        stop_thread(self._thread, 30000)

    # worker side
    @Slot(object)
    def _download(self, job: DownloadJob) -> None:
        if job.cancel.is_set():
            self.cancelled.emit(job.id)
            return
        token = self._token()
        try:
            snapshot = download_files(job.repo_id, job.files, self._cache_dir(), revision=job.revision, token=token,
                                      cancel=job.cancel, on_progress=lambda p: self.progress.emit(job.id, p))
        except Cancelled:
            self.cancelled.emit(job.id)
        except DownloadError as e:
            self.failed.emit(job.id, str(e))
        except Exception as e:
            log.exception("download failed")
            self.failed.emit(job.id, f"{type(e).__name__}: {e}")
        else:
            self.finished.emit(job.id, str(snapshot))
