"""Per-component time of one CPU decode step (batch 1, the decode tape's replay, context ~512-580), as in
docs/benchmarks/cpu_gguf_models_2026-12-03.md:

    flock /tmp/kestrel-cpu.lock .venv/bin/python -m benchmarks.cpu_gguf_step_profile MODEL.gguf [reps]

Loads MODEL with --quantization gguf on 2 threads (KV cache of one 512 + 128-token sequence, as the bench), runs a
512-token prompt and 64 tokens (the step time the bench would see), then replays the batch-1 tape: whole replays,
and each recorded native call timed on its own (grouped by kernel and, for gguf_linear, by ggml type and shape).
"""
import collections
import statistics
import sys
import time

from engine.bench.offline import random_prompts, run_engine
from engine.llm import LLM

model = sys.argv[1]
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 30
llm = LLM(model, device="cpu", quantization="gguf", num_threads=2, num_kv_blocks=42)
prompt = random_prompts(1, 512, 49152, seed=1)[0]
run_engine(llm, [prompt], 4)
res = run_engine(llm, [prompt], 64)
step_ms = 1e3 / res["decode_tok_s"]
tape = llm.core.runner.tapes.tapes[1]
t = []
for _ in range(reps):
    t0 = time.perf_counter()
    tape.replay()
    t.append(time.perf_counter() - t0)
replay_ms = statistics.median(t) * 1e3
labels = []
for fn, args, _ in tape.calls:
    name = fn.__name__
    if name == "gguf_linear":
        name = f"gguf_linear q{args[7]} N={args[-2]} K={args[-1]}"
    labels.append(name)
acc = collections.defaultdict(float)
for _ in range(reps):
    for (fn, args, kw), lab in zip(tape.calls, labels):
        t0 = time.perf_counter()
        fn(*args, **kw)
        acc[lab] += time.perf_counter() - t0
cnt = collections.Counter(labels)
tot = sum(acc.values()) / reps * 1e3
print(f"decode step (bench, 63 steps): {step_ms:.2f} ms; tape replay {replay_ms:.2f} ms ({len(tape.calls)} calls); "
      f"per-call sum {tot:.2f} ms")
print(f"outside the replay (embedding, sampling, scheduler, detok, Python): {step_ms - replay_ms:.2f} ms")
for lab, v in sorted(acc.items(), key=lambda x: -x[1]):
    print(f"  {v / reps * 1e3:7.3f} ms  x{cnt[lab]:3d}  {lab}")
