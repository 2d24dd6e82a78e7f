"""`kestrel bench offline` end to end on a tiny GGUF: a report with both batch sizes, and the llama.cpp peer
either measured (ratios present) or, without llama-cpp-python, a plain-words reason instead of a crash."""

import importlib.util
import json

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
