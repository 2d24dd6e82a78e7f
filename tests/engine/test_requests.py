"""Request behaviour end to end on the embedded model: stops, finish reasons, seeds, logprobs, errors."""

import shutil

import pytest
import torch

from engine import LLM, SamplingParams
from engine.errors import (CheckpointError, InvalidRequestError, ModelNotFoundError, PromptTooLongError,
                           UnsupportedArchitectureError)

PROMPT = "List the numbers from one to twenty, separated by commas: one, two,"


def test_max_tokens_gives_length_with_exact_count(smollm2_fp32):
    out = smollm2_fp32.generate(PROMPT, SamplingParams(max_tokens=7, temperature=0, ignore_eos=True))[0].outputs[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 7
    assert out.text == smollm2_fp32.tokenizer.decode(out.token_ids)


def test_stop_string_truncates_and_reports_itself(smollm2_fp32):
    llm = smollm2_fp32
    full = llm.generate(PROMPT, SamplingParams(max_tokens=24, temperature=0))[0].outputs[0].text
    assert " five" in full
    out = llm.generate(PROMPT, SamplingParams(max_tokens=24, temperature=0, stop=[" five"]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == " five"
    assert out.text == full[: full.index(" five")]
    inc = llm.generate(PROMPT, SamplingParams(max_tokens=24, temperature=0, stop=[" five"],
                                              include_stop_str_in_output=True))[0].outputs[0]
    assert inc.text == full[: full.index(" five") + len(" five")]


def test_streamed_text_never_leaks_a_stop_string(smollm2_fp32):
    deltas = list(smollm2_fp32.stream(PROMPT, SamplingParams(max_tokens=24, temperature=0, stop=[" five"])))
    text = "".join(d.text for d in deltas)
    assert "five" not in text and deltas[-1].finish_reason == "stop"


def test_stop_token_id(smollm2_fp32):
    llm = smollm2_fp32
    ids = llm.generate(PROMPT, SamplingParams(max_tokens=10, temperature=0))[0].outputs[0].token_ids
    out = llm.generate(PROMPT, SamplingParams(max_tokens=10, temperature=0, stop_token_ids=[ids[3]]))[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == ids[3] and out.token_ids == ids[: ids.index(ids[3]) + 1]


def test_eos_stops_and_ignore_eos_continues(smollm2_fp32):
    llm = smollm2_fp32
    msgs = [{"role": "user", "content": "Say just the word yes."}]
    out = llm.chat(msgs, SamplingParams(max_tokens=64, temperature=0))[0].outputs[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] in llm.tokenizer.eos_token_ids
    forced = llm.chat(msgs, SamplingParams(max_tokens=len(out.token_ids) + 5, temperature=0, ignore_eos=True))
    assert forced[0].outputs[0].finish_reason == "length"


def test_seed_reproducible_and_n_children(smollm2_fp32):
    llm = smollm2_fp32
    p = SamplingParams(max_tokens=16, temperature=1.0, seed=1234, n=3)
    a = llm.generate("Write a word:", p)[0]
    b = llm.generate("Write a word:", p)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert len({tuple(c.token_ids) for c in a.outputs}) > 1


def test_logprobs_match_scored_distribution(smollm2_fp32):
    llm = smollm2_fp32
    ids = llm.tokenizer.encode("The sun rises in the")
    out = llm.generate([ids], SamplingParams(max_tokens=3, temperature=0, logprobs=5))[0].outputs[0]
    ref = torch.log_softmax(llm.core.score(ids + out.token_ids), -1)
    for i, lp in enumerate(out.logprobs):
        pos = len(ids) - 1 + i
        assert lp.logprob == pytest.approx(float(ref[pos, out.token_ids[i]]), abs=1e-3)
        assert [t for t, _ in lp.top] == torch.topk(ref[pos], 5).indices.tolist()


def test_prompt_too_long_names_both_lengths(smollm2_fp32):
    n = smollm2_fp32.core.max_model_len
    with pytest.raises(PromptTooLongError) as e:
        smollm2_fp32.generate([[5] * (n + 3)], SamplingParams(max_tokens=1))
    assert str(n) in str(e.value) and str(n + 3) in str(e.value)
    with pytest.raises(PromptTooLongError):
        smollm2_fp32.generate([[5] * 10], SamplingParams(max_tokens=n))
    assert not smollm2_fp32.core.has_unfinished()


def test_bad_prompts(smollm2_fp32):
    with pytest.raises(InvalidRequestError):
        smollm2_fp32.generate([[]])
    with pytest.raises(InvalidRequestError, match="vocabulary"):
        smollm2_fp32.generate([[10**7]])


def test_model_errors(tmp_path, tiny_model_dir):
    with pytest.raises(ModelNotFoundError):
        LLM(str(tmp_path / "nope"))
    d = tmp_path / "gpt2ish"
    shutil.copytree(tiny_model_dir("llama"), d)
    cfg = (d / "config.json").read_text().replace("LlamaForCausalLM", "GPT2LMHeadModel")
    (d / "config.json").write_text(cfg)
    with pytest.raises(UnsupportedArchitectureError) as e:
        LLM(str(d))
    assert "GPT2LMHeadModel" in str(e.value) and "LlamaForCausalLM" in str(e.value)


def test_truncated_gguf_names_the_file(tmp_path, smollm2_gguf):
    bad = tmp_path / "cut.gguf"
    data = smollm2_gguf.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as e:
        LLM(str(bad))
    assert "cut.gguf" in str(e.value)
