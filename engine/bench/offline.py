"""`kestrel bench offline`: prefill and decode tokens/s of the engine, with llama.cpp (through
llama-cpp-python in a child process: same GGUF, same threads, same prompt token ids) side by side in the same run.

``--gguf-models`` runs, instead of the one ``--model``, a row per GGUF model (the embedded SmolLM2 Q4_1 and ~1B
random-weight Llama-shape files in Q4_0 / Q8_0 that the bench writes itself, engine/bench/gguf_models.py; or
.gguf paths), each engine in a child process of its own, back to back: Kestrel with ``--quantization gguf``
(the file's blocks kept), Kestrel with the dequantized default, and llama.cpp; same threads, same prompt ids, on
the CPU: prefill tok/s (the whole prompt, batch 1), decode tok/s (batch 1), and the resident set after load and
after the runs beside the file's size. A child per engine keeps one engine's memory, threads and allocator state
out of the next one's figures."""

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
    p.add_argument("--gguf-models", nargs="*", default=None, metavar="NAME",
                   help="instead of --model: per GGUF model, Kestrel with --quantization gguf, Kestrel dequantized "
                        "and (with --vs-llamacpp) llama.cpp, on the CPU at batch 1, with resident memory against the "
                        "file size. Names: smollm2 (embedded Q4_1), llama-1b-q4_0, llama-1b-q8_0, qwen3moe-q4_k, "
                        "qwen3moe-q8_0 (random weights, written once into --workdir; the last two a Qwen3-MoE shape "
                        "of 1.4B parameters, 0.33B active), or .gguf paths; no names: the first three")
    p.add_argument("--skip-dequantized", action="store_true",
                   help="with --gguf-models: leave out the dequantized Kestrel row (the file's blocks kept only)")
    p.add_argument("--speculative", default=None, metavar="JSON",
                   help="compare decoding with and without speculative decoding (--speculative-config's JSON) in one "
                        "run, the arms interleaved: a code-edit prompt (repeat a 300-line file) and a chat prompt, "
                        "greedy at batch 1; --gen-len tokens, --repeats passes per arm (engine/bench/speculative.py)")
    p.add_argument("--workdir", default=None,
                   help="where --gguf-models writes and then reuses its random models (default: the user cache, "
                        "e.g. ~/.cache/kestrel/bench-models)")


def random_prompts(batch: int, length: int, vocab: int, seed: int) -> list[list[int]]:
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


def _write_json(report: dict, path: str | None) -> None:
    """Write ``report`` to ``path`` (``--json``), when one is given."""
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=2)
        print(f"report written to {path}")


def main(args) -> int:
    if args.gguf_models is not None:
        return main_gguf_models(args)
    import torch

    from engine.bench.llamacpp_peer import run_in_child
    from engine.bench.report import environment, resolved_config
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
        "config": resolved_config(llm.core),  # the kernel and comm configuration the engine resolved
        "results": [],
    }
    threads = torch.get_num_threads()
    if args.speculative:
        from engine.bench.speculative import run as run_speculative

        report["speculative"] = {"config": args.speculative, "threads": threads,
                                 "results": run_speculative(llm, args.speculative, args.gen_len, args.repeats)}
        _write_json(report, args.json)
        return 0
    for batch in args.batch:
        prompts = random_prompts(batch, args.prompt_len, vocab, seed=batch)
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
    _write_json(report, args.json)
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


# -- --gguf-models: one row per model, each engine in a child process -------------------------------------------------

ENGINES = ("kestrel_gguf", "kestrel_dequantized")  # --quantization gguf, then the default (dequantized at load)
_MIB = 2**20


def _child_options(args, quantization: str, prompt_len: int, gen_len: int, threads: int) -> dict:
    """EngineConfig options of a Kestrel child: the command line's, on the CPU, with ``quantization``, the threads
    llama.cpp gets, and a KV cache of one sequence's length (llama.cpp's n_ctx) unless --num-kv-blocks says."""
    from engine.config import EngineConfig

    cfg = EngineConfig.from_cli_args(args)
    opts = {k: v for k, v in vars(cfg).items() if k != "model"}
    block = cfg.block_size or 16
    opts.update(device="cpu", quantization=quantization, num_threads=threads,
                num_kv_blocks=cfg.num_kv_blocks or -(-(prompt_len + gen_len + 8) // block) + 1)
    return opts


def kestrel_in_child(model: str, options: dict, prompt: list[int], gen_len: int, repeats: int) -> dict | str:
    """One Kestrel configuration measured in a child process (``python -m engine.bench.offline``): its runs and
    memory, or a plain-words reason when it failed."""
    import subprocess
    import sys

    request = json.dumps({"model": model, "options": options, "prompt": prompt, "gen_len": gen_len,
                          "repeats": repeats})
    proc = subprocess.run([sys.executable, "-m", "engine.bench.offline"], input=request, text=True,
                          capture_output=True, check=False)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [""]
        return f"failed: exit code {proc.returncode} {tail[0]}".strip()
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _child_main() -> int:
    """The Kestrel child: a JSON request on stdin, one JSON line on stdout."""
    import sys

    req = json.loads(sys.stdin.read())
    from engine.bench.llamacpp_peer import resident_set
    from engine.bench.report import resolved_config
    from engine.layers.linear import LinearBase
    from engine.layers.moe import FusedMoE
    from engine.layers.moe_gguf import expert_bytes
    from engine.llm import LLM
    from engine.ops.native import amx_bf16

    before = resident_set()  # Python, torch and the engine imported: the baseline under the model
    llm = LLM(req["model"], **req["options"])
    loaded = resident_set()
    runner = llm.core.runner
    linears = [m for m in runner.model.modules() if isinstance(m, LinearBase)]
    tables = {id(t): t for t in (runner.model.embed_tokens, runner.model.lm_head)}.values()  # tied: one
    prompt, gen_len = req["prompt"], req["gen_len"]
    run_engine(llm, [prompt], 4)  # warm-up: the whole prompt (the prefix cache is reset before every run)
    runs = [run_engine(llm, [prompt], gen_len) for _ in range(req["repeats"])]
    after = resident_set()
    out = {
        "runs": runs,
        "rss_before_load": before["rss"],
        "dtype": str(runner.dtype).removeprefix("torch."),
        "threads": req["options"].get("num_threads"),
        "rss_after_load": loaded["rss"],
        "rss_after_run": after["rss"],
        "rss_peak": after["rss_peak"],
        "kv_cache_bytes": runner.kv_bytes_per_block() * llm.core.blocks.num_blocks,
        "gguf_linear_bytes": sum(m.gguf.nbytes for m in linears if m.gguf is not None),
        "gguf_table_bytes": sum(t.gguf.nbytes for t in tables if t.gguf is not None),
        "gguf_expert_bytes": sum(expert_bytes(m) for m in runner.model.modules() if isinstance(m, FusedMoE)),
        "cpu_amx": amx_bf16(),  # bfloat16 prefill on torch's oneDNN GEMM (KESTREL_CPU_AMX)
        "float_linear_layers": sum(m.gguf is None for m in linears),
        "config": resolved_config(llm.core),
    }
    llm.close()
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    return 0


def _summary(result: dict | str, file_bytes: int) -> dict | str:
    """Medians of a child's runs, memory in MiB and against the file."""
    if isinstance(result, str):
        return result
    out = _median(result["runs"])
    for key in ("rss_before_load", "rss_after_load", "rss_after_run", "rss_peak", "kv_cache_bytes",
                "gguf_linear_bytes", "gguf_table_bytes", "gguf_expert_bytes"):
        if result.get(key) is not None:
            out[key.removesuffix("_bytes") + "_mib"] = round(result[key] / _MIB, 1)
    if result.get("rss_after_run") and result.get("rss_before_load"):
        # what the model added to the process (weights, KV cache, buffers): the figure to hold against the file
        model = result["rss_after_run"] - result["rss_before_load"]
        out["model_rss_mib"] = round(model / _MIB, 1)
        out["model_rss_vs_file"] = round(model / file_bytes, 3)
        if result.get("kv_cache_bytes"):  # the budget the issue sets: the file plus the KV cache
            out["model_rss_vs_file_plus_kv"] = round(model / (file_bytes + result["kv_cache_bytes"]), 3)
    for key in ("dtype", "threads", "float_linear_layers", "n_ctx", "cpu_amx", "config"):
        if key in result:
            out[key] = result[key]
    return out


def main_gguf_models(args) -> int:
    import math
    import os
    import sys
    from pathlib import Path

    from engine.bench.gguf_models import DEFAULT_GGUF_MODELS, model_path
    from engine.bench.gguf_moe_models import active_weight_bytes, read_bandwidth
    from engine.bench.llamacpp_peer import run_in_child
    from engine.bench.report import environment
    from engine.config import EngineConfig
    from engine.loader.gguf import gguf_hf_config, gguf_quantization
    from engine.loader.gguf_file import GGUFFile
    from engine.runner.device import physical_cores

    cfg = EngineConfig.from_cli_args(args)
    if cfg.model is not None:
        print("kestrel bench offline: --gguf-models runs its own models; leave out --model (or name the .gguf file "
              "among the --gguf-models)", file=sys.stderr)
        return 2
    names = args.gguf_models or DEFAULT_GGUF_MODELS
    threads = cfg.num_threads or physical_cores()
    workdir = Path(args.workdir).expanduser() if args.workdir else None
    report = {
        "benchmark": "offline-gguf-models",
        "prompt_len": args.prompt_len,
        "gen_len": args.gen_len,
        "batch": 1,
        "threads": threads,
        "repeats": args.repeats,
        "environment": environment(),
        "models": [],
    }
    for name in names:
        path = model_path(name, workdir)
        gf = GGUFFile(path)
        try:
            cfg = gguf_hf_config(gf)
            quant = gguf_quantization(gf)
            params = sum(math.prod(t.shape) for t in gf.tensors.values())
            weight_bytes, active_bytes = active_weight_bytes(gf.tensors, gf.metadata)
            experts = (cfg.get("num_experts") or cfg.get("num_local_experts"), cfg.get("num_experts_per_tok"))
        finally:
            gf.close()
        file_bytes = path.stat().st_size
        prompt = random_prompts(1, args.prompt_len, cfg["vocab_size"], seed=1)[0]
        row: dict = {"model": name, "path": str(path), "quantization": quant, "params": params,
                     "file_mib": round(file_bytes / _MIB, 1), "weight_mib": round(weight_bytes / _MIB, 1),
                     "active_weight_mib": round(active_bytes / _MIB, 1), "loadavg_before": list(os.getloadavg())}
        if experts[0]:
            row["experts"], row["experts_used"] = experts
        # the batch-1 decode ceiling: the bytes one step reads at this machine's read bandwidth, measured now
        bandwidth = read_bandwidth(threads)
        row["read_bandwidth_gb_s"] = round(bandwidth / 1e9, 1)
        row["decode_limit_tok_s"] = round(bandwidth / active_bytes, 1)
        for engine, quantization in zip(ENGINES, ("gguf", "none")):
            if engine == "kestrel_dequantized" and args.skip_dequantized:
                continue
            opts = _child_options(args, quantization, args.prompt_len, args.gen_len, threads)
            row[engine] = _summary(kestrel_in_child(str(path), opts, prompt, args.gen_len, args.repeats), file_bytes)
        if args.vs_llamacpp:
            peer = run_in_child(str(path), prompt, args.gen_len, threads, args.repeats, details=True, warmup=True)
            row["llama.cpp"] = _summary(peer, file_bytes)
            if isinstance(row["llama.cpp"], dict):
                row["ratio_vs_llama.cpp"] = {
                    engine: {k: row[engine][k] / row["llama.cpp"][k] for k in ("prefill_tok_s", "decode_tok_s")}
                    for engine in ENGINES if isinstance(row.get(engine), dict)}
        for engine in (*ENGINES, "llama.cpp"):
            if isinstance(row.get(engine), dict):
                row[engine]["decode_share_of_limit"] = round(row[engine]["decode_tok_s"] / row["decode_limit_tok_s"], 3)
        row["loadavg_after"] = list(os.getloadavg())
        report["models"].append(row)
        _print_model_row(row)
    _write_json(report, args.json)
    return 0


def _print_model_row(row: dict) -> None:
    experts = f", {row['experts']} experts, {row['experts_used']} active" if row.get("experts") else ""
    print(f"{row['model']} ({row['quantization']}, {row['params'] / 1e9:.2f}B params{experts}, file {row['file_mib']} "
          f"MiB, {row['active_weight_mib']} MiB read per token, load average {row['loadavg_before'][0]:.2f}; decode "
          f"limit {row['decode_limit_tok_s']} tok/s at {row['read_bandwidth_gb_s']} GB/s):", flush=True)
    for engine in (*ENGINES, "llama.cpp"):
        r = row.get(engine)
        if r is None:
            continue
        if isinstance(r, str):
            print(f"  {engine:<20} {r}", flush=True)
            continue
        ratio = row.get("ratio_vs_llama.cpp", {}).get(engine)
        vs = f" | vs llama.cpp prefill {ratio['prefill_tok_s']:.2f}x, decode {ratio['decode_tok_s']:.2f}x" \
            if ratio else ""
        print(f"  {engine:<20} prefill {r['prefill_tok_s']:8.1f} tok/s, decode {r['decode_tok_s']:7.2f} tok/s, "
              f"RSS {r.get('rss_after_run_mib', float('nan')):7.1f} MiB, of which the model "
              f"{r.get('model_rss_mib', float('nan')):7.1f} MiB ({r.get('model_rss_vs_file', float('nan')):.2f}x "
              f"the file, {r.get('model_rss_vs_file_plus_kv', float('nan')):.2f}x file + KV), "
              f"{r['decode_share_of_limit']:.0%} of the decode limit{vs}", flush=True)


if __name__ == "__main__":
    import sys

    sys.exit(_child_main())
