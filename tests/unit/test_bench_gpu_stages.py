"""`kestrel bench gpu`'s run (engine/bench/gpu.py) without a GPU: every measurement replaced by a stand-in, so the
report's shape, the resolved configuration in it, the shares of the limits and the order of the lab's hooks
(engine.bench.gpu.Stages, benchmarks/gpu_lab.py) are checked here; the measurements themselves run on a GPU
(tests/gpu, scripts/gpu_run.sh)."""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

import pytest
import torch

from engine.bench import gpu
from engine.bench import tp as bench_tp

LIMITS = {"copy_bytes_per_s": 4e12, "bf16_gemm_flop_per_s": 8e14, "bf16_gemm_sustained_flop_per_s": 7e14}


class FakeCore:
    def __init__(self):
        self.blocks = SimpleNamespace(num_blocks=100)
        self.runner = SimpleNamespace(activation_peak_bytes=2**30, graphs=None,
                                      kernel_config=SimpleNamespace(to_dict=lambda: {"prefill_attention": "auto"}))
        self.async_scheduling = True
        self.shut = False

    def shutdown(self):
        self.shut = True


@pytest.fixture
def stand_ins(monkeypatch):
    cores = []

    def make_core(ckpt, **options):
        cores.append(FakeCore())
        return cores[-1]

    monkeypatch.setattr(gpu, "measure_limits", lambda: dict(LIMITS))
    monkeypatch.setattr(gpu, "gemm_rates", lambda: dict(LIMITS))
    monkeypatch.setattr(gpu, "kestrel_ttft", lambda core, rng, vocab, lengths, repeats, chunk=None:
                        {str(n): n * 1e-5 for n in lengths})
    monkeypatch.setattr(gpu, "kestrel_prefix_hit", lambda *a: 0.05)
    monkeypatch.setattr(gpu, "kestrel_batch_prefill", lambda *a: 0.4)
    monkeypatch.setattr(gpu, "kestrel_tpot", lambda core, rng, vocab, b, prompt, steps: 0.004 + b * 1e-5)
    monkeypatch.setattr(gpu, "kestrel_throughput", lambda core, rng, vocab, n, prompt, output: {
        "seconds": 1.0, "output_tok_s": n * output, "by_step_kind": {}, "mixed_ms_min_median_max": [],
        "allocator": {}})
    monkeypatch.setattr(gpu, "_driver_version", lambda: "test")
    monkeypatch.setattr(bench_tp, "make_core", make_core)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "stand-in GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    return cores


def _args(tmp_path, *argv, skips=()):
    p = argparse.ArgumentParser()
    gpu.add_args(p, skips=skips)
    return p.parse_args(["--out", str(tmp_path / "gpu.json"), "--ttft", "1024", "8192", "--batch", "1", "8",
                         "--throughput-requests", "16", *argv])


def test_the_user_report_holds_the_engine_as_configured(tmp_path, stand_ins, capsys):
    args = _args(tmp_path, "--skip", "hf")
    report = gpu.run(args)
    assert json.loads((tmp_path / "gpu.json").read_text())["kestrel"] == json.loads(json.dumps(report["kestrel"]))
    k = report["kestrel"]
    assert set(k["ttft"]) == {"1024", "8192"} and set(k["tpot"]) == {"1", "8"}
    assert k["throughput"]["output_tok_s"] == 16 * 256
    for row in (*k["ttft"].values(), k["ttft_8192_with_4096_cached"], k["prefill_64x512"]):
        assert row["share_of_limit"] > 0 and row["limit_ms"] > 0 and row["share_of_best_gemm"] > 0
    for row in k["tpot"].values():
        assert row["share_of_limit"] > 0 and row["limit_ms"] > 0
    assert k["ttft_8192_chunked_2048"]["vs_cold"] == pytest.approx(1.0)
    assert report["config"]["kernel"] == {"prefill_attention": "auto"} and "comm" in report["config"]
    assert "after_kestrel" in report["limits"] and report["hf"] == {}
    assert stand_ins[0].shut  # the engine is shut down after its measurements
    for lab_key in ("ttft_sdpa", "decode_breakdown", "decode_variants", "prefill_ablation", "profile", "sync_loop"):
        assert lab_key not in k  # the developer's sweeps are not the user's command
    assert "TTFT 8192" in capsys.readouterr().out  # the table


def test_the_lab_stages_run_inside_the_same_run_in_order(tmp_path, stand_ins):
    calls = []

    class Recording(gpu.Stages):
        def before_engine(self, report, cfg, save):
            calls.append(("before_engine", "limits" in report, not stand_ins))

        def prefill(self, core, rng, vocab, k, prefill_row, save):
            calls.append(("prefill", "prefill_64x512" in k, "tpot" in k))
            k["ttft_sdpa"] = {"1024": prefill_row(0.02, [1024], [1024])}

        def decode(self, core, rng, vocab, k, decode_row, save):
            calls.append(("decode", "tpot" in k, "throughput" in k))

        def after_throughput(self, core, rng, vocab, k, decode_row, save):
            calls.append(("after_throughput", "throughput" in k, core.shut))

    report = gpu.run(_args(tmp_path, "--skip", "hf"), Recording())
    assert calls == [("before_engine", True, True), ("prefill", True, False), ("decode", True, False),
                     ("after_throughput", True, False)]
    assert "share_of_best_gemm" in report["kestrel"]["ttft_sdpa"]["1024"]  # a lab row gets the stricter share too


def test_the_lab_adds_its_parts_and_takes_their_skips(tmp_path, stand_ins):
    lab = pytest.importorskip("benchmarks.gpu_lab")
    args = _args(tmp_path, "--skip", "hf", "kernels", "skinny", "attention", "sdpa", "ablation", "breakdown",
                 "profile", skips=lab.LAB_PARTS)
    report = gpu.run(args, lab.LabStages(args))
    sync = report["kestrel"]["sync_loop"]  # the one lab part left on: the synchronous step loop
    assert set(sync["tpot"]) == {"1", "8"} and sync["throughput"]["output_tok_s"] == 16 * 256
    assert stand_ins[0].async_scheduling  # switched back after
    with pytest.raises(SystemExit):
        _args(tmp_path, "--skip", "variants", skips=lab.LAB_PARTS)  # deleted with its switches
