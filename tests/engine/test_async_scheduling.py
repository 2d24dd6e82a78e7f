"""Async scheduling (decode steps launched ahead of the step that samples their input tokens) changes nothing a
request sees: the same tokens, text, stops, logprobs and seeded draws as the synchronous loop, aborts mid-flight,
blocks all returned, and the blocks filled while a step ran ahead join the prefix cache with the right tokens.
On the CPU (``async_scheduling="on"``) the same core logic runs as on a GPU, where it is the default."""

import random

import pytest

from engine import LLM, SamplingParams

WORDS = "the cat sat on a mat while seven quick foxes jumped over lazy dogs near blue rivers".split()


@pytest.fixture(scope="module")
def ahead():
    llm = LLM(dtype="float32", async_scheduling="on", quantization="none")  # as smollm2_fp32, its reference
    assert llm.core.async_scheduling
    yield llm
    llm.close()


def prompts(llm, n, seed=0):
    rng = random.Random(seed)
    return [llm.tokenizer.encode(" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 40)))) for _ in range(n)]


def run(llm, items):
    """items: (prompt ids, params) pairs submitted together -> (tokens, text, finish, stop, logprobs) each."""
    core = llm.core
    outs = {}
    for i, (ids, p) in enumerate(items):
        core.add_request(f"r{i}", None, p, prompt_token_ids=ids)
        outs[f"r{i}"] = [[], "", None, None, []]
    while core.has_unfinished():
        for d in core.step():
            o = outs[d.request_id]
            o[0] += d.token_ids
            o[1] += d.text
            o[4] += [(lp.token_id, round(lp.logprob, 5)) for lp in d.logprobs or []]
            if d.finished:
                o[2], o[3] = d.finish_reason, d.stop_reason
    assert_idle(llm)
    return [tuple(map(lambda x: tuple(x) if isinstance(x, list) else x, outs[f"r{i}"])) for i in range(len(items))]


def assert_idle(llm):
    core = llm.core
    assert not core.has_unfinished() and core._in_flight is None
    assert core.blocks.num_free_blocks == core.blocks.num_blocks
    assert all(b.ref_count == 0 for b in core.blocks.blocks)


def test_sync_engine_is_sync(smollm2_fp32):
    assert not smollm2_fp32.core.async_scheduling  # auto: only on a GPU


def test_greedy_stops_and_lengths_equal_the_synchronous_loop(ahead, smollm2_fp32):
    ps = prompts(ahead, 12)
    first = smollm2_fp32.generate([ps[0]], SamplingParams(max_tokens=12, temperature=0))[0].outputs[0]
    stop_text = ahead.tokenizer.decode(first.token_ids[5:7]).strip() or "the"
    kinds = [SamplingParams(max_tokens=3 + i, temperature=0, ignore_eos=i % 2 == 0) for i in range(6)]
    kinds += [SamplingParams(max_tokens=30, temperature=0, stop=[stop_text]),
              SamplingParams(max_tokens=30, temperature=0, stop=[stop_text], include_stop_str_in_output=True),
              SamplingParams(max_tokens=30, temperature=0, stop_token_ids=[first.token_ids[4]]),
              SamplingParams(max_tokens=20, min_tokens=15, temperature=0, stop_token_ids=[first.token_ids[2]]),
              SamplingParams(max_tokens=1, temperature=0),
              SamplingParams(max_tokens=25, temperature=0)]
    items = list(zip(ps, kinds))
    before = ahead.core.num_steps_ahead
    got = run(ahead, items)
    assert ahead.core.num_steps_ahead > before + 10
    assert got == run(smollm2_fp32, items)
    assert any(g[2] == "stop" for g in got) and any(g[2] == "length" for g in got)


def test_seeded_draws_and_logprobs_equal_the_synchronous_loop(ahead, smollm2_fp32):
    ps = prompts(ahead, 6, seed=3)
    items = [(p, SamplingParams(max_tokens=14, temperature=0.9, top_p=0.9, seed=100 + i, logprobs=2))
             for i, p in enumerate(ps)]
    before = ahead.core.num_steps_ahead
    got = run(ahead, items)
    assert ahead.core.num_steps_ahead > before
    assert got == run(smollm2_fp32, items)
    assert all(len(g[4]) == len(g[0]) == 14 for g in got)


def test_penalties_go_ahead_with_their_counts_on_the_device(ahead, smollm2_fp32):
    ps = prompts(ahead, 4, seed=5)
    items = [(ps[0], SamplingParams(max_tokens=16, temperature=0, repetition_penalty=1.3)),
             (ps[1], SamplingParams(max_tokens=16, temperature=0, frequency_penalty=0.7, presence_penalty=0.4)),
             (ps[2], SamplingParams(max_tokens=16, temperature=0.8, seed=9, repetition_penalty=0.8,
                                    presence_penalty=-0.5)),
             (ps[3], SamplingParams(max_tokens=16, temperature=0))]
    before = ahead.core.num_steps_ahead
    got = run(ahead, items)
    assert ahead.core.num_steps_ahead > before + 5
    assert got == run(smollm2_fp32, items)
    assert not ahead.core.runner.penalties.row_of  # every row freed with its request


def test_a_grammar_keeps_the_loop_synchronous(ahead, smollm2_fp32):
    pytest.importorskip("xgrammar")
    from engine.sampling_params import StructuredOutput

    ps = prompts(ahead, 2, seed=6)
    choice = StructuredOutput("choice", '["yes", "no", "maybe not"]')
    alone = [(ps[0], SamplingParams(max_tokens=10, temperature=0, structured=choice))]
    before = ahead.core.num_steps_ahead
    got = run(ahead, alone)
    assert ahead.core.num_steps_ahead == before  # its matcher takes each token on the host
    assert got == run(smollm2_fp32, alone) and got[0][1] in ("yes", "no", "maybe not")
    items = alone + [(ps[1], SamplingParams(max_tokens=10, temperature=0))]  # the other goes ahead once it ends
    assert run(ahead, items) == run(smollm2_fp32, items)


def test_abort_while_a_step_is_in_flight(ahead, smollm2_fp32):
    core = ahead.core
    ps = prompts(ahead, 4, seed=7)
    greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    for i, p in enumerate(ps):
        core.add_request(f"a{i}", None, greedy, prompt_token_ids=p)
    toks = {f"a{i}": [] for i in range(4)}
    while core._in_flight is None or len(toks["a0"]) < 4:
        for d in core.step():
            toks[d.request_id] += d.token_ids
    aborted = core.abort(["a1", "a2"])
    assert [d.finish_reason for d in aborted] == ["abort", "abort"]
    assert core._in_flight is not None  # a0 and a3 are still in it
    while core.has_unfinished():
        for d in core.step():
            assert d.request_id in ("a0", "a3")
            toks[d.request_id] += d.token_ids
    assert_idle(ahead)
    solo = smollm2_fp32.generate([ps[0], ps[3]], greedy)
    assert [toks["a0"], toks["a3"]] == [o.outputs[0].token_ids for o in solo]
    # aborting everything in flight forgets the step at once
    core.add_request("b", None, greedy, prompt_token_ids=ps[0])
    while core._in_flight is None:
        core.step()
    core.abort("b")
    assert_idle(ahead)


def test_blocks_filled_ahead_join_the_prefix_cache(ahead, smollm2_fp32):
    core = ahead.core
    bs = core.blocks.block_size
    prompt = prompts(ahead, 1, seed=11)[0][:bs - 3]
    params = SamplingParams(max_tokens=3 * bs, temperature=0, ignore_eos=True)
    core.blocks.reset_prefix_cache()
    before = core.num_steps_ahead
    out = ahead.generate([prompt], params)[0].outputs[0].token_ids
    assert core.num_steps_ahead - before >= 2 * bs
    seq = prompt + out
    # every block the run registered holds the tokens the request had there
    for blk in core.blocks.blocks:
        if blk.tokens is not None:
            i = next(i for i in range(0, len(seq) - bs + 1, bs) if tuple(seq[i:i + bs]) == blk.tokens)
            assert i % bs == 0
    follow = seq[:3 * bs + 1]
    again = ahead.generate([follow], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    assert again.num_cached_tokens == 3 * bs  # the blocks filled by steps launched ahead
    assert again.outputs[0].token_ids == smollm2_fp32.generate(
        [follow], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0].outputs[0].token_ids
    assert_idle(ahead)


def test_every_request_stopping_leaves_nothing_in_flight(ahead):
    core = ahead.core
    p = prompts(ahead, 1, seed=13)[0]
    out = ahead.generate([p], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0].outputs[0]
    core.add_request("s", None, SamplingParams(max_tokens=40, temperature=0, stop_token_ids=[out.token_ids[6]]),
                     prompt_token_ids=p)
    last = None
    while last is None or not last.finished:
        ds = core.step()
        last = ds[-1] if ds else last
    assert last.finish_reason == "stop"
    assert not core.has_unfinished()  # the step launched ahead of the stop was dropped, not waited for
    assert_idle(ahead)
