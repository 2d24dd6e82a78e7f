"""The default model (SmolLM2-135M-Instruct: 9 heads, 3 KV heads, so TP=3) in float32 at TP=3, rank 0 here and
two worker processes with one thread each:

- the same greedy tokens as TP=1, with the host strategy and with gloo;
- int8 all-reduce keeps the perplexity of a fixed text within 1% of the exact all-reduce (the numbers are
  printed with pytest -s, for the report). EngineCore.score gives float32 logits at every position; the same
  TP=3 engine scores the text with the exact host strategy, then with int8 (every rank switches between
  steps).

One TP engine per process (they use torch.distributed's default group), so the engine is module-scoped.
"""

from __future__ import annotations

import math

import pytest
import torch

from engine.llm import LLM
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def smollm2_tp3():
    llm = LLM(dtype="float32", tensor_parallel_size=3, comm_strategy="host", quantization="none")  # smollm2_fp32's
    yield llm
    llm.core.shutdown()


def _greedy(llm, prompts, params):
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def test_default_model_tp3_same_greedy_tokens(smollm2_fp32, smollm2_tp3):
    prompts = ["The quick brown fox", "Write a haiku about the sea:"]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    ref = _greedy(smollm2_fp32, prompts, params)
    ex = smollm2_tp3.core.executor
    assert len(ex.worker_pids) == 2 and ex.threads_per_rank == 1
    assert _greedy(smollm2_tp3, prompts, params) == ref
    ex.set_strategy("nccl")
    try:
        assert _greedy(smollm2_tp3, prompts, params) == ref
    finally:
        ex.set_strategy("host")


TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type, oil-based inks and a wooden press adapted from those used to make wine. Books, "
    "which had been copied by hand for centuries, could now be produced in hundreds of identical copies. "
    "Within fifty years presses were operating in more than two hundred cities across Europe, and the price "
    "of books fell sharply. Scholars argue that the spread of printed material helped to standardise "
    "languages, accelerated the exchange of scientific ideas, and made the Reformation possible. Yet the "
    "change was gradual: manuscripts remained common for decades, and many early printers went bankrupt "
    "because they misjudged what readers wanted to buy."
)


def _ppl(core, ids: list[int]) -> float:
    logits = core.score(ids)  # [T, V] float32
    logp = torch.log_softmax(logits[:-1].double(), dim=-1)
    nll = -logp.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).mean()
    return math.exp(float(nll))


def test_int8_perplexity_within_one_percent(smollm2_fp32, smollm2_tp3):
    core = smollm2_tp3.core
    ids = core.tokenizer.encode(TEXT)
    assert len(ids) > 100
    ppl_tp1 = _ppl(smollm2_fp32.core, ids)
    ex = core.executor
    ppl_exact = _ppl(core, ids)
    ex.set_strategy("int8")
    try:
        before = core.stats().comm_by_strategy.get("int8", {}).get("calls", 0)
        ppl_int8 = _ppl(core, ids)
        after = core.stats().comm_by_strategy["int8"]["calls"]
        assert after > before, "int8 did not serve the all-reduces"
    finally:
        ex.set_strategy("host")
    rel = abs(ppl_int8 - ppl_exact) / ppl_exact
    print(f"\nSmolLM2-135M fp32, {len(ids)} tokens: perplexity TP=1 {ppl_tp1:.4f}, TP=3 exact (host) "
          f"{ppl_exact:.4f}, TP=3 int8 {ppl_int8:.4f} ({100 * rel:.3f}% from exact)")
    assert abs(ppl_exact - ppl_tp1) / ppl_tp1 < 1e-4  # exact TP is the same model
    assert rel < 0.01
    assert ppl_int8 != ppl_exact  # int8 really quantised something
