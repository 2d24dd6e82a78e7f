"""The Models panel's Downloads tab: each download with its progress, speed and state; cancel, resume (from
the partial file) and retry."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from PySide6.QtWidgets import QHeaderView, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app import fit
from app.context import AppContext
from app.downloader import Progress
from app.widgets.tables import GREEN, GREY, RED, cell, table
from app.workers.download_worker import DownloadJob

StatusFn = Callable[..., None]  # (text, error=False)
PROGRESS, SPEED, STATE, ACTION = 2, 3, 4, 5
ACTIONS = ("Cancel", "Resume", "Retry")
ACTION_MARGIN = 6  # pixels around an action button in its cell


class DownloadsTab(QWidget):
    def __init__(self, ctx: AppContext, status: StatusFn):
        super().__init__()
        self.ctx = ctx
        self.status = status
        self.rows: dict[int, int] = {}  # job id -> table row
        lay = QVBoxLayout(self)
        self.table = table(["Model", "Variant", "Progress", "Speed", "Status", ""], stretch=STATE)
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
        r = self.rows.pop(job.id)
        self.table.removeRow(r)
        self.rows = {k: (v - 1 if v > r else v) for k, v in self.rows.items()}
        self.ctx.downloads.enqueue(new)
        return new

    def state_text(self, job_id: int) -> str:
        r = self.rows.get(job_id)
        return self.table.item(r, STATE).text() if r is not None else ""

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
        self.table.item(r, SPEED).setText(f"{fit.human_bytes(p.speed)}/s" if p.speed else "")
        self.table.item(r, STATE).setText(f"Downloading {p.filename} ({p.file_index + 1}/{p.num_files})")

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
        item = cell(text, text, color)
        self.table.setItem(row, STATE, item)
        self.table.item(row, SPEED).setText("")
