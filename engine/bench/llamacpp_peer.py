"""llama.cpp (through llama-cpp-python) as the peer of `kestrel bench offline`, run in a child process of its own:
its thread pool does not share a process with the engine's, and a crash inside llama.cpp (some builds die on CPUs
that advertise AMX inside VMs) becomes a line in the report instead of the end of the benchmark.

Child protocol: a JSON request on stdin ({model, prompt, gen_len, threads, repeats}), on stdout a JSON object: the
runs, the resident set after load and after the runs (llama.cpp maps the file: its pages count once touched), the
peak, the context (n_ctx) and its KV cache bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def resident_set() -> dict:
    """This process's resident set now and at its peak (bytes), from /proc/self/status (None elsewhere)."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return {"rss": out.get("VmRSS"), "rss_peak": out.get("VmHWM")}


def measure(model_path: str, prompt: list[int], gen_len: int, threads: int, repeats: int,
            warmup: bool = False) -> dict:
    """Greedy generation as the engine runs it: prefill the prompt, then gen_len - 1 single-token decodes
    (``warmup``: one untimed pass of the whole prompt and 3 decodes first, as the engine's bench child does)."""
    import numpy as np
    from llama_cpp import Llama

    before = resident_set()
    n_ctx = len(prompt) + gen_len + 8
    llm = Llama(model_path=model_path, n_ctx=n_ctx, n_batch=512, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    loaded = resident_set()
    vocab = llm.n_vocab()

    def last_logits():  # llama.cpp keeps the last position's logits after a decode
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))

    if warmup:
        llm.reset()
        llm.eval(prompt)
        for _ in range(3):
            llm.eval([int(np.argmax(last_logits()))])
    runs = []
    for _ in range(repeats):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        tok = int(np.argmax(last_logits()))
        for _ in range(gen_len - 1):
            llm.eval([tok])
            tok = int(np.argmax(last_logits()))
        t2 = time.perf_counter()
        runs.append({"prefill_s": t1 - t0, "prefill_tok_s": len(prompt) / (t1 - t0), "decode_s": t2 - t1,
                     "decode_tok_s": (gen_len - 1) / (t2 - t1)})
    after = resident_set()
    md = llm.metadata
    arch = md.get("general.architecture", "llama")
    try:  # f16 K and V (llama.cpp's default cache type) of every layer for n_ctx tokens
        layers = int(md[f"{arch}.block_count"])
        heads = int(md[f"{arch}.attention.head_count"])
        kv_heads = int(md.get(f"{arch}.attention.head_count_kv", heads))
        head_dim = int(md.get(f"{arch}.attention.key_length", int(md[f"{arch}.embedding_length"]) // heads))
        kv_bytes = 2 * layers * n_ctx * kv_heads * head_dim * 2
    except (KeyError, ValueError):
        kv_bytes = None
    return {"runs": runs, "rss_before_load": before["rss"], "rss_after_load": loaded["rss"], "rss_after_run": after["rss"],
            "rss_peak": after["rss_peak"], "n_ctx": n_ctx, "kv_cache_bytes": kv_bytes, "threads": threads}


def run_in_child(model_path: str, prompt: list[int], gen_len: int, threads: int, repeats: int,
                 details: bool = False, warmup: bool = False) -> list[dict] | dict | str:
    """The runs (``details``: measure's whole answer, memory included), or a plain-words reason when llama.cpp is
    missing or failed."""
    request = json.dumps({"model": model_path, "prompt": prompt, "gen_len": gen_len, "threads": threads,
                          "repeats": repeats, "warmup": warmup})
    import engine

    env = dict(os.environ)
    if engine.OMP_WAIT_POLICY_BY_ENGINE:  # the engine's OpenMP policy (engine/__init__.py), not the user's
        env.pop("OMP_WAIT_POLICY", None)  # (the child's engine import sets it again: main() drops it there)
    proc = subprocess.run([sys.executable, "-m", "engine.bench.llamacpp_peer"], input=request, text=True,
                          capture_output=True, check=False, env=env)
    if proc.returncode == 3:
        return "skipped: llama-cpp-python is not installed (pip install 'kestrel[bench]')"
    if proc.returncode != 0:
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
        tail = proc.stderr.strip().splitlines()[-1:] or [""]
        return f"failed: llama.cpp stopped with {how} {tail[0]}".strip() + " (README: building llama-cpp-python)"
    answer = json.loads(proc.stdout)
    return answer if details else answer["runs"]


def main() -> int:
    import engine

    if engine.OMP_WAIT_POLICY_BY_ENGINE:  # set by this process's engine import, not the user: llama.cpp (and its
        os.environ.pop("OMP_WAIT_POLICY", None)  # OpenMP, loaded below) runs with its own defaults, as before
    req = json.loads(sys.stdin.read())
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return 3
    result = measure(req["model"], req["prompt"], req["gen_len"], req["threads"], req["repeats"],
                     req.get("warmup", False))
    sys.stdout.write(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
