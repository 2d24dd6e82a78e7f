"""GGUF mixture-of-experts under tensor parallelism on the CPU (rank 0 here, rank 1 a worker process): each rank
keeps its slice of every expert as the file's blocks (gate / up rows, down columns), and TP=2 gives TP=1's greedy
tokens. Files written by the test (tests/support/gguf_moe_writer.py, gguf_deepseek_writer.py: expert width 256).

- Qwen3-MoE, Qwen2-MoE (its shared expert and gate too) and DeepSeek-V2 (MLA, group-limited routing, a shared
  expert, a dense first layer), Q8_0 (blocks of 32 columns: the down projections' 128 columns a rank split on block
  boundaries): TP=1's greedy tokens, and logits within the GGUF blocks' bound of tests/engine/test_moe_gguf.py, 8%
  of the largest |logit|. Seen: Qwen3-MoE 1e-6 at every position; Qwen2-MoE 1e-6 up to position 15, then up to
  8.6e-3 (0.5%); DeepSeek-V2 1.4%. The same files dequantized (--quantization none) agree to 1e-6 (1.5e-5 for
  MLA) at every position: the native kernels round activations to int8 per block of 32, the split sums' float32
  rounding moves a value across a rounding step at one position, and attention carries that to the later ones.
- Qwen3-MoE Q4_K (blocks of 256 columns: 128 a rank is not a whole block): refused at load with a plain error that
  names the sizes that split and --quantization none; loaded so, TP=2 gives TP=1's tokens on the dequantized
  experts."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.errors import ModelLoadError
from engine.layers.moe import FusedMoE
from engine.ops import GGUFWeight
from tests.support.gguf_deepseek_writer import build_deepseek_model, write_deepseek_gguf
from tests.support.gguf_moe_writer import build_moe_model, write_moe_gguf

pytestmark = [pytest.mark.slow(seconds=60), pytest.mark.timeout(900)]

GREEDY = SamplingParams(max_tokens=8, min_tokens=8, temperature=0)
TP2 = dict(tensor_parallel_size=2, comm_strategy="host")


@pytest.fixture(scope="module")
def files(tmp_path_factory, smollm2_gguf):
    work = tmp_path_factory.mktemp("moe-gguf-tp")
    qwen3 = build_moe_model("qwen3_moe", seed=1)
    return {"qwen3-Q8_0": write_moe_gguf(qwen3, work / "qwen3.Q8_0.gguf", "Q8_0", smollm2_gguf, work)[0],
            "qwen2-Q8_0": write_moe_gguf(build_moe_model("qwen2_moe", seed=3), work / "qwen2.Q8_0.gguf", "Q8_0",
                                         smollm2_gguf, work)[0],
            "qwen3-Q4_K": write_moe_gguf(qwen3, work / "qwen3.Q4_K.gguf", "Q4_K", smollm2_gguf, work)[0],
            "v2-Q8_0": write_deepseek_gguf(build_deepseek_model("v2", seed=0), work / "v2.Q8_0.gguf", "Q8_0",
                                           smollm2_gguf, work)[0]}


def _prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (9, 23)]


def _run(path, quantization: str, tp: dict, vocab: int, check=None):
    """Greedy tokens of two prompts and the second prompt's logits; ``check(model)`` on rank 0's model first."""
    llm = LLM(str(path), dtype="float32", quantization=quantization, kv_cache_memory_gib=0.05, **tp)
    try:
        if check is not None:
            check(llm.core.runner.model)
        prompts = _prompts(vocab)
        tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, GREEDY)]
        return tokens, llm.core.score(prompts[1])
    finally:
        llm.core.shutdown()


def _experts_split_as_blocks(qtype: str, shared_width: int = 0):
    def check(model):
        moes = [m for m in model.modules() if isinstance(m, FusedMoE)]
        assert moes
        for m in moes:
            assert m.w13.numel() == 0 and m.w2.numel() == 0
            for gate_up, down in m.quantized_experts:
                assert isinstance(gate_up, GGUFWeight) and isinstance(down, GGUFWeight)
                assert {gate_up.type_name, down.type_name} == {qtype}
                assert tuple(gate_up.shape) == (256, 256) and tuple(down.shape) == (256, 128)  # half of 256 each
        for shared in (getattr(m, "shared_expert", None) for m in model.modules()):
            if shared is not None and hasattr(shared, "down_proj"):  # Qwen2-MoE's, DeepSeek's: blocks, split
                assert isinstance(shared.down_proj.matmul_weight, GGUFWeight)
                assert tuple(shared.down_proj.matmul_weight.shape) == (256, shared_width // 2)
    return check


@pytest.mark.parametrize("key, vocab, shared_width", [("qwen3-Q8_0", 49152, 0), ("qwen2-Q8_0", 49152, 512),
                                                     ("v2-Q8_0", 4096, 256)])
def test_q8_tp2_equals_tp1(files, key, vocab, shared_width):
    tokens, logits = _run(files[key], "gguf", {}, vocab)
    tokens2, logits2 = _run(files[key], "gguf", TP2, vocab, _experts_split_as_blocks("Q8_0", shared_width))
    diff = (logits2 - logits).abs().max(-1).values
    rel = float(diff.max() / logits.abs().max())
    print(f"{key} TP=2 vs TP=1: max |logit diff| / max |logit| {rel:.2g}, per position "
          f"{[f'{float(d):.1e}' for d in diff]}")
    assert tokens2 == tokens
    assert rel <= 0.08


def test_k_quant_experts_not_split_on_blocks_are_refused(files):
    path = files["qwen3-Q4_K"]
    refusal = (r"Q4_K blocks \(256 columns each\) cannot be split over tensor_parallel_size=2.*a tensor-parallel "
               r"size that splits them on block boundaries \(1\), or with --quantization none")
    with pytest.raises(ModelLoadError, match=refusal) as err:
        LLM(str(path), dtype="float32", quantization="gguf", kv_cache_memory_gib=0.05, **TP2)
    print(err.value)
    tokens, logits = _run(path, "none", {}, 49152)
    tokens2, logits2 = _run(path, "none", TP2, 49152)
    assert tokens2 == tokens
    torch.testing.assert_close(logits2, logits, atol=1e-4, rtol=1e-4)
