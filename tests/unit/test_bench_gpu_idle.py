"""The GPU lab's idle accounting (benchmarks/gpu_profile.py gpu_idle) on hand-made profiler events: kernels'
intervals merged into busy time, the gaps between them with the host operations that began inside each."""

from __future__ import annotations

from types import SimpleNamespace

from torch.autograd import DeviceType

from benchmarks.gpu_profile import gpu_idle


def _ev(name, start, end, device=DeviceType.CUDA):
    return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end))


def test_busy_time_and_gaps():
    events = [_ev("k1", 100, 200), _ev("k2", 150, 300),  # overlapping: one busy interval 100..300
              _ev("launch", 310, 320, DeviceType.CPU), _ev("sync", 330, 900, DeviceType.CPU),
              _ev("k3", 1000, 1100), _ev("k4", 1120, 1200)]
    out = gpu_idle(SimpleNamespace(events=lambda: events), wall_start_us=40)
    assert out["kernels_busy_ms"] == (200 + 100 + 80) / 1e3
    assert out["first_kernel_ms"] == 60 / 1e3
    assert out["span_ms"] == 1100 / 1e3
    assert out["gaps_over_50us_ms"] == 700 / 1e3  # the 20 us gap is too short to count
    longest = out["longest_gaps"][0]
    assert longest["gap_ms"] == 0.7 and longest["at_ms"] == 0.2 and longest["host_ops"] == ["launch", "sync"]
    assert [g["gap_ms"] for g in out["longest_gaps"]] == [0.7, 0.02]


def test_no_kernels():
    assert gpu_idle(SimpleNamespace(events=lambda: [_ev("cpu only", 0, 5, DeviceType.CPU)])) == {}
