"""The Models panel's Downloads tab: each download with its progress, speed, time left and state; cancel,
resume (from the partial file) and retry. The time left is the bytes still to come over the speed of the
last ETA_WINDOW seconds (app.downloader.DownloadEta), "—" while unknown; it is recomputed every second, so a
stalled download's estimate grows and turns unknown instead of freezing."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import partial

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QHeaderView, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app import fit
from app.context import AppContext
from app.downloader import DownloadEta, Progress
from app.widgets.tables import GREEN, GREY, RED, cell, table
from app.workers.download_worker import DownloadJob

StatusFn = Callable[..., None]  # (text, error=False)
PROGRESS, SPEED, STATE, ACTION = 2, 3, 4, 5
ACTIONS = ("Cancel", "Resume", "Retry")
ACTION_MARGIN = 6  # pixels around an action button in its cell
ETA_WINDOW = 10.0  # seconds of recent speed the time left is computed from
UNKNOWN = "—"
STALLED_AFTER = 3.0  # seconds without a progress report before the speed reads "stalled"


def format_eta(seconds: float | None) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 12 min``; "—" when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return UNKNOWN
    s = max(0, math.ceil(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class DownloadsTab(QWidget):
    def __init__(self, ctx: AppContext, status: StatusFn, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.ctx = ctx
        self.status = status
        self.clock = clock  # tests inject a fake one
        self.rows: dict[int, int] = {}  # job id -> table row
        self.etas: dict[int, DownloadEta] = {}  # job id -> its time-left estimate, while it downloads
        self.speeds: dict[int, float] = {}  # job id -> the last reported speed
        self._eta_timer = QTimer(self)
        self._eta_timer.setInterval(1000)
        self._eta_timer.timeout.connect(self.refresh_etas)
        lay = QVBoxLayout(self)
        self.table = table(["Model", "Variant", "Progress", "Speed · time left", "Status", ""], stretch=STATE)
        self.table.horizontalHeaderItem(SPEED).setToolTip(
            f"Time left: the bytes still to come over the speed of the last {ETA_WINDOW:.0f} s")
        self.table.horizontalHeader().setSectionResizeMode(PROGRESS, QHeaderView.Fixed)
        self.table.setColumnWidth(PROGRESS, 220)
        # the action buttons are cell widgets, which ResizeToContents does not measure: size the column and the
        # rows for the widest and tallest of them, or "Resume" is clipped
        hints = [self._button(text).sizeHint() for text in ACTIONS]
        self.table.horizontalHeader().setSectionResizeMode(ACTION, QHeaderView.Fixed)
        self.table.setColumnWidth(ACTION, max(h.width() for h in hints) + 2 * ACTION_MARGIN)
        rows = self.table.verticalHeader()
        rows.setDefaultSectionSize(max(rows.defaultSectionSize(), max(h.height() for h in hints) + ACTION_MARGIN))
        lay.addWidget(self.table, 1)
        note = QLabel("Downloads continue in the background. A cancelled download keeps what it has: Resume "
                      "continues from there. Each file is checked against the size and hash the Hub publishes.")
        note.setObjectName("hint")
        note.setWordWrap(True)
        lay.addWidget(note)
        d = ctx.downloads
        d.queued.connect(self._on_queued)
        d.progress.connect(self._on_progress)
        d.finished.connect(self._on_finished)
        d.failed.connect(self._on_failed)
        d.cancelled.connect(self._on_cancelled)

    def cancel(self, job_id: int) -> None:
        self.ctx.downloads.cancel(job_id)  # sets the job's flag; the download thread sees it between chunks

    def resume(self, job: DownloadJob) -> DownloadJob:
        """Start the job again: files already there are kept, a partial file continues where it stopped."""
        new = DownloadJob(repo_id=job.repo_id, files=job.files, label=job.label, revision=job.revision)
        self._done(job.id)
        r = self.rows.pop(job.id)
        self.table.removeRow(r)
        self.rows = {k: (v - 1 if v > r else v) for k, v in self.rows.items()}
        self.ctx.downloads.enqueue(new)
        return new

    def state_text(self, job_id: int) -> str:
        r = self.rows.get(job_id)
        return self.table.item(r, STATE).text() if r is not None else ""

    def eta_text(self, job_id: int) -> str:
        """The job's time left as shown ("—" while unknown, "" when it is not downloading)."""
        eta = self.etas.get(job_id)
        return format_eta(eta.seconds(self.clock())) if eta is not None else ""

    def speed_text(self, job_id: int) -> str:
        r = self.rows.get(job_id)
        return self.table.item(r, SPEED).text() if r is not None else ""

    def _on_queued(self, job: DownloadJob) -> None:
        r = self.table.rowCount()
        self.table.insertRow(r)
        self.rows[job.id] = r
        self.table.setItem(r, 0, cell(job.repo_id))
        self.table.setItem(r, 1, cell(job.label))
        bar = QProgressBar()
        bar.setRange(0, 1000)
        bar.setFormat(f"0 / {fit.human_bytes(job.total)}")
        self.table.setCellWidget(r, PROGRESS, bar)
        self.table.setItem(r, SPEED, cell(""))
        self.table.setItem(r, STATE, cell("Queued", color=GREY))
        self._action(job, "Cancel", partial(self.cancel, job.id))

    def _button(self, text: str) -> QPushButton:
        b = QPushButton(text)
        b.ensurePolished()  # the app's style sheet (padding, min-height) counts in its size hint
        return b

    def _action(self, job: DownloadJob, text: str, slot) -> None:
        b = self._button(text)
        b.clicked.connect(slot)
        self.table.setCellWidget(self.rows[job.id], ACTION, b)

    def _on_progress(self, job_id: int, p: Progress) -> None:
        r = self.rows.get(job_id)
        if r is None:
            return
        bar = self.table.cellWidget(r, PROGRESS)
        bar.setValue(int(1000 * p.done / max(p.total, 1)))
        bar.setFormat(f"{fit.human_bytes(p.done)} / {fit.human_bytes(p.total)}")
        eta = self.etas.get(job_id)
        if eta is None:
            eta = self.etas[job_id] = DownloadEta(ETA_WINDOW, clock=self.clock)
            self._eta_timer.start()
        eta.update(p)
        self.speeds[job_id] = p.speed
        self._show_speed(job_id)
        self.table.item(r, STATE).setText(f"Downloading {p.filename} ({p.file_index + 1}/{p.num_files})")

    def refresh_etas(self) -> None:
        """Every second while something downloads: the estimates follow the clock between reports."""
        for job_id in list(self.etas):
            self._show_speed(job_id)

    def _show_speed(self, job_id: int) -> None:
        r = self.rows.get(job_id)
        eta = self.etas.get(job_id)
        if r is None or eta is None:
            return
        now = self.clock()
        speed = self.speeds.get(job_id) or 0.0
        left = format_eta(eta.seconds(now))
        if eta.samples and now - eta.samples[-1][0] > STALLED_AFTER:
            text = f"stalled · {left}"  # the last reported speed is history by now
        else:
            text = f"{fit.human_bytes(speed)}/s · {left}" if speed else left
        self.table.item(r, SPEED).setText(text + (" left" if left != UNKNOWN else ""))

    def _done(self, job_id: int) -> None:
        self.etas.pop(job_id, None)
        self.speeds.pop(job_id, None)
        if not self.etas:
            self._eta_timer.stop()

    def _on_finished(self, job_id: int, _snapshot: str) -> None:
        job = self.ctx.downloads.jobs[job_id]
        r = self.rows[job_id]
        bar = self.table.cellWidget(r, PROGRESS)
        bar.setValue(1000)
        bar.setFormat(fit.human_bytes(job.total))
        self._set_state(r, "Done: sizes and hashes verified", GREEN)
        self.table.setCellWidget(r, ACTION, None)
        self.status(f"Downloaded {job.repo_id} ({job.label}). It is in the library.")
        self.ctx.library.refresh()

    def _on_failed(self, job_id: int, message: str) -> None:
        job = self.ctx.downloads.jobs[job_id]
        self._set_state(self.rows[job_id], message, RED)
        self._action(job, "Retry", partial(self.resume, job))

    def _on_cancelled(self, job_id: int) -> None:
        job = self.ctx.downloads.jobs[job_id]
        self._set_state(self.rows[job_id], "Cancelled: Resume continues where it stopped", GREY)
        self._action(job, "Resume", partial(self.resume, job))

    def _set_state(self, row: int, text: str, color) -> None:
        job_id = next((j for j, r in self.rows.items() if r == row), None)
        if job_id is not None:
            self._done(job_id)
        item = cell(text, text, color)
        self.table.setItem(row, STATE, item)
        self.table.item(row, SPEED).setText("")
