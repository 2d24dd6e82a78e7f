"""Download time left: remaining bytes over the speed of a sliding window (app.downloader.DownloadEta), fed
injected progress on a fake clock; "—" while unknown (too early, no rate, stalled); bytes found on disk do not
count as speed; and the Downloads tab shows it next to the speed."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QObject, Signal

from app.downloader import DownloadEta, HubFile, Progress, _Meter
from app.panels.models_downloads import SPEED, UNKNOWN, DownloadsTab, format_eta
from app.workers.download_worker import DownloadJob

MB = 1_000_000


class FakeClock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _p(done: int, total: int, fetched: int | None = None, speed: float = 0.0) -> Progress:
    return Progress("model.safetensors", done, total, speed, 0, 1, done if fetched is None else fetched)


def test_eta_is_remaining_bytes_over_the_windows_speed():
    clock = FakeClock()
    eta = DownloadEta(window=10.0, clock=clock)
    assert eta.seconds() is None  # nothing reported yet
    assert eta.update(_p(0, 100 * MB)) is None  # one report: no rate
    clock.t += 0.5
    assert eta.update(_p(MB, 100 * MB)) is None  # under min_span: still unknown
    for _ in range(19):  # 2 MB/s for 9.5 s more
        clock.t += 0.5
        eta.update(_p(eta.samples[-1][1] + MB, 100 * MB))
    assert eta.remaining == 80 * MB
    assert eta.speed() == pytest.approx(2 * MB)
    assert eta.seconds() == pytest.approx(40.0)


def test_the_window_slides_to_the_recent_speed():
    clock = FakeClock()
    eta = DownloadEta(window=10.0, clock=clock)
    fetched = 0
    for _ in range(30):  # 30 s at 1 MB/s
        eta.update(_p(fetched, 1000 * MB))
        clock.t += 1.0
        fetched += MB
    for _ in range(20):  # then 20 s at 5 MB/s: the last 10 s are all fast
        eta.update(_p(fetched, 1000 * MB))
        clock.t += 1.0
        fetched += 5 * MB
    clock.t -= 1.0  # now = the last report
    last = eta.samples[-1][1]
    assert eta.speed() == pytest.approx(5 * MB)
    assert eta.seconds() == pytest.approx((1000 * MB - last) / (5 * MB))
    assert all(t >= clock.t - 10.0 for t, _ in eta.samples[1:])  # bounded: only the window (and its anchor)


def test_a_stalled_download_turns_unknown():
    clock = FakeClock()
    eta = DownloadEta(window=10.0, clock=clock)
    for k in range(11):
        eta.update(_p(k * MB, 100 * MB))
        clock.t += 1.0
    clock.t -= 1.0
    assert eta.seconds() == pytest.approx(90.0)  # 1 MB/s, 90 MB to go
    clock.t += 5.0  # nothing for 5 s: the rate over the window falls, the estimate grows
    assert eta.seconds() > 90.0
    clock.t += 6.0  # nothing for 11 s (> the window): unknown
    assert eta.seconds() is None
    eta.update(_p(11 * MB, 100 * MB))  # it resumes: the window still holds the stall (1 MB in 11 s)
    assert eta.seconds() == pytest.approx(89 * MB / (MB / 11.0))
    for k in range(1, 11):  # then 10 s at 2 MB/s: the stall has left the window
        clock.t += 1.0
        eta.update(_p((11 + 2 * k) * MB, 100 * MB))
    assert eta.speed() == pytest.approx(2 * MB) and eta.seconds() == pytest.approx(69 / 2)


def test_bytes_on_disk_are_not_speed():
    clock = FakeClock()
    eta = DownloadEta(window=10.0, clock=clock)
    eta.update(_p(0, 100 * MB, fetched=0))
    clock.t += 0.1
    eta.update(_p(60 * MB, 100 * MB, fetched=0))  # a cached file and a partial one: at once, not downloaded
    clock.t += 2.0
    eta.update(_p(62 * MB, 100 * MB, fetched=2 * MB))  # then 2 MB in 2 s
    assert eta.speed() == pytest.approx(2 * MB / 2.1)
    assert eta.seconds() == pytest.approx(38 * MB / (2 * MB / 2.1))
    eta.update(_p(100 * MB, 100 * MB, fetched=40 * MB))
    assert eta.seconds() == 0.0  # nothing left


def test_meter_counts_fetched_bytes_apart():
    seen: list[Progress] = []
    m = _Meter(300, 2, seen.append)
    m.start_file("a", 0)
    m.add(100, force=True, fetched=False)  # already in the cache
    m.add(50, force=True)  # received
    assert seen[-1].done == 150 and seen[-1].fetched == 50


def test_format_eta():
    assert format_eta(None) == UNKNOWN == "—"
    assert format_eta(float("inf")) == "—"
    assert format_eta(0) == "0 s" and format_eta(41.2) == "42 s"
    assert format_eta(185) == "3 min 05 s" and format_eta(3600 + 12 * 60 + 5) == "1 h 12 min"


class FakeDownloads(QObject):
    queued = Signal(object)
    progress = Signal(int, object)
    finished = Signal(int, str)
    failed = Signal(int, str)
    cancelled = Signal(int)

    def __init__(self):
        super().__init__()
        self.jobs: dict[int, DownloadJob] = {}


class FakeLibrary:
    def refresh(self) -> None:
        pass


class FakeCtx:
    def __init__(self):
        self.downloads = FakeDownloads()
        self.library = FakeLibrary()


def test_downloads_tab_shows_the_time_left(qtbot):
    clock = FakeClock()
    ctx = FakeCtx()
    tab = DownloadsTab(ctx, lambda *a, **k: None, clock=clock)
    qtbot.addWidget(tab)
    job = DownloadJob("org/model", [HubFile("model.safetensors", 50 * MB)], "safetensors")
    ctx.downloads.jobs[job.id] = job
    ctx.downloads.queued.emit(job)
    ctx.downloads.progress.emit(job.id, _p(0, 50 * MB))
    assert tab.eta_text(job.id) == "—" and tab.speed_text(job.id) == "—"
    for k in range(1, 11):  # 1 MB/s for 10 s
        clock.t += 1.0
        ctx.downloads.progress.emit(job.id, _p(k * MB, 50 * MB, speed=1.0 * MB))
    assert tab.eta_text(job.id) == "40 s"
    assert tab.speed_text(job.id) == "1.0 MB/s · 40 s left"
    assert tab._eta_timer.isActive()
    clock.t += 4.0  # nothing for 4 s: the speed reads stalled, the estimate grows (the refresh, every second)
    tab.refresh_etas()
    assert tab.speed_text(job.id) == "stalled · 1 min 07 s left"  # 6 MB in the 10 s since t=104: 40 MB at 0.6 MB/s
    clock.t += 16.0  # nothing for 20 s: unknown
    tab.refresh_etas()
    assert tab.eta_text(job.id) == "—" and tab.speed_text(job.id) == "stalled · —"
    ctx.downloads.finished.emit(job.id, "/tmp/snapshot")
    assert tab.eta_text(job.id) == "" and tab.table.item(0, SPEED).text() == ""
    assert not tab._eta_timer.isActive()
