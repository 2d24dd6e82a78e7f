"""llama.cpp (through llama-cpp-python) as the peer of `kestrel bench offline`, run in a child process of its own:
its thread pool does not share a process with the engine's, and a crash inside llama.cpp (some builds die on CPUs
that advertise AMX inside VMs) becomes a line in the report instead of the end of the benchmark.

Child protocol: a JSON request on stdin ({model, prompt, gen_len, threads, repeats}), a JSON list of runs on stdout."""

from __future__ import annotations

import json
import subprocess
import sys
import time


def measure(model_path: str, prompt: list[int], gen_len: int, threads: int, repeats: int) -> list[dict]:
    """Greedy generation as the engine runs it: prefill the prompt, then gen_len - 1 single-token decodes."""
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=model_path, n_ctx=len(prompt) + gen_len + 8, n_batch=512, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    vocab = llm.n_vocab()

    def last_logits():  # llama.cpp keeps the last position's logits after a decode
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))

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
    return runs


def run_in_child(model_path: str, prompt: list[int], gen_len: int, threads: int, repeats: int) -> list[dict] | str:
    """The runs, or a plain-words reason when llama.cpp is missing or failed."""
    request = json.dumps({"model": model_path, "prompt": prompt, "gen_len": gen_len, "threads": threads,
                          "repeats": repeats})
    proc = subprocess.run([sys.executable, "-m", "engine.bench.llamacpp_peer"], input=request, text=True,
                          capture_output=True)
    if proc.returncode == 3:
        return "skipped: llama-cpp-python is not installed (pip install 'kestrel[bench]')"
    if proc.returncode != 0:
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
        tail = proc.stderr.strip().splitlines()[-1:] or [""]
        return f"failed: llama.cpp stopped with {how} {tail[0]}".strip() + " (README: building llama-cpp-python)"
    return json.loads(proc.stdout)


def main() -> int:
    req = json.loads(sys.stdin.read())
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return 3
    runs = measure(req["model"], req["prompt"], req["gen_len"], req["threads"], req["repeats"])
    sys.stdout.write(json.dumps(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
