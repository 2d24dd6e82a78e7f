"""`kestrel bench offline --speculative`: both arms in one run on one loaded model, a row per prompt kind with
acceptance, tokens per verify pass and whether the arms emitted the same tokens (a tiny float32 model: they must)."""

from __future__ import annotations

import json

from engine.cli import main

NGRAM = '{"method": "ngram", "num_speculative_tokens": 3}'


def test_bench_offline_speculative_compares_both_arms(tmp_path, tiny_model_dir):
    out = tmp_path / "spec.json"
    rc = main(["bench", "offline", "--model", str(tiny_model_dir("llama")), "--dtype", "float32", "--speculative",
               NGRAM, "--gen-len", "12", "--repeats", "1", "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["speculative"]["config"] == NGRAM
    rows = {r["prompt"]: r for r in report["speculative"]["results"]}
    assert set(rows) == {"code", "chat"}
    for r in rows.values():
        assert r["plain_decode_tok_s"] > 0 and r["speculative_decode_tok_s"] > 0 and r["same_tokens"]
        assert 0 <= r["acceptance"] <= 1 and r["tokens_per_step"] >= 1
    assert 20 <= rows["code"]["code_lines"] <= 300  # cut to the tiny model's context
