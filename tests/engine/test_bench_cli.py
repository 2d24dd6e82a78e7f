"""`kestrel bench offline` end to end on a tiny GGUF: a report with both batch sizes and the engine's resolved
kernel and comm configuration, and the llama.cpp peer either measured (ratios present) or, without
llama-cpp-python, a plain-words reason instead of a crash; the bench subcommands users run."""

import importlib.util
import json

import pytest

from engine.cli import main


def test_bench_offline_writes_a_report(tmp_path, tiny_gguf):
    model = tiny_gguf("llama", "Q8_0")
    out = tmp_path / "bench.json"
    rc = main(["bench", "offline", "--model", str(model), "--prompt-len", "24", "--gen-len", "4", "--batch", "1", "2",
               "--repeats", "1", "--vs-llamacpp", "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    rows = {r["batch"]: r for r in report["results"]}
    assert set(rows) == {1, 2}
    for r in rows.values():
        assert r["kestrel"]["prefill_tok_s"] > 0 and r["kestrel"]["decode_tok_s"] > 0
    peer = rows[1]["llama.cpp"]
    if importlib.util.find_spec("llama_cpp") is None:
        assert peer.startswith("skipped: llama-cpp-python is not installed")
    else:
        assert isinstance(peer, dict), peer
        assert rows[1]["ratio_vs_llama.cpp"]["decode_tok_s"] > 0
    assert "llama.cpp" not in rows[2]  # the peer runs at batch 1 only
    # the kernel and comm configuration the engine resolved (engine/kernel_config.py, engine/parallel/comm)
    assert report["config"]["kernel"]["prefill_attention"] and "strategy" in report["config"]["comm"]


def _hide_llama_cpp(tmp_path, monkeypatch):
    """The llama.cpp child as CI sees it (no llama-cpp-python), even where it is installed: a llama_cpp package
    that fails to import, first on the children's PYTHONPATH."""
    import os

    shadow = tmp_path / "shadow" / "llama_cpp"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(shadow.parent),
                                                                    os.environ.get("PYTHONPATH")])))


def test_bench_offline_gguf_models_report(tmp_path, monkeypatch):
    """--gguf-models: the bench writes its random Llama (here at a small shape) into --workdir, and a row per model
    holds Kestrel with the file's blocks kept, Kestrel dequantized and llama.cpp, which, absent, is skipped with a
    reason instead of failing the run."""
    from engine.bench import gguf_models

    monkeypatch.setitem(gguf_models.BENCH_MODELS, "llama-1b-q4_0", gguf_models.RandomLlama(
        "Q4_0", gguf_models.small_shape()))
    _hide_llama_cpp(tmp_path, monkeypatch)
    work = tmp_path / "models"
    out = tmp_path / "bench.json"
    argv = ["bench", "offline", "--gguf-models", "llama-1b-q4_0", "--workdir", str(work), "--prompt-len", "24",
            "--gen-len", "4", "--repeats", "1", "--num-threads", "2", "--dtype", "float32", "--vs-llamacpp",
            "--json", str(out)]
    assert main(argv) == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "offline-gguf-models" and report["threads"] == 2 and report["prompt_len"] == 24
    [row] = report["models"]
    assert row["model"] == "llama-1b-q4_0" and row["quantization"] == "Q4_0"
    written = list(work.iterdir())
    assert [str(p) for p in written] == [row["path"]]
    assert row["file_mib"] == round(written[0].stat().st_size / 2**20, 1)
    assert len(row["loadavg_before"]) == 3 and len(row["loadavg_after"]) == 3
    kept, deq = row["kestrel_gguf"], row["kestrel_dequantized"]
    for r in (kept, deq):
        assert isinstance(r, dict), r
        assert r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 and r["threads"] == 2 and r["dtype"] == "float32"
        assert r["rss_after_run_mib"] >= r["rss_before_load_mib"] > 0 and r["model_rss_vs_file"] > 0
        assert r["kv_cache_mib"] > 0
        assert "error" not in r["config"]["kernel"] and "error" not in r["config"]["comm"]  # each child's own
    assert kept["float_linear_layers"] == 0 and kept["gguf_linear_mib"] > 0
    assert deq["float_linear_layers"] > 0 and deq["gguf_linear_mib"] == 0
    assert row["llama.cpp"].startswith("skipped: llama-cpp-python is not installed")
    assert "ratio_vs_llama.cpp" not in row

    # reused by the next run (not rewritten), and --model beside --gguf-models is refused
    mtime = written[0].stat().st_mtime_ns
    assert gguf_models.model_path("llama-1b-q4_0", work) == written[0] and written[0].stat().st_mtime_ns == mtime
    assert main(["bench", "offline", "--model", row["path"], "--gguf-models", "smollm2"]) == 2


def test_the_bench_subcommands_are_what_users_run():
    """`kestrel bench` offers the user benchmarks (the developer's sweeps live in benchmarks/, outside the
    package); each parses its own options."""
    from engine.cli import build_parser, cmd_bench_gpu, cmd_bench_tp

    parser = build_parser()
    bench = next(a for a in parser._subparsers._group_actions[0].choices["bench"]._actions
                 if a.dest == "bench_command")
    assert set(bench.choices) == {"offline", "http-vs-offline", "serve", "sweep", "gpu", "tp", "quant"}
    args = parser.parse_args(["bench", "tp", "--device", "cpu", "--out", "tp.json"])
    assert args.func is cmd_bench_tp and args.device == "cpu" and args.out == "tp.json"
    args = parser.parse_args(["bench", "gpu", "--skip", "hf"])
    assert args.func is cmd_bench_gpu and args.skip == ["hf"]
    with pytest.raises(SystemExit):  # a lab part is not an option of the user command
        parser.parse_args(["bench", "gpu", "--skip", "variants"])
