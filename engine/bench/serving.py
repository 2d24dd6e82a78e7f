"""`kestrel bench http-vs-offline`: the same requests through the offline API (LLM.generate, in this process)
and through the OpenAI-compatible HTTP server (engine process + uvicorn + an HTTP client on this machine), in
one run, alternating, so the overhead of the serving path is measured on the same (noisy) machine state.

Every request: the same random prompt token ids (seeded), greedy, ``ignore_eos`` so every request generates
exactly ``--gen-len`` tokens. All requests are submitted at once (offline: one generate() call; HTTP: one
concurrent streaming request each). The prefix cache is reset before each pass so both paths compute every
prompt. Throughput = generated tokens / wall time of the pass; the report gives each pass, the medians and
their ratio (HTTP / offline). Passes alternate (offline first on odd passes, HTTP first on even ones).

On a shared machine, other processes change the compute speed from pass to pass, so the report also gives
what noise cannot fake: the engine's busy share of each pass (the sum of its step times / wall time; the rest
is time the engine loop spent outside model steps: Python between steps offline; IPC, waiting for requests
and sending outputs on the HTTP path) and the CPU seconds each side burned."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--gen-len", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="passes of each path, alternating; medians reported")
    p.add_argument("--no-stream", dest="stream", action="store_false", help="non-streaming HTTP requests")
    p.add_argument("--json", default=None, help="write the report here")


def _prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(100, vocab) for _ in range(length)] for _ in range(n)]


def _busy(steps, t0: float, t1: float) -> float:
    """Seconds of engine steps that ended within [t0, t1] (time.monotonic clock)."""
    return sum(st.duration for st in steps if t0 <= st.time <= t1)


def run_offline(llm, prompts: list[list[int]], gen_len: int) -> dict:
    from engine.sampling_params import SamplingParams

    llm.core.blocks.reset_prefix_cache()
    params = SamplingParams(max_tokens=gen_len, temperature=0.0, ignore_eos=True)
    cpu0 = time.process_time()
    m0 = time.monotonic()
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    wall = time.perf_counter() - t0
    m1 = time.monotonic()
    cpu = time.process_time() - cpu0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    busy = _busy(llm.core.recent_steps, m0, m1)
    return {"wall_s": wall, "generated_tokens": tokens, "tok_s": tokens / wall, "engine_busy_s": busy,
            "engine_busy_share": busy / wall, "cpu_s": cpu, "texts": [o.outputs[0].text for o in outs]}


async def _one_http(http, url: str, body: dict, stream: bool) -> tuple[int, str]:
    if not stream:
        r = await http.post(url, json=body)
        r.raise_for_status()
        data = r.json()
        return data["usage"]["completion_tokens"], data["choices"][0]["text"]
    text = []
    tokens = None
    async with http.stream("POST", url, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if chunk["choices"]:
                text.append(chunk["choices"][0]["text"])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return tokens or 0, "".join(text)


async def run_http(http, base_url: str, model: str, prompts: list[list[int]], gen_len: int, stream: bool,
                   client) -> dict:
    import asyncio

    import psutil

    await client.reset_prefix_cache()
    engine = psutil.Process(client.engine_pid)
    bodies = [{"model": model, "prompt": p, "max_tokens": gen_len, "temperature": 0, "ignore_eos": True,
               "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}
              for p in prompts]
    url = f"{base_url}/v1/completions"
    e0 = sum(engine.cpu_times()[:2])
    cpu0 = time.process_time()
    m0 = time.monotonic()
    t0 = time.perf_counter()
    results = await asyncio.gather(*(_one_http(http, url, b, stream) for b in bodies))
    wall = time.perf_counter() - t0
    m1 = time.monotonic()
    cpu = time.process_time() - cpu0
    engine_cpu = sum(engine.cpu_times()[:2]) - e0
    tokens = sum(r[0] for r in results)
    stats = await client.stats(recent=4096)
    busy = _busy(stats.recent_steps, m0, m1)
    return {"wall_s": wall, "generated_tokens": tokens, "tok_s": tokens / wall, "engine_busy_s": busy,
            "engine_busy_share": busy / wall, "cpu_s": engine_cpu + cpu, "engine_cpu_s": engine_cpu,
            "server_and_client_cpu_s": cpu, "texts": [r[1] for r in results]}


async def _main(args) -> dict:
    import gc

    import httpx

    from engine.bench.report import environment
    from engine.frontend.client import EngineClient
    from engine.config import EngineConfig
    from engine.llm import LLM
    from engine.server.serve import start_server

    config = EngineConfig.from_cli_args(args)
    llm = LLM.from_cli_args(args)
    vocab = llm.core.model_config.vocab_size
    prompts = _prompts(args.num_requests, args.prompt_len, vocab, seed=config.seed)
    client = await EngineClient.start(config)
    server = await start_server(client, "127.0.0.1", 0, served_model_names=["bench"])
    report = {
        "benchmark": "http-vs-offline",
        "model": client.info.path,
        "quantization": client.info.quantization,
        "dtype": client.info.dtype,
        "device": client.info.device,
        "num_requests": args.num_requests,
        "prompt_len": args.prompt_len,
        "gen_len": args.gen_len,
        "stream": args.stream,
        "seed": config.seed,
        "environment": environment(),
        "offline": [],
        "http": [],
    }
    limits = httpx.Limits(max_connections=args.num_requests + 8, max_keepalive_connections=args.num_requests + 8)
    try:
        async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(3600.0)) as http:
            # warm-up of both paths (first-call costs, connection pool)
            run_offline(llm, [p[:16] for p in prompts[:4]], 4)
            await run_http(http, server.url, "bench", [p[:16] for p in prompts[:4]], 4, args.stream, client)
            texts_offline = texts_http = None
            for i in range(args.repeats):
                for path in (("offline", "http") if i % 2 == 0 else ("http", "offline")):
                    gc.collect()
                    if path == "offline":
                        r = run_offline(llm, prompts, args.gen_len)
                        texts_offline = r.pop("texts")
                        extra = ""
                    else:
                        r = await run_http(http, server.url, "bench", prompts, args.gen_len, args.stream, client)
                        texts_http = r.pop("texts")
                        extra = f"; server+client CPU {r['server_and_client_cpu_s']:.1f} s"
                    report[path].append(r)
                    print(f"pass {i + 1}: {path:<7} {r['tok_s']:8.1f} tok/s ({r['wall_s']:.1f} s, engine busy "
                          f"{100 * r['engine_busy_share']:.1f}%, CPU {r['cpu_s']:.1f} s{extra}; load "
                          f"{os.getloadavg()[0]:.1f})", flush=True)
            report["same_greedy_text"] = texts_offline == texts_http
    finally:
        await server.stop()
        await client.shutdown()
    off_med = statistics.median(r["tok_s"] for r in report["offline"])
    http_med = statistics.median(r["tok_s"] for r in report["http"])
    report["offline_tok_s"] = off_med
    report["http_tok_s"] = http_med
    report["ratio"] = http_med / off_med
    report["pass_ratios"] = [h["tok_s"] / o["tok_s"] for h, o in zip(report["http"], report["offline"])]
    report["busy_share_offline"] = statistics.median(r["engine_busy_share"] for r in report["offline"])
    report["busy_share_http"] = statistics.median(r["engine_busy_share"] for r in report["http"])
    report["median_pass_ratio"] = statistics.median(report["pass_ratios"])
    report["tokens_per_cpu_s_ratio"] = statistics.median(
        (h["generated_tokens"] / h["cpu_s"]) / (o["generated_tokens"] / o["cpu_s"])
        for h, o in zip(report["http"], report["offline"]))
    return report


def main(args) -> int:
    import asyncio

    report = asyncio.run(_main(args))
    print(f"{report['num_requests']} requests x {report['prompt_len']} prompt + {report['gen_len']} generated "
          f"tokens, {'streaming' if report['stream'] else 'non-streaming'}, {report['dtype']} on {report['device']}")
    print(f"offline {report['offline_tok_s']:.1f} tok/s | HTTP {report['http_tok_s']:.1f} tok/s | "
          f"ratio {report['ratio']:.3f} (per pass: {', '.join(f'{r:.3f}' for r in report['pass_ratios'])}; "
          f"median {report['median_pass_ratio']:.3f}) | "
          f"same greedy text: {report['same_greedy_text']}")
    print(f"engine busy share (steps / wall): offline {100 * report['busy_share_offline']:.1f}%, "
          f"HTTP {100 * report['busy_share_http']:.1f}% | tokens per CPU-second, HTTP / offline (median of passes): "
          f"{report['tokens_per_cpu_s_ratio']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"report written to {args.json}")
    return 0
