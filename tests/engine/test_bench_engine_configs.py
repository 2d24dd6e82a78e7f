"""`kestrel bench sweep --engine-configs` (engine/bench/sweep_configs.py): the parsing of configurations (keys,
aliases, booleans, choices) without a server, bad ones refused in words before any engine starts; then a real
sweep on the embedded SmolLM2 (CPU): two configurations x one concurrency, each against Kestrel's server started
on it, one report holding both configurations' points and what each server said it ran."""

from __future__ import annotations

import json

import pytest

from engine.bench import sweep_configs
from engine.cli import main


def test_parse_keys_aliases_and_values():
    specs = sweep_configs.parse(["prefix_caching=off", "quantization=int8,tp=1", "enable-prefix-caching=on"],
                                "dtype=float32, num_threads=2")
    assert [s.name for s in specs] == ["prefix_caching=off", "quantization=int8,tp=1", "enable-prefix-caching=on"]
    assert specs[0].overrides == {"enable_prefix_caching": False}
    assert specs[1].overrides == {"quantization": "int8", "tensor_parallel_size": 1}
    assert specs[2].overrides == {"enable_prefix_caching": True}
    cfg = specs[1].config()
    assert (cfg.dtype, cfg.num_threads, cfg.quantization, cfg.enable_prefix_caching) == ("float32", 2, "int8", True)
    # a configuration's own key wins over --engine-common's
    assert sweep_configs.parse(["dtype=bfloat16"], "dtype=float32")[0].config().dtype == "bfloat16"
    assert sweep_configs.parse(["max_model_len=none"])[0].overrides == {"max_model_len": None}


@pytest.mark.parametrize("configs, common, words", [
    (["nonsense=1"], None, "unknown engine option 'nonsense'"),
    (["prefix_caching"], None, "is not KEY=VALUE"),
    (["prefix_caching=maybe"], None, "enable_prefix_caching is on or off"),
    (["quantization=int9"], None, "quantization is one of auto, none, int8, int4, fp8, gguf"),
    (["max_num_seqs=many"], None, "max_num_seqs takes a number"),
    (["tp=1", "tp=1"], None, "each configuration once"),
    (["tp=1"], "colour=blue", "--engine-common: unknown engine option 'colour'"),
])
def test_bad_configurations_are_refused_in_words(configs, common, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        sweep_configs.parse(configs, common)


def test_cli_refuses_a_bad_key_before_starting_anything(capsys):
    rc = main(["bench", "sweep", "--engine-configs", "prefix_caching=on", "speed=fast", "--num-prompts", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown engine option 'speed'" in err and "known:" in err
    assert "starting the server" not in capsys.readouterr().out
    rc = main(["bench", "sweep", "--engine-configs", "tp=1", "--base-url", "http://127.0.0.1:9", "--num-prompts", "1"])
    assert rc == 2 and "leave out --base-url" in capsys.readouterr().err
    rc = main(["bench", "sweep", "--engine-common", "dtype=float32", "--base-url", "http://127.0.0.1:9"])
    assert rc == 2 and "goes with --engine-configs" in capsys.readouterr().err


def test_sweep_over_two_engine_configurations(tmp_path, capsys):
    out = tmp_path / "configs.json"
    rc = main(["bench", "sweep", "--engine-configs", "prefix_caching=on", "prefix_caching=off",
               "--engine-common", "dtype=float32,num_threads=2", "--model", "smol", "--num-prompts", "2",
               "--random-input-len", "12", "--random-output-len", "3", "--max-concurrency", "2", "--ignore-eos",
               "--num-warmups", "0", "--disable-tqdm", "--result-filename", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    rep = json.loads(out.read_text())
    names = ["prefix_caching=on", "prefix_caching=off"]
    assert rep["benchmark"] == "sweep" and rep["sweep"]["engine_configs"] == names
    assert [p["params"]["engine_config"] for p in rep["points"]] == names
    assert [p["engine_config"] for p in rep["points"]] == names
    for p in rep["points"]:
        m = p["metrics"]
        assert m["completed"] == 2 and m["failed"] == 0 and m["total_output_tokens"] == 2 * 3
        assert p["params"]["max_concurrency"] == 2
    recs = rep["engine_configs"]
    assert [r["name"] for r in recs] == names and not any(r.get("error") for r in recs)
    assert [r["overrides"] for r in recs] == [{"enable_prefix_caching": True}, {"enable_prefix_caching": False}]
    # each point ran against a server that was really started with its configuration
    assert [r["server"]["engine_config"]["enable_prefix_caching"] for r in recs] == [True, False]
    assert all(r["server"]["engine_config"]["num_threads"] == 2 and r["server"]["dtype"] == "float32"
               for r in recs)
    assert all(r["server"]["served_model_names"] == ["smol"] and r["startup_seconds"] > 0 for r in recs)
    assert rep["server"]["model"] == "smol" and "--engine-configs" in rep["command"]
    table = printed[printed.index("config"):]
    assert "prefix_caching=on" in table and "prefix_caching=off" in table
