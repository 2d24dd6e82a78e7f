"""The batched sampler on a CUDA device: the same distributions and greedy tokens as on the CPU, seeded requests
reproducible with device generators, and no host synchronisation before the step's one transfer of tokens."""

from __future__ import annotations

import random

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from engine.layers.sampler import Sampler, filtered_probs  # noqa: E402
from engine.runner.inputs import sampling_metadata  # noqa: E402
from tests.unit.test_sampler import _random_request  # noqa: E402

DEV = torch.device("cuda", torch.cuda.current_device())


@pytest.mark.parametrize("seed", range(6))
def test_cuda_matches_cpu(seed):
    rng = random.Random(seed)
    vocab = 4096
    reqs = [_random_request(rng, i, vocab) for i in range(8)]
    logits = torch.randn(len(reqs), vocab, generator=torch.Generator().manual_seed(seed)) * 4
    cpu = Sampler(torch.Generator().manual_seed(0))
    gpu = Sampler(torch.Generator(device=DEV).manual_seed(0))
    md = sampling_metadata(reqs)
    x_cpu, x_gpu = cpu._process(logits, md), gpu._process(logits.to(DEV), md)
    torch.testing.assert_close(x_gpu.cpu(), x_cpu, atol=1e-5, rtol=1e-5)
    drawing = [i for i, r in enumerate(reqs) if not r.params.greedy]
    if drawing:
        params = [reqs[i].params for i in drawing]
        torch.testing.assert_close(filtered_probs(x_gpu[drawing], params).cpu(), filtered_probs(x_cpu[drawing], params),
                                   atol=1e-5, rtol=1e-4)
    t_cpu, _ = cpu(logits, md)
    t_gpu, _ = gpu(logits.to(DEV), md)
    for i, r in enumerate(reqs):
        if r.params.greedy:
            assert t_cpu[i] == t_gpu[i]


def test_no_host_sync_before_the_transfer():
    rng = random.Random(1)
    reqs = [_random_request(rng, i, 32000) for i in range(16)]
    logits = torch.randn(len(reqs), 32000, device=DEV)
    gens = [torch.Generator(device=DEV).manual_seed(i) if i % 3 == 0 else None for i in range(len(reqs))]
    s = Sampler(torch.Generator(device=DEV).manual_seed(0))
    md = sampling_metadata(reqs, gens)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        x = s._process(logits, md)
        tokens = torch.argmax(x, dim=-1)
        draw = [i for i, r in enumerate(reqs) if not r.params.greedy]
        if draw:
            tokens = s._draw(x, md, draw, tokens)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(0 <= t < 32000 for t in tokens.tolist())


def test_seeded_requests_reproduce_on_the_device():
    rng = random.Random(2)
    reqs = [_random_request(rng, i, 1000) for i in range(4)]
    for r in reqs:
        r.params.temperature, r.params.top_k = 1.0, 0
    logits = torch.randn(len(reqs), 1000, device=DEV)
    runs = []
    for _ in range(2):
        gens = [torch.Generator(device=DEV).manual_seed(7 + i) for i in range(len(reqs))]
        s = Sampler(torch.Generator(device=DEV).manual_seed(0))
        md = sampling_metadata(reqs, gens)
        runs.append([s(logits, md)[0] for _ in range(5)])
    assert runs[0] == runs[1]
