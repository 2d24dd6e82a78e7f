"""transformers is the reference: same weights, same greedy tokens, close logits.

The embedded SmolLM2 is compared with transformers' outputs kept in tests/engine/golden/ (its greedy tokens and the
hidden states its LM head reads, from which its logits are rebuilt); transformers produced them and produces them
again with ``python -m tests.support.make_golden`` (docs/TESTING.md). The tiny random models are compared with
transformers live (they load and run in a fraction of a second)."""

import warnings

import pytest
import torch

from engine import LLM, SamplingParams
from tests.support import make_golden
from tests.support.tiny_models import TINY_ARCHS

PROMPTS = make_golden.PROMPTS


@pytest.fixture(scope="module")
def golden(smollm2_gguf):
    """transformers' outputs on the embedded model: (metadata, per prompt (ids, greedy tokens, logits [n, vocab]))."""
    meta, hidden = make_golden.load("smollm2")
    head = make_golden.gguf_lm_head(smollm2_gguf)
    assert make_golden.tensor_sha256(head) == meta["lm_head"]["float32_sha256"], \
        f"the LM head read from {smollm2_gguf.name} is not the one transformers used: rerun {make_golden.COMMAND}"
    hidden = torch.from_numpy(hidden)
    cases, at = [], 0
    for p in meta["prompts"]:
        n = len(p["ids"])
        cases.append((p["ids"], p["greedy"], hidden[at:at + n] @ head.T))  # transformers' lm_head: a bias-free linear
        at += n
    assert at == hidden.shape[0]
    return meta, cases


def test_golden_files_match_the_model(golden, smollm2_gguf):
    """The golden files are transformers' outputs for this very model file and these prompts; a different GGUF (or
    prompt list) fails here, naming the command that regenerates them."""
    meta, _ = golden
    stale = f"stale golden files (made with {meta['versions']}): rerun {make_golden.COMMAND}"
    assert meta["format"] == make_golden.FORMAT, stale
    assert meta["model"]["file"] == smollm2_gguf.name, stale
    assert meta["model"]["bytes"] == smollm2_gguf.stat().st_size, stale
    assert meta["model"]["sha256"] == make_golden.file_sha256(smollm2_gguf), stale
    assert [p["text"] for p in meta["prompts"]] == PROMPTS, stale
    assert all(len(p["greedy"]) == make_golden.GREEDY_TOKENS == 64 for p in meta["prompts"]), stale
    assert set(meta["versions"]) == {"transformers", "torch", "gguf"}
    installed = make_golden.versions()
    if installed != meta["versions"]:  # the reference may have moved: said, not failed (the comparisons below decide)
        warnings.warn(f"golden files made with {meta['versions']}, installed {installed}: if transformers' outputs "
                      f"changed, rerun {make_golden.COMMAND}", stacklevel=1)


def test_smollm2_gguf_greedy_matches_transformers(smollm2_fp32, golden):
    llm = smollm2_fp32
    ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    assert ids == [prompt_ids for prompt_ids, _, _ in golden[1]]  # transformers' tokenizer gave the same ids
    outs = llm.generate(ids, SamplingParams(max_tokens=64, min_tokens=64, temperature=0))
    for prompt_ids, out, (_, ref, _) in zip(ids, outs, golden[1]):
        assert out.outputs[0].token_ids == ref, llm.tokenizer.decode(prompt_ids)


def test_smollm2_gguf_last_logits_close(smollm2_fp32, golden):
    for p, (ids, _, ref) in zip(PROMPTS, golden[1]):
        assert smollm2_fp32.tokenizer.encode(p) == ids
        ours = smollm2_fp32.core.score(ids)
        torch.testing.assert_close(ours, ref, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_tiny_model_logits_and_greedy_match(arch, tiny_model_dir, hf_reference):
    path = tiny_model_dir(arch)
    hf = hf_reference(path)
    llm = LLM(str(path), dtype="float32", kv_cache_memory_gib=0.05)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, llm.core.model_config.vocab_size, (37,), generator=g).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    torch.testing.assert_close(llm.core.score(ids), ref, atol=1e-4, rtol=1e-4)
    out = llm.generate([ids], SamplingParams(max_tokens=24, min_tokens=24, temperature=0))
    gen = out[0].outputs[0].token_ids
    # Random tiny models have nearly flat distributions, so exact ties decide some argmaxes: check under
    # teacher forcing that every generated token is transformers' argmax up to float32 noise.
    with torch.no_grad():
        ref = hf(torch.tensor([ids + gen])).logits[0].float()
    steps = ref[len(ids) - 1:-1]
    chosen = steps.gather(1, torch.tensor(gen).unsqueeze(1)).squeeze(1)
    assert (chosen >= steps.max(dim=1).values - 1e-5).all()


def test_sharded_checkpoint_loads_identically(tiny_model_dir):
    a = LLM(str(tiny_model_dir("llama")), dtype="float32", kv_cache_memory_gib=0.05)
    b = LLM(str(tiny_model_dir("llama", sharded=True)), dtype="float32", kv_cache_memory_gib=0.05)
    ids = list(range(5, 40))
    assert torch.equal(a.core.score(ids), b.core.score(ids))


@pytest.mark.parametrize("kv", [{"kv_cache_memory_gib": 0.0001}, {"num_kv_blocks": 5}])
def test_context_capped_by_the_kv_cache_keeps_the_rotary_table_to_the_cap(tiny_model_dir, hf_reference,
                                                                          monkeypatch, kv):
    """A KV cache smaller than the model's length caps the context; the rotary table is then built for just those
    positions (never for the model's whole length: the cache's size is known before the model on the CPU), and the
    last of them still match transformers."""
    from engine.layers.rotary import RotaryEmbedding

    built = []
    table = RotaryEmbedding._table
    monkeypatch.setattr(RotaryEmbedding, "_table", lambda self, n, device: built.append(n) or table(self, n, device))
    path = tiny_model_dir("llama3")
    llm = LLM(str(path), dtype="float32", device="cpu", **kv)
    core = llm.core
    cap = core.max_model_len
    assert cap < core.model_config.max_position_embeddings
    assert core.runner.model.rotary.max_position == cap
    assert built == [cap]
    hf = hf_reference(path)
    ids = torch.randint(3, core.model_config.vocab_size, (cap - 1,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    torch.testing.assert_close(core.score(ids), ref, atol=1e-4, rtol=1e-4)  # the longest prompt: cap - 1 tokens
    out = llm.generate([ids[:cap - 8]], SamplingParams(max_tokens=8, min_tokens=8, temperature=0))
    assert len(out[0].outputs[0].token_ids) == 8
