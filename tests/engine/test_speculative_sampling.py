"""Speculative sampling keeps the target's distribution, end to end: a tiny random llama as its own draft (the
proposal after the first token is its greedy one, the likeliest), top-k 4 at temperature 0.7; the second
generated token (a verify pass: accepted with probability p(proposal), else drawn from the residual) must follow the
target's own distribution given the first, computed from ``EngineCore.score``. Fixed seeds; tolerance: total
variation < 0.15 per conditioning token with at least 150 draws (the expected distance for 150 draws over 4 tokens
is about 0.06). (max_tokens 3: with 2 the second token is the last and nothing is proposed for it.)"""

from __future__ import annotations

import json
from collections import Counter

import torch

from engine import LLM, SamplingParams

PROMPT = [1, 300, 301, 302, 303, 300]
N = 800
TOLERANCE = 0.15


def test_second_token_follows_the_targets_distribution(tiny_model_dir):
    target = tiny_model_dir("llama")  # its own draft: a greedy proposal after every first token
    spec = json.dumps({"model": str(target), "num_speculative_tokens": 1})
    llm = LLM(target, dtype="float32", max_num_seqs=256, num_kv_blocks=1200, block_size=16, speculative_config=spec)
    try:
        params = [SamplingParams(temperature=0.7, top_k=4, max_tokens=3, ignore_eos=True, seed=i) for i in range(N)]
        outs = [o.outputs[0].token_ids for o in llm.generate([PROMPT] * N, params)]
        assert llm.core.spec.counts.verify_steps >= N * 0.9  # the second tokens came from verify passes
        assert 0 < llm.core.spec.counts.accepted < llm.core.spec.counts.proposed
        by_first = Counter(o[0] for o in outs)
        checked = 0
        for first, n in by_first.items():
            if n < 150:
                continue
            logits = llm.core.score(PROMPT + [first])[-1] / 0.7
            top = torch.topk(logits, 4)
            p = torch.softmax(top.values, dim=-1)
            seen = Counter(o[1] for o in outs if o[0] == first)
            assert set(seen) <= set(top.indices.tolist())  # nothing outside the target's top-k
            emp = torch.tensor([seen.get(t, 0) / n for t in top.indices.tolist()])
            tv = 0.5 * float((emp - p).abs().sum())
            assert tv < TOLERANCE, (first, tv, emp.tolist(), p.tolist())
            checked += 1
        assert checked >= 2
    finally:
        llm.close()
