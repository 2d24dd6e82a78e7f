"""The GGUF decode GEMV alone (M = 1, bfloat16 x), 1B-Llama shapes of `kestrel bench offline --gguf-models`
(qkv 3072 x 2048, o 2048 x 2048, gate_up 11264 x 2048, down 2048 x 5632), weights out of cache (enough copies of
each weight to pass the L3, called in turn), as in docs/benchmarks/cpu_gguf_models_2026-12-03.md:

    flock /tmp/kestrel-cpu.lock .venv/bin/python -m benchmarks.cpu_gguf_gemv_bench [Q4_0,Q8_0] [threads] [isa]

Prints per type and shape the median us a call over 5 rounds, and the GB/s of weight bytes that makes.
"""
import statistics
import sys
import time

import numpy as np
import torch

from engine import ops
from engine import _C

types = (sys.argv[1] if len(sys.argv) > 1 else "Q4_0,Q8_0").split(",")
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
isa = sys.argv[3] if len(sys.argv) > 3 else "auto"
_C.gguf_force_isa(isa)
ops.set_num_threads(threads)
ids = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q5_0": 6, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
sizes = {2: 18, 3: 20, 8: 34, 6: 22, 12: 144, 13: 176, 14: 210}
shapes = {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (11264, 2048), "down": (2048, 5632)}
rng = np.random.default_rng(0)
print(f"isa {ops.gguf_isa()}, {threads} threads")
for t in types:
    q = ids[t]
    per_block = 256 if q >= 12 else 32
    row = []
    for name, (n, k) in shapes.items():
        nbytes = n * k // per_block * sizes[q]
        copies = max(2, int(96e6 // nbytes) + 1)
        ws = []
        for _ in range(copies):
            raw = rng.integers(0, 256, (n, k // per_block * sizes[q]), dtype=np.uint8)
            if q in (2, 3, 8, 6):  # finite float16 scales
                blk = raw.reshape(n, k // 32, sizes[q])
                nsc = 2 if q == 3 else 1
                blk[..., : 2 * nsc] = rng.uniform(-0.05, 0.05, (n, k // 32, nsc)).astype(np.float16).view(
                    np.uint8).reshape(n, k // 32, 2 * nsc)
            else:
                raw[:] = 0  # the K-quants: zeros are valid blocks
            ws.append(ops.GGUFWeight.from_blocks(raw, q, k))
        x = torch.randn(1, k, dtype=torch.bfloat16)
        out = torch.empty(1, n, dtype=torch.bfloat16)
        for w in ws:
            ops.gguf_linear(x, w, out=out)
        rounds = []
        for _ in range(5):
            reps = max(1, 40 // copies) * copies
            t0 = time.perf_counter()
            for i in range(reps):
                ops.gguf_linear(x, ws[i % copies], out=out)
            rounds.append((time.perf_counter() - t0) / reps)
        us = statistics.median(rounds) * 1e6
        row.append(f"{name} {us:7.1f} us ({nbytes / us / 1e3:5.1f} GB/s; {min(rounds) * 1e6:.1f}-"
                   f"{max(rounds) * 1e6:.1f})")
        del ws
    print(f"{t}: " + " | ".join(row))
