"""Decode CUDA graphs on the GPU (engine/runner/cuda_graphs.py): replays equal the same bucketed forward run eagerly
bit for bit (tokens and logprobs; greedy, seeded draws, penalties, every bucket the batch passes through); greedy
tokens equal --enforce-eager's; no host synchronisation inside a replayed step; the one-row GEMV on the 8B shapes
and the decode kernel with the graphs' fixed partitions against float32 references."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from engine.llm import LLM
from engine.sampling_params import SamplingParams

PROMPTS = ["The quick brown fox jumps over the lazy dog", "Paged attention over a block table", "x",
           "One two three four five six seven eight nine ten eleven twelve", "Hello", "CUDA graphs replay",
           "a b c d e f g", "The rain in Spain", "Numbers: 1 2 3 4 5 6 7 8 9", "zzz"]


def _params(i: int) -> SamplingParams:
    kinds = [
        SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=3),
        SamplingParams(max_tokens=9, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True, logprobs=1),
        SamplingParams(max_tokens=5, temperature=0.0, repetition_penalty=1.3, ignore_eos=True),
        SamplingParams(max_tokens=17, temperature=1.0, top_k=20, seed=3, presence_penalty=0.5, ignore_eos=True),
    ]
    return kinds[i % len(kinds)]


def _generate(model_dir, mode: str, dtype: str = "bfloat16"):
    """mode: "graphs" (captured), "bucketed" (the same padded forward, eager), "eager" (--enforce-eager)."""
    with LLM(str(model_dir), dtype=dtype, device="cuda", enable_prefix_caching=False, max_num_seqs=16,
             kv_cache_memory_gib=0.25, enforce_eager=mode == "eager") as llm:
        runner = llm.core.runner
        if mode == "eager":
            assert runner.graphs is None
        else:
            assert runner.graphs is not None and sorted(runner.graphs.graphs) == [1, 2, 4, 8, 16]
            if mode == "bucketed":
                runner.capture_decode_graphs(capture=False)
        outs = llm.generate(PROMPTS, [_params(i) for i in range(len(PROMPTS))])
        return [(o.outputs[0].token_ids, [(lp.token_id, lp.logprob, lp.top) for lp in o.outputs[0].logprobs or []])
                for o in outs]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_replay_equals_the_eager_bucketed_forward_bit_for_bit(tiny_model_dir, arch):
    d = tiny_model_dir(arch)
    assert _generate(d, "graphs") == _generate(d, "bucketed")


@pytest.mark.parametrize("arch", ["llama", "smollm2"])
def test_greedy_equals_enforce_eager(tiny_model_dir, arch):
    d = tiny_model_dir(arch)
    graphs = _generate(d, "graphs", "float32")
    eager = _generate(d, "eager", "float32")
    for i, ((tok_g, lp_g), (tok_e, lp_e)) in enumerate(zip(graphs, eager)):
        if _params(i).greedy:
            assert tok_g == tok_e, i
            for a, b in zip(lp_g, lp_e):
                assert a[0] == b[0] and abs(a[1] - b[1]) < 1e-3


def test_no_host_sync_inside_a_replayed_step(tiny_model_dir):
    with LLM(str(tiny_model_dir("llama")), dtype="bfloat16", device="cuda", max_num_seqs=8,
             kv_cache_memory_gib=0.25) as llm:
        graphs = llm.core.runner.graphs
        real = graphs.run
        replays = []

        def checked(*args, **kwargs):
            torch.cuda.set_sync_debug_mode("error")
            try:
                out = real(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            replays.append(out is not None)
            return out

        graphs.run = checked
        llm.generate(PROMPTS[:5], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
        assert replays and all(replays)


def test_graph_info_and_memory_reserve(tiny_model_dir):
    with LLM(str(tiny_model_dir("llama")), dtype="bfloat16", device="cuda", max_num_seqs=48,
             gpu_memory_utilization=0.3) as llm:
        runner = llm.core.runner
        g = runner.graphs
        assert g.sizes == [1, 2, 4, 8, 16, 24, 32, 40, 48]
        assert g.capture_seconds > 0
        assert 0 <= g.pool_bytes <= runner.graph_reserve_bytes()


def test_gemv_on_the_8b_shapes():
    from engine.ops import skinny_gemm

    g = torch.Generator(device="cuda").manual_seed(1)
    for N, K in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)):
        w = torch.randn(N, K, generator=g, device="cuda", dtype=torch.bfloat16) * 0.02
        x = torch.randn(1, K, generator=g, device="cuda", dtype=torch.bfloat16)
        ref = x.float() @ w.float().t()
        err = (skinny_gemm.skinny_linear(x, w).float() - ref).abs()
        assert (err <= 2 ** -7 * ref.abs() + 2e-3).all(), (N, K, err.max().item())
        if N == 28672:  # gate_up with the activation in its epilogue, against the two ops
            from engine import ops

            want = ops.silu_and_mul(skinny_gemm.skinny_linear(x, w)).float()
            diff = (skinny_gemm.skinny_silu_and_mul(x, w).float() - want).abs()
            assert (diff <= 2 ** -7 * want.abs() + 1e-6).all() and (diff == 0).float().mean() >= 0.9


def test_gemv_as_a_programmatic_dependent_in_a_graph():
    """The GEMV launched as a programmatic dependent (PDL) of the norm, silu_and_mul and the fused add + norm before
    it, and they of it, in a captured chain of eight MLP-like layers each reading the last one's output: the replay
    equals the same chain run eagerly bit for bit (every kernel waits for its producer's memory; the GEMV's two
    weight tiles requested before that wait change nothing). The plain-launch and EARLY 0 / 1 variants this test
    also compared were deleted with KESTREL_PDL / KESTREL_GEMV_EARLY (issue 46)."""
    from engine import ops
    from engine.ops import skinny_gemm

    g = torch.Generator(device="cuda").manual_seed(5)
    H, inter, layers = 4096, 14336, 8
    w_up = [torch.randn(2 * inter, H, generator=g, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(2)]
    w_down = [torch.randn(H, inter, generator=g, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(2)]
    norm_w = torch.rand(H, generator=g, device="cuda", dtype=torch.bfloat16) + 0.5
    x0 = torch.randn(1, H, generator=g, device="cuda", dtype=torch.bfloat16)

    def chain(x, residual):
        for i in range(layers):
            h = ops.rms_norm(x, norm_w, 1e-5) if i % 2 else (ops.fused_add_rms_norm(x, residual, norm_w, 1e-5) or x)
            act = ops.silu_and_mul(skinny_gemm.skinny_linear(h, w_up[i % 2]))
            x = skinny_gemm.skinny_linear(act, w_down[i % 2])
        return x

    want = chain(x0.clone(), torch.zeros_like(x0))
    x, residual = x0.clone(), torch.zeros_like(x0)
    chain(x.clone(), residual.clone())  # compiles the PDL variant outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = chain(x, residual)
    for _ in range(3):
        x.copy_(x0)
        residual.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(got, want)


@pytest.mark.parametrize("part", [64, 512, -1, -66])
def test_decode_attention_with_fixed_partitions(part):
    """The decode kernel as the graphs call it: a table as wide as the longest context, partitions of a fixed
    size (most of them past the sequences' contexts) or each context cut into -part partitions on the device
    (context 0 gives zeros)."""
    from engine import ops
    from engine.ops import reference as ref

    g = torch.Generator().manual_seed(part)
    nb, bs, nkv, hd, nh, width = 300, 64, 8, 128, 32, 256
    kc = torch.randn(nb, bs, nkv, hd, generator=g).to(torch.bfloat16).cuda()
    vc = torch.randn(nb, bs, nkv, hd, generator=g).to(torch.bfloat16).cuda()
    ctx = [0, 1, 63, 500, 4000, 16384]
    bt = torch.randint(0, nb, (len(ctx), width), generator=g, dtype=torch.int32).cuda()
    q = torch.randn(len(ctx), nh, hd, generator=g).to(torch.bfloat16).cuda()
    cl = torch.tensor(ctx, dtype=torch.int32, device="cuda")
    out = ops.paged_decode_attention(q, kc, vc, bt, cl, hd ** -0.5, part_tokens=part)
    expect = ref.paged_decode_attention(q, kc, vc, bt, cl, hd ** -0.5)
    assert (out.float() - expect.float()).abs().max().item() < 2e-2
    assert out[0].abs().max().item() == 0


def _ahead_run(model_dir, mode: str, eager: bool):
    """Greedy and seeded requests, some with penalties (they all go ahead), in batches of 1-22 sequences: steps
    launched ahead replay graphs (or, with --enforce-eager, run eagerly with their input ids fed on the device);
    no host sync inside such a launch (the penalties' counts are gathered and updated on the device)."""
    with LLM(str(model_dir), dtype="bfloat16", device="cuda", enable_prefix_caching=False, max_num_seqs=24,
             kv_cache_memory_gib=0.25, async_scheduling=mode, enforce_eager=eager) as llm:
        core = llm.core
        assert (core.runner.graphs is None) == eager
        real = core._launch_ahead

        def checked(prev):
            torch.cuda.set_sync_debug_mode("error")
            try:
                return real(prev)
            finally:
                torch.cuda.set_sync_debug_mode("default")

        core._launch_ahead = checked
        prompts = (PROMPTS * 3)[:22]
        params = [SamplingParams(max_tokens=6 + i % 9, temperature=0.0 if i % 2 else 0.7, seed=i, logprobs=2,
                                 ignore_eos=True, repetition_penalty=1.2 if i % 3 == 0 else 1.0,
                                 frequency_penalty=0.5 if i % 5 == 0 else 0.0) for i in range(len(prompts))]
        outs = llm.generate(prompts, params)
        return core.num_steps_ahead, [(o.outputs[0].token_ids, [(lp.token_id, lp.logprob) for lp in
                                                                 o.outputs[0].logprobs]) for o in outs]


@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
def test_steps_launched_ahead_equal_the_synchronous_loop(tiny_model_dir, eager):
    d = tiny_model_dir("llama")
    n_ahead, got = _ahead_run(d, "on", eager)
    n_sync, want = _ahead_run(d, "off", eager)
    assert n_ahead > 10 and n_sync == 0
    assert got == want


def test_the_profiling_pass_leaves_the_rotary_table_the_whole_context(tiny_model_dir):
    # the activation profile runs one step on a scratch cache of max_num_batched_tokens; only the real cache may
    # cap the context (and the rotary table with it)
    with LLM(str(tiny_model_dir("llama")), dtype="bfloat16", device="cuda", max_num_batched_tokens=64,
             max_model_len=1024, kv_cache_memory_gib=0.25) as llm:
        runner = llm.core.runner
        assert llm.core.max_model_len == runner.max_model_len == 1024
        assert runner.model.rotary.max_position >= 1024
        prompt = list(range(5, 905))  # positions far past the scratch cache's 64 tokens
        out = llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))[0]
        assert len(out.outputs[0].token_ids) == 4
