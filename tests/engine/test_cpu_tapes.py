"""CPU decode tapes (engine/runner/cpu_tape.py): a bucket's native calls recorded by its first decode step and
replayed by the later ones must give the eager bucketed forward's logits bit for bit (same kernels, same
pointers, same order), on every tiny architecture, in float32 and bfloat16, with GGUF blocks kept; a forward that
runs any torch operation besides views and allocations is refused and stays eager; --enforce-eager turns tapes off."""

from __future__ import annotations

import pytest
import torch

from engine import ops
from engine.llm import LLM
from engine.runner import cpu_tape
from engine.sampling_params import SamplingParams
from tests.support.tiny_models import TINY_ARCHS

pytestmark = pytest.mark.skipif(not ops.native_available(), reason="engine._C is not built")

PROMPTS = ["The quick brown fox jumps over the lazy dog", "Paged attention over a block table", "x",
           "One two three four five", "Hello"]


def _decode(model_dir, tapes: bool | None, dtype: str = "float32", **opts):
    """Greedy tokens and the float32 logits of every decode step: tapes on (None: the engine's default), or the same
    bucketed forward run eagerly (False)."""
    with LLM(str(model_dir), dtype=dtype, device="cpu", enable_prefix_caching=False, kv_cache_memory_gib=0.05,
             max_num_seqs=8, **opts) as llm:
        runner = llm.core.runner
        if tapes is False:
            runner.tapes = runner._decode_tapes(runner.tapes.sizes, capture=False)
        seen = []
        real = runner.tapes.run

        def spy(*a, **k):
            out = real(*a, **k)
            seen.append(None if out is None else out.clone())
            return out

        runner.tapes.run = spy
        params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (12, 9, 4, 3, 7)]
        outs = llm.generate(PROMPTS, params)  # the batch shrinks from 5 to 1 through buckets 8, 4, 2, 1
        return [o.outputs[0].token_ids for o in outs], seen, runner.tapes


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_replay_equals_the_eager_bucketed_forward(tiny_model_dir, arch):
    d = tiny_model_dir(arch)
    eager_tokens, eager_logits, _ = _decode(d, False)
    tokens, logits, tapes = _decode(d, None)
    assert tokens == eager_tokens
    assert len(logits) == len(eager_logits) and all(a is not None for a in logits)
    for a, b in zip(logits, eager_logits):
        assert torch.equal(a, b)
    assert set(tapes.tapes) == {1, 2, 4, 8}  # each bucket recorded by its first step
    refused = {b: t.refused for b, t in tapes.tapes.items() if t.refused}
    if arch == "qwen3":  # q/k norm per head: reshaping the strided q of several rows copies, so those stay eager
        assert set(refused) == {2, 4, 8} and all("reshape" in r for r in refused.values())
    else:
        assert not refused


def test_bfloat16_replays_bit_for_bit(tiny_model_dir):
    d = tiny_model_dir("llama")
    eager_tokens, eager_logits, _ = _decode(d, False, dtype="bfloat16")
    tokens, logits, tapes = _decode(d, None, dtype="bfloat16")
    assert tokens == eager_tokens and all(torch.equal(a, b) for a, b in zip(logits, eager_logits))


def test_enforce_eager_turns_tapes_off(tiny_model_dir):
    with LLM(str(tiny_model_dir("llama")), dtype="float32", device="cpu", enforce_eager=True,
             kv_cache_memory_gib=0.05) as llm:
        assert llm.core.runner.tapes is None


def test_a_torch_operation_refuses_the_tape():
    x = torch.randn(4, 8)
    w = torch.ones(8)

    def native_only():
        return ops.rms_norm(x, w, 1e-6)

    def with_torch_op():
        return ops.rms_norm(x, w, 1e-6) * 2

    tape = cpu_tape.record(native_only)
    assert tape.refused is None and len(tape.calls) == 1 and tape.keep
    out = tape.output
    x.copy_(torch.randn(4, 8))
    assert tape.replay() is out
    torch.testing.assert_close(out, ops.reference.rms_norm(x, w, 1e-6))  # the replay read x's new values
    refused = cpu_tape.record(with_torch_op)
    assert refused.refused and "mul" in refused.refused
    torch.testing.assert_close(refused.output, ops.reference.rms_norm(x, w, 1e-6) * 2)  # it ran for real
    with pytest.raises(cpu_tape.NotRecordable):
        refused.replay()


def test_a_refused_bucket_decodes_eagerly(tiny_model_dir, monkeypatch):
    d = tiny_model_dir("llama")
    eager_tokens, eager_logits, _ = _decode(d, False)
    real_record = cpu_tape.record
    monkeypatch.setattr(cpu_tape, "record", lambda fn: real_record(lambda: fn() + 0))  # one torch op too many
    tokens, logits, tapes = _decode(d, None)
    assert tokens == eager_tokens and all(torch.equal(a, b) for a, b in zip(logits, eager_logits))
    assert tapes.tapes and all(t.refused for t in tapes.tapes.values())


def test_calls_from_another_thread_are_not_recorded():
    import threading

    x, w = torch.randn(4, 8), torch.ones(8)
    other = threading.Event()

    def forward():
        t = threading.Thread(target=lambda: (ops.silu_and_mul(torch.randn(2, 8)), other.set()))
        t.start()
        t.join()
        return ops.rms_norm(x, w, 1e-6)

    tape = cpu_tape.record(forward)
    assert other.is_set() and tape.refused is None
    assert [fn.__name__ for fn, _, _ in tape.calls] == ["rms_norm"]


def test_a_new_kv_cache_drops_the_tapes(tiny_model_dir):
    with LLM(str(tiny_model_dir("llama")), dtype="float32", device="cpu", kv_cache_memory_gib=0.05) as llm:
        llm.generate(["Hello"], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
        runner = llm.core.runner
        assert runner.tapes.tapes
        runner.allocate_kv(runner.num_blocks)
        assert not runner.tapes.tapes
        out = llm.generate(["Hello"], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
        assert len(out[0].outputs[0].token_ids) == 3 and runner.tapes.tapes
