"""`kestrel generate`'s path measured: the command line parsed by engine.cli's parser, LLM.from_cli_args, the
stream cmd_generate reads (same SamplingParams), timed per delta; the resident set before the LLM (libraries
imported) and after load. Then llama.cpp on the same prompt ids and threads (engine.bench.llamacpp_peer, child).

usage: python -m benchmarks.cpu_default_quantization_generate [extra kestrel generate flags...]   (one JSON line on stdout)"""

import json
import sys
import time

from engine.bench.llamacpp_peer import resident_set, run_in_child
from engine.cli import build_parser, sampling_params
from engine.llm import LLM

PROMPT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
          "movable metal type, oil-based inks and a wooden press adapted from those used to make wine.")
GEN = 128
REPEATS = 3

extra = sys.argv[1:]
vs_llamacpp = "--no-llamacpp" not in extra
extra = [a for a in extra if a != "--no-llamacpp"]
args = build_parser().parse_args(["generate", "--prompt", PROMPT, "--max-tokens", str(GEN), "--temperature", "0",
                                  "--ignore-eos", "--num-threads", "2", *extra])
before = resident_set()
t = time.perf_counter()
llm = LLM.from_cli_args(args)
load_s = time.perf_counter() - t
loaded = resident_set()
runner = llm.core.runner
kv_bytes = runner.kv_bytes_per_block() * llm.core.blocks.num_blocks
params = sampling_params(args, llm.core.checkpoint.generation_config)
runs = []
for _ in range(REPEATS + 1):  # the first: warm-up
    llm.core.blocks.reset_prefix_cache()
    t0 = time.perf_counter()
    stamps = []
    for d in llm.stream(args.prompt, params):
        if d.token_ids:
            stamps.append((time.perf_counter(), len(d.token_ids)))
    n = sum(k for _, k in stamps)
    first = stamps[0][0]
    runs.append({"ttft_s": first - t0, "decode_tok_s": (n - stamps[0][1]) / (stamps[-1][0] - first), "tokens": n})
runs = runs[1:]
after = resident_set()
path = str(llm.core.checkpoint.path)
prompt_ids = llm.core.tokenize_prompt(args.prompt)
file_bytes = llm.core.checkpoint.path.stat().st_size
out = {
    "argv": extra, "quantization_option": llm.config.quantization, "quantization_run": runner.quantization,
    "dtype": str(runner.dtype).removeprefix("torch."), "threads": 2, "prompt_tokens": len(prompt_ids),
    "load_s": round(load_s, 2), "decode_tok_s": sorted(r["decode_tok_s"] for r in runs),
    "rss_before_load_mib": round(before["rss"] / 2**20, 1), "rss_after_load_mib": round(loaded["rss"] / 2**20, 1),
    "rss_after_runs_mib": round(after["rss"] / 2**20, 1),
    "model_rss_after_load_mib": round((loaded["rss"] - before["rss"]) / 2**20, 1),
    "model_rss_after_runs_mib": round((after["rss"] - before["rss"]) / 2**20, 1),
    "file_mib": round(file_bytes / 2**20, 1), "kv_cache_mib": round(kv_bytes / 2**20, 1),
}
llm.close()
if vs_llamacpp:
    peer = run_in_child(path, prompt_ids, GEN, 2, REPEATS, details=True, warmup=True)
    if isinstance(peer, str):
        out["llama.cpp"] = peer
    else:
        out["llama.cpp_decode_tok_s"] = sorted(r["decode_tok_s"] for r in peer["runs"])
        out["llama.cpp_rss"] = {k: round(v / 2**20, 1) for k, v in peer.items() if k.startswith("rss") and v}
        med = sorted(r["decode_tok_s"] for r in runs)[len(runs) // 2]
        lmed = out["llama.cpp_decode_tok_s"][len(peer["runs"]) // 2]
        out["decode_vs_llama.cpp"] = round(med / lmed, 2)
print(json.dumps(out))
