"""The decode-graph path (engine/runner/cuda_graphs.py) without a GPU: the buckets, and the bucketed, padded forward
run eagerly (``capture=False``), which must give the same tokens and logprobs as the plain path: padding rows
(token 0, slot -1, context 0) must neither change the live rows nor write into the KV cache, batches must move
between buckets as requests finish, and batches past the largest bucket must fall back to the eager step.
tests/gpu/test_cuda_graphs.py checks real replays against this path bit for bit."""

from __future__ import annotations

import pytest
import torch

from engine.llm import LLM
from engine.runner.cuda_graphs import DecodeGraphs, capture_sizes, partition_tokens
from engine.sampling_params import SamplingParams

PROMPTS = ["The quick brown fox jumps over the lazy dog", "Paged attention over a block table", "x",
           "One two three four five six seven eight nine ten eleven twelve", "Hello", "CUDA graphs replay",
           "a b c d e f g"]


def test_capture_sizes():
    assert capture_sizes(256) == [1, 2, 4, *range(8, 257, 8)]
    assert capture_sizes(100) == [1, 2, 4, *range(8, 97, 8), 100]
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(1) == [1]
    assert capture_sizes(1024)[-1] == 256  # larger batches decode eagerly


def test_partitions_fill_one_wave_of_the_decode_kernel_at_most():
    # 8 KV heads on 132 SMs, 4 blocks per SM: (sequence, KV head) pairs x partitions <= 528
    assert [-partition_tokens(b, 8, 132) for b in (1, 2, 8, 16, 32, 64, 66, 67, 256)] == [66, 33, 8, 4, 2, 1, 1, 1, 1]
    for b in range(1, 300):
        splits = -partition_tokens(b, 8, 132)
        assert splits == 1 or b * 8 * splits <= 4 * 132 < b * 8 * (splits + 1)


def test_bucket():
    g = DecodeGraphs(lambda ids, meta: ids, torch.device("cpu"), [1, 2, 4, 8], 4, 16, 8, capture=False)
    assert [g.bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 0)] == [1, 2, 4, 4, 8, 8, None, None]


def _params(i: int) -> SamplingParams:
    """Greedy, seeded draws, penalties and logprobs, with different output lengths so that the batch shrinks
    through the buckets."""
    kinds = [
        SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True, logprobs=2),
        SamplingParams(max_tokens=9, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True),
        SamplingParams(max_tokens=5, temperature=0.0, repetition_penalty=1.3, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=1.0, top_k=20, seed=3, presence_penalty=0.5, ignore_eos=True),
    ]
    return kinds[i % len(kinds)]


def _run(model_dir, sizes: list[int] | None, max_num_seqs: int = 8):
    with LLM(str(model_dir), dtype="float32", device="cpu", enable_prefix_caching=False,
             max_num_seqs=max_num_seqs, kv_cache_memory_gib=0.05) as llm:
        runner = llm.core.runner
        runner.tapes = None  # the plain eager step (the CPU's decode tapes: tests/engine/test_cpu_tapes.py)
        calls = []
        if sizes is not None:
            runner.graph_sizes = sizes
            runner.capture_decode_graphs(capture=False)
            real = runner.graphs.run

            def counted(*a, **k):
                out = real(*a, **k)
                calls.append(None if out is None else len(a[0]))
                return out

            runner.graphs.run = counted
        outs = llm.generate(PROMPTS, [_params(i) for i in range(len(PROMPTS))])
        return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs], calls


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_bucketed_padded_decode_equals_plain(tiny_model_dir, arch):
    d = tiny_model_dir(arch)
    plain, _ = _run(d, None)
    bucketed, calls = _run(d, [1, 2, 4, 8])
    assert calls and all(c is not None for c in calls)
    assert {1, 3, 7} & set(calls)  # padded buckets were used (7 -> 8, 3 -> 4)
    for (tok_a, lp_a), (tok_b, lp_b) in zip(plain, bucketed):
        assert tok_a == tok_b
        if lp_a is not None:
            for a, b in zip(lp_a, lp_b):
                assert a.token_id == b.token_id
                assert abs(a.logprob - b.logprob) < 1e-4


def test_batches_past_the_largest_bucket_run_eagerly(tiny_model_dir):
    d = tiny_model_dir("llama")
    plain, _ = _run(d, None)
    bucketed, calls = _run(d, [1, 2, 4])
    assert None in calls  # 5..7 live sequences: no bucket, the eager step
    assert any(c is not None for c in calls)
    assert [t for t, _ in plain] == [t for t, _ in bucketed]


def test_model_info_reports_captured_graphs_only(tiny_model_dir):
    """The Load panel's status names the captured graphs (ipc.ModelInfo); the eager bucketed path is not a capture."""
    from engine.core.process import model_info

    with LLM(str(tiny_model_dir("llama")), dtype="float32", device="cpu", kv_cache_memory_gib=0.05) as llm:
        runner = llm.core.runner
        assert runner.graphs is None and model_info(llm.core, 1.0).cuda_graph_sizes == []
        runner.capture_decode_graphs(capture=False)
        assert model_info(llm.core, 1.0).cuda_graph_sizes == []
        runner.graphs.capturing, runner.graphs.capture_seconds = True, 0.5  # as after a capture on a GPU
        info = model_info(llm.core, 1.0)
        assert info.cuda_graph_sizes == runner.graphs.sizes and info.cuda_graph_seconds == 0.5
