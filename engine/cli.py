"""The engine's commands of `kestrel`: generate, chat, bench and serve (also ``python -m engine.cli``). The
`kestrel` entry point itself is app.cli, above both packages: it opens the desktop app when given no command
and hands every other command line to main() here. Nothing here imports app."""

from __future__ import annotations

import argparse
import logging
import sys

from engine.config import EngineConfig
from engine.errors import KestrelError
from engine.sampling_params import SamplingParams

# The commands import what they run when they run (engine.llm, engine.bench.*, engine.server.*: torch, FastAPI):
# a command line pays only for its own command, and importing this module (app.cli does) stays torch-free.


def _engine_parser(sub, name: str, help: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help, description=help)
    EngineConfig.add_cli_args(p)
    return p


def _sampling_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    p.add_argument("--max-tokens", type=int, default=max_tokens)
    p.add_argument("--temperature", type=float, default=None, help="0 for greedy (default: the model's)")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    if "--seed" not in p._option_string_actions:  # EngineConfig's --seed (engine parsers) serves both
        p.add_argument("--seed", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true")


def sampling_params(args, generation_config: dict):
    def pick(name, default):
        v = getattr(args, name)
        return v if v is not None else generation_config.get(name, default)

    return SamplingParams(max_tokens=args.max_tokens, temperature=pick("temperature", 0.7),
                          top_p=pick("top_p", 1.0), top_k=pick("top_k", 0), seed=getattr(args, "seed", None),
                          ignore_eos=args.ignore_eos)


def weights_words(llm) -> str:
    """How the loaded weights are held, for a status line: ", Q4_1 blocks kept" (a GGUF file under --quantization
    auto / gguf on the CPU), ", Q4_1 dequantized", ", int8 weights"; "" for float weights loaded as they are."""
    mode, quant = llm.core.runner.quantization, llm.core.checkpoint.quantization
    if mode == "gguf":
        return f", {quant} blocks kept" if quant else ", GGUF blocks kept"
    if mode in ("int8", "int4", "fp8"):
        return f", {mode} weights"
    return f", {quant} dequantized" if quant and llm.core.checkpoint.format == "gguf" else ""


def cmd_generate(args) -> int:
    from engine.llm import LLM

    llm = LLM.from_cli_args(args)
    params = sampling_params(args, llm.core.checkpoint.generation_config)
    for delta in llm.stream(args.prompt, params):
        sys.stdout.write(delta.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def cmd_chat(args) -> int:
    from engine.llm import LLM

    llm = LLM.from_cli_args(args)
    params = sampling_params(args, llm.core.checkpoint.generation_config)
    name = llm.core.checkpoint.path.name
    runner = llm.core.runner
    dtype = str(runner.dtype).removeprefix("torch.")
    print(f"Kestrel chat on {name} ({dtype}, {runner.device}{weights_words(llm)}). "
          "Empty line or Ctrl-D to quit, /reset to start over.")
    history: list[dict] = []
    if args.system:
        history.append({"role": "system", "content": args.system})
    while True:
        try:
            line = input("\n> ")
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if not line.strip():
            return 0
        if line.strip() == "/reset":
            history = history[:1] if args.system else []
            continue
        history.append({"role": "user", "content": line})
        reply = ""
        try:
            for delta in llm.stream(sampling_params=params, messages=history):
                sys.stdout.write(delta.text)
                sys.stdout.flush()
                reply += delta.text
        except KestrelError as e:
            print(f"\n[error] {e}")
            history.pop()
            continue
        except KeyboardInterrupt:
            print("\n[stopped]")
        print()
        history.append({"role": "assistant", "content": reply})


def cmd_bench(args) -> int:
    from engine.bench.offline import main as bench_offline

    return bench_offline(args)


def cmd_serve(args) -> int:
    from engine.server.serve import main as serve_main

    return serve_main(args)


def cmd_bench_http(args) -> int:
    from engine.bench.serving import main as bench_http

    return bench_http(args)


def cmd_bench_serve(args) -> int:
    from engine.bench.serve import main as bench_serve

    return bench_serve(args)


def cmd_bench_sweep(args) -> int:
    from engine.bench.sweep import main_sweep

    return main_sweep(args)


def cmd_bench_gpu(args) -> int:
    from engine.bench.gpu import main as bench_gpu

    return bench_gpu(args)


def cmd_bench_tp(args) -> int:
    from engine.bench.tp import main as bench_tp

    return bench_tp(args)


def cmd_bench_quant(args) -> int:
    from engine.bench.quant import main as bench_quant

    return bench_quant(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kestrel", description="Local LLM inference workstation")
    sub = parser.add_subparsers(dest="command")
    g = _engine_parser(sub, "generate", "Complete one prompt and print the completion")
    g.add_argument("--prompt", required=True)
    _sampling_args(g, 128)
    g.set_defaults(func=cmd_generate)
    c = _engine_parser(sub, "chat", "Chat in the terminal, streaming replies")
    c.add_argument("--system", default=None, help="System prompt")
    _sampling_args(c, 512)
    c.set_defaults(func=cmd_chat)
    b = sub.add_parser("bench", help="Benchmarks")
    bsub = b.add_subparsers(dest="bench_command", required=True)
    # the bench modules' flags (torch-heavy modules: imported once a command line is parsed)
    from engine.bench.offline import add_args as offline_args
    bo = _engine_parser(bsub, "offline", "Offline prefill/decode throughput, side by side with llama.cpp")
    offline_args(bo)
    bo.set_defaults(func=cmd_bench)
    from engine.bench.serving import add_args as http_args
    bh = _engine_parser(bsub, "http-vs-offline",
                        "The same requests offline and through the HTTP server, in one run: tokens/s and ratio")
    http_args(bh)
    bh.set_defaults(func=cmd_bench_http)
    from engine.bench.serve import add_args as serve_args
    bs = bsub.add_parser("serve", help="Load test of an OpenAI-compatible server (flags as vLLM's bench serve): "
                                       "TTFT, TPOT, ITL, E2E latency, throughput, goodput; a JSON report")
    serve_args(bs)
    bs.set_defaults(func=cmd_bench_serve)
    bw = bsub.add_parser("sweep", help="bench serve over lists of concurrencies, request rates, input / output "
                                       "lengths: one report, a table per point")
    serve_args(bw, sweep=True)
    bw.set_defaults(func=cmd_bench_sweep)
    from engine.bench.gpu import add_args as gpu_args
    bg = bsub.add_parser("gpu", help="Kestrel vs HF transformers on one GPU (Llama-3-8B shape, random weights), "
                                     "against the GPU's measured limits")
    gpu_args(bg)
    bg.set_defaults(func=cmd_bench_gpu)
    from engine.bench.tp import add_args as tp_args
    bt = bsub.add_parser("tp", help="Tensor parallelism: TP=2 against TP=1 per comm strategy, on two GPUs (NVLink and "
                                    "PCIe-like) or on the CPU (ranks as processes); Llama-3-8B shape, random weights")
    tp_args(bt)
    bt.set_defaults(func=cmd_bench_tp)
    from engine.bench.quant import add_args as quant_args
    bq = bsub.add_parser("quant", help="GPU quantization (int8 / int4 / fp8) against bf16 in one run: the kernels on "
                                       "the Llama-3-8B shapes, then the engine's memory, TPOT and TTFT per mode")
    quant_args(bq)
    bq.set_defaults(func=cmd_bench_quant)
    from engine.server.args import add_serve_args
    s = _engine_parser(sub, "serve", "Serve the model over an OpenAI-compatible HTTP API")
    add_serve_args(s)
    s.set_defaults(func=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):  # no command (app.cli opens the desktop app before getting here)
        parser.print_help()
        return 2
    args._argv = list(sys.argv[1:] if argv is None else argv)  # reports record the command line
    try:
        return args.func(args)
    except KestrelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
