"""`kestrel bench offline`: prefill and decode tokens/s of the engine, with llama.cpp (through
llama-cpp-python in a child process: same GGUF, same threads, same prompt token ids) side by side in the same run."""

from __future__ import annotations

import argparse
import json
import statistics
import time


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--gen-len", type=int, default=128)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16], help="batch sizes to run")
    p.add_argument("--repeats", type=int, default=3, help="passes per figure; the median is reported")
    p.add_argument("--vs-llamacpp", action="store_true", help="also run llama.cpp (pip install llama-cpp-python)")
    p.add_argument("--json", default=None, help="write the report here")


def _prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(100, vocab) for _ in range(length)] for _ in range(batch)]


def run_engine(llm, prompts: list[list[int]], gen_len: int) -> dict:
    """Prefill: all prompts to their first token. Decode: first token to the last, all requests."""
    from engine.sampling_params import SamplingParams

    core = llm.core
    core.blocks.reset_prefix_cache()
    params = SamplingParams(max_tokens=gen_len, temperature=0.0, ignore_eos=True)
    for i, ids in enumerate(prompts):
        core.add_request(f"bench-{time.monotonic_ns()}-{i}", None, params, prompt_token_ids=ids)
    t0 = time.perf_counter()
    first: dict[str, float] = {}
    done = 0
    while done < len(prompts):
        for d in core.step():
            first.setdefault(d.request_id, time.perf_counter())
            done += d.finished
    t_end = time.perf_counter()
    t_prefill = max(first.values()) - t0
    n = len(prompts)
    return {
        "prefill_s": t_prefill,
        "prefill_tok_s": n * len(prompts[0]) / t_prefill,
        "decode_s": t_end - max(first.values()),
        "decode_tok_s": n * (gen_len - 1) / (t_end - max(first.values())),
    }


def _median(runs: list[dict]) -> dict:
    keys = runs[0].keys()
    return {k: statistics.median(r[k] for r in runs) for k in keys} | {
        f"{k}_range": [min(r[k] for r in runs), max(r[k] for r in runs)] for k in keys if k.endswith("tok_s")}


def main(args) -> int:
    import torch

    from engine.bench.llamacpp_peer import run_in_child
    from engine.bench.report import environment
    from engine.llm import LLM

    llm = LLM.from_cli_args(args)
    ckpt = llm.core.checkpoint
    vocab = ckpt.config.vocab_size
    report = {
        "benchmark": "offline",
        "model": str(ckpt.path),
        "quantization": ckpt.quantization,
        "dtype": str(llm.core.runner.dtype).removeprefix("torch."),
        "device": str(llm.core.runner.device),
        "prompt_len": args.prompt_len,
        "gen_len": args.gen_len,
        "seed": llm.config.seed,
        "environment": environment(),
        "results": [],
    }
    threads = torch.get_num_threads()
    for batch in args.batch:
        prompts = _prompts(batch, args.prompt_len, vocab, seed=batch)
        run_engine(llm, [p[:32] for p in prompts], 4)  # warm-up
        row = {"batch": batch, "kestrel": _median([run_engine(llm, prompts, args.gen_len)
                                                   for _ in range(args.repeats)])}
        if args.vs_llamacpp and batch == 1:
            if ckpt.format != "gguf":
                row["llama.cpp"] = "skipped: llama.cpp needs a GGUF model"
            else:
                runs = run_in_child(str(ckpt.path), prompts[0], args.gen_len, threads, args.repeats)
                row["llama.cpp"] = runs if isinstance(runs, str) else _median(runs)
                if not isinstance(runs, str):
                    row["ratio_vs_llama.cpp"] = {
                        k: row["kestrel"][k] / row["llama.cpp"][k] for k in ("prefill_tok_s", "decode_tok_s")}
        report["results"].append(row)
        _print_row(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"report written to {args.json}")
    return 0


def _print_row(row: dict) -> None:
    k = row["kestrel"]
    line = (f"batch {row['batch']:>3}: kestrel prefill {k['prefill_tok_s']:8.1f} tok/s, "
            f"decode {k['decode_tok_s']:7.1f} tok/s")
    lc = row.get("llama.cpp")
    if isinstance(lc, dict):
        r = row["ratio_vs_llama.cpp"]
        line += (f" | llama.cpp prefill {lc['prefill_tok_s']:8.1f}, decode {lc['decode_tok_s']:7.1f}"
                 f" | ratio prefill {r['prefill_tok_s']:.2f}x, decode {r['decode_tok_s']:.2f}x")
    elif lc:
        line += f" | llama.cpp {lc}"
    print(line, flush=True)
