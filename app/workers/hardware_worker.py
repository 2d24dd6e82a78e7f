"""Samples the hardware (app.hardware) once a second on its own thread: CPU / RAM, and per GPU memory,
utilization, temperature and PCIe TX/RX (NVML's counters take ~20 ms each)."""

from __future__ import annotations

from PySide6.QtCore import QObject, QTimer, Signal, Slot

from app.workers import stop_thread, thread_for


class HardwareWorker(QObject):
    sampled = Signal(object)  # app.hardware.HardwareSnapshot

    def __init__(self, interval_ms: int = 1000):
        super().__init__()
        self.interval_ms = interval_ms
        self.probe = None
        self._timer: QTimer | None = None
        self._thread = thread_for(self, "hardware")
        self._thread.started.connect(self._begin)
        self._thread.finished.connect(self._end)
        self._thread.start()

    @Slot()
    def _begin(self) -> None:
        from app.hardware import HardwareProbe

        self.probe = HardwareProbe()
        self._timer = QTimer()
        self._timer.setInterval(self.interval_ms)
        self._timer.timeout.connect(self._sample)
        self._timer.start()
        self._sample()

    @Slot()
    def _sample(self) -> None:
        if self.probe is not None:
            self.sampled.emit(self.probe.snapshot())

    @Slot()
    def _end(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None  # released on this thread, which owns it
        if self.probe is not None:
            self.probe.close()

    def stop(self) -> None:
        stop_thread(self._thread)
