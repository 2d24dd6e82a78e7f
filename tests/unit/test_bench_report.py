"""Every benchmark report records the kernel and comm configuration its engine runs with
(engine/bench/report.py resolved_config): a live core's own, else what an EngineConfig resolves to here."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from engine.bench.report import resolved_config
from engine.config import EngineConfig
from engine.kernel_config import KernelConfig
from engine.parallel.comm.config import CommConfig


def test_from_an_engine_config_every_field_is_recorded():
    out = resolved_config(engine_config=EngineConfig(device="cpu"))
    assert set(out) == {"kernel", "comm"}
    assert set(out["kernel"]) == {f.name for f in dataclasses.fields(KernelConfig)}
    assert set(out["comm"]) == {f.name for f in dataclasses.fields(CommConfig)}


def test_a_live_core_reports_its_own_configuration():
    kc = KernelConfig(prefill_attention="sdpa")
    cc = CommConfig()
    core = SimpleNamespace(runner=SimpleNamespace(kernel_config=kc), executor=SimpleNamespace(comm_config=cc),
                           config=EngineConfig(device="cpu"))
    out = resolved_config(core)
    assert out == {"kernel": kc.to_dict(), "comm": cc.to_dict()}


def test_a_failure_is_said_in_the_report_not_raised():
    broken = SimpleNamespace(runner=SimpleNamespace(kernel_config=SimpleNamespace()),  # no to_dict
                             executor=SimpleNamespace(comm_config=SimpleNamespace()))
    out = resolved_config(broken)
    assert "error" in out["kernel"] and "error" in out["comm"]
