"""Probe: the CUDA paged decode attention kernel at the decode batches that miss their targets (batch 64 and ~1,000
sequences at 512-640-token contexts, batch 1 at 512), as the engine calls it, for Nsight Compute:

    ncu --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        -k regex:paged_decode --launch-skip 3 --launch-count 3 python3 -m benchmarks.probe_decode_attention

Llama-3-8B shape (32 query heads, 8 KV heads, head size 128), bf16, 64-token blocks, scrambled tables."""

import torch

from engine import ops
from engine.runner.cuda_graphs import partition_tokens

NH, NKV, HD, BS = 32, 8, 128, 64


def case(b: int, ctx: int, graphs: bool, width_tokens: int = 8192):
    blocks = b * -(-ctx // BS)
    kc = torch.randn(blocks, BS, NKV, HD, dtype=torch.bfloat16, device="cuda")
    vc = torch.randn_like(kc)
    width = -(-width_tokens // BS) if graphs else -(-ctx // BS)
    t = torch.zeros(b, width, dtype=torch.int32, device="cuda")
    t[:, :blocks // b] = (torch.randperm(blocks, device="cuda", dtype=torch.int32)).view(b, -1)
    lens = torch.full((b,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(b, NH, HD, dtype=torch.bfloat16, device="cuda")
    o = torch.empty_like(q)
    part = partition_tokens(b, NKV, torch.cuda.get_device_properties(0).multi_processor_count) if graphs else 0
    for _ in range(4):
        ops.paged_decode_attention(q, kc, vc, t, lens, HD ** -0.5, out=o, part_tokens=part)
    torch.cuda.synchronize()


if __name__ == "__main__":
    for b, ctx, graphs in ((64, 512, True), (1, 512, True), (992, 640, False)):
        case(b, ctx, graphs)
        print(f"done b{b} ctx{ctx} {'graphs' if graphs else 'eager'}", flush=True)
